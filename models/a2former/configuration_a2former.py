"""Configuration of the A²-Former family (adaptive attention with learned, interpolated key positions)."""

# No `from __future__ import annotations`: huggingface_hub's @strict checks field types only when the annotations
# are real types, not strings.

from huggingface_hub.dataclasses import strict

from ..core.configuration import SparseZooConfig

ATTENTION_WEIGHT_MODES = ("dot_product", "linear")
OFFSET_BIAS_INITS = ("spread", "zeros")
POSITION_BOUNDS = ("clamp", "reflect")


@strict
class A2FormerConfig(SparseZooConfig):
    r"""
    Configuration of A²-Former (Zhang et al., ACL Findings 2023): every query attends to `num_sample_points` keys
    at learned fractional positions `p = i + offset(x_i)`, read by linear interpolation of the projected keys and
    values. The method runs in the encoder's self-attention; the decoder of `A2FormerForConditionalGeneration`
    keeps dense causal self-attention and dense cross-attention (the paper defines neither; a causal A² variant
    exists as `A2FormerAttention(config, is_causal=True)`). Fields of [`~attnzoo.core.SparseZooConfig`] are documented
    there; the method adds:

    Args:
        num_sample_points (`int`, *optional*, defaults to 10):
            Number K of points every query (per head) samples; the paper uses 10 on every task.
        attention_weights (`str`, *optional*, defaults to `"dot_product"`):
            How the K points are weighted: `"dot_product"` = softmax over the points of `<q, k~> / sqrt(d)` with the
            interpolated keys `k~`; `"linear"` = softmax of a learned linear map of the query token (Deformable
            DETR), zero-initialised so the points start uniformly weighted; it takes no `q . k`, so it refuses
            `position_embedding_type="rotary"`.
        offset_bias_init (`str`, *optional*, defaults to `"spread"`):
            Initial offsets. `"spread"`: the K points of head `h` start at `(h + 1) * {-K/2, ..., -1, 1, ..., K/2}`
            tokens around the query (distinct points; heads with growing reach). `"zeros"`: all points start on the
            query itself (they then only separate through the data-dependent part and may stay collapsed).
        offset_scale (`float`, *optional*, defaults to 1.0):
            Multiplier of the offset projection's output (tokens per unit). Larger values let the points move
            faster under optimisers with a fixed step size (the paper used Adamax with lr 0.05); the bias is
            initialised divided by it, so the initial positions do not depend on it.
        position_bound (`str`, *optional*, defaults to `"clamp"`):
            How positions are kept inside the sequence's real tokens (the paper's "rescale to [0, L]"): `"clamp"`
            (points beyond an end stop there and get no position gradient) or `"reflect"` (mirrored back at the
            ends, gradient preserved).
        length_projection (`int`, *optional*):
            The paper's optional sequence-length reduction for classification without pre-training: a learned
            linear map along the length axis from `max_position_embeddings` positions to `length_projection`,
            applied to the embeddings by `A2FormerForSequenceClassification` (inputs are padded to
            `max_position_embeddings`). Other heads ignore it. `None` disables it.

    Example:

    ```python
    >>> import attnzoo
    >>> from transformers import AutoModelForSequenceClassification
    >>> config = attnzoo.A2FormerConfig(vocab_size=8000, hidden_size=256, num_sample_points=10)
    >>> model = AutoModelForSequenceClassification.from_config(config)
    ```
    """

    model_type = "a2former"

    num_sample_points: int = 10
    attention_weights: str = "dot_product"
    offset_bias_init: str = "spread"
    offset_scale: float | int = 1.0
    position_bound: str = "clamp"
    length_projection: int | None = None

    def check_zoo_fields(self) -> None:
        super().check_zoo_fields()
        if self.num_sample_points < 1:
            raise ValueError(f"`num_sample_points` must be a positive integer, got {self.num_sample_points}.")
        if self.attention_weights not in ATTENTION_WEIGHT_MODES:
            raise ValueError(
                f"`attention_weights` must be one of {ATTENTION_WEIGHT_MODES}, got {self.attention_weights!r}."
            )
        if self.attention_weights == "linear" and self.position_embedding_type == "rotary":
            # The linear weights never take q . k, so rotating q and k would leave the model with no position signal.
            raise ValueError(
                "`position_embedding_type='rotary'` acts through q . k, which `attention_weights='linear'` never "
                "computes: use 'absolute' or 'sinusoidal' positions with the linear weights."
            )
        if self.offset_bias_init not in OFFSET_BIAS_INITS:
            raise ValueError(f"`offset_bias_init` must be one of {OFFSET_BIAS_INITS}, got {self.offset_bias_init!r}.")
        if not self.offset_scale > 0:
            raise ValueError(f"`offset_scale` must be positive, got {self.offset_scale}.")
        if self.position_bound not in POSITION_BOUNDS:
            raise ValueError(f"`position_bound` must be one of {POSITION_BOUNDS}, got {self.position_bound!r}.")
        if self.length_projection is not None and not 1 <= self.length_projection <= self.max_position_embeddings:
            raise ValueError(
                f"`length_projection` must be None or an integer in [1, max_position_embeddings="
                f"{self.max_position_embeddings}], got {self.length_projection}."
            )

"""Configuration of Smart Bird: sparse attention over keys sampled from a sketched attention matrix."""

# No `from __future__ import annotations`: huggingface_hub's @strict checks field types only when the annotations
# are real types, not strings.

from huggingface_hub.dataclasses import strict

from ..core.configuration import SparseZooConfig

#: Sampling score functions of the paper's Figure 4 (first = the paper's method).
SAMPLING_FUNCTIONS = ("squared_inverse_log", "inverse_log", "raw", "topk", "random")
EVAL_SAMPLING_MODES = ("sample", "topk")
#: How the keys are drawn (`attnzoo.smart_bird.sampling.sample_keys`): the same law, different random streams.
SAMPLING_METHODS = ("auto", "counter", "thinning", "literal")


@strict
class SmartBirdConfig(SparseZooConfig):
    r"""
    Configuration of Smart Bird (Wu et al., "Smart Bird: Learnable Sparse Attention for Efficient and Effective
    Transformer"). A single-head, low-dimensional *sketch* Transformer computes an attention matrix `alpha` per
    layer; every head of the main encoder then samples its own `num_samples` keys per query with scores
    `s_ij ~ U(0, p_ij)`, `p_ij = 1 / log(alpha_ij)^2`, and attends only to them.

    Where the method runs: encoder self-attention only. The decoder self-attention and the cross-attention of
    [`SmartBirdForConditionalGeneration`] are dense (SDPA), as the paper defines no causal or cross sketch.

    Besides the fields below, every field of [`~attnzoo.core.SparseZooConfig`] applies. The sketch network's loss is
    returned as the model's `aux_loss` (already multiplied by `sketch_loss_weight`); the heads add
    `aux_loss_coef * aux_loss` to the task loss, so the effective weight is `aux_loss_coef * sketch_loss_weight`.

    Args:
        sketch_hidden_size (`int`, *optional*, defaults to 4):
            Width `d` of the single-head sketch Transformer (the paper's choice; 8 was marginally better).
        sketch_num_layers (`int`, *optional*):
            Layers of the sketch Transformer; main layer `l` samples from sketch layer `min(l, sketch_num_layers - 1)`.
            Defaults to `num_hidden_layers` (one sketch layer per main layer).
        sketch_intermediate_size (`int`, *optional*, defaults to 16):
            Feed-forward width of the sketch Transformer (not stated in the paper).
        num_samples (`int`, *optional*, defaults to 20):
            Number `K` of keys each query attends to per head (the paper's choice; `min(K, length)` is used).
        sampling_function (`str`, *optional*, defaults to `"squared_inverse_log"`):
            How sketch weights become sampling scores (the paper's Figure 4): `"squared_inverse_log"`
            (`p = 1 / log(alpha)^2`, the method), `"inverse_log"` (`p = -1 / log(alpha)`), `"raw"` (`p = alpha`),
            `"topk"` (the `K` largest sketch weights, no sampling, same keys for every head) or `"random"`
            (uniform over the real keys).
        sketch_loss_weight (`float`, *optional*, defaults to 1.0):
            Weight of the sketch network's own task loss in the returned `aux_loss`.
        sketch_freeze (`bool`, *optional*, defaults to `False`):
            Freeze the sketch network (no gradient, no sketch loss), e.g. for a second stage after pre-training it.
        eval_sampling (`str`, *optional*, defaults to `"sample"`):
            Key selection in eval mode: `"sample"` (the same stochastic sampling, from a generator seeded with
            `sampling_seed` plus the layer index, hence deterministic; each example draws on its own, over its length
            up to its last real token, so batching and padding never change its keys) or `"topk"` (the `K` largest
            sketch weights).
        sampling_seed (`int`, *optional*, defaults to 0):
            Seed of the eval-mode sampling generator. Training samples from the global torch RNG, so gradient
            checkpointing replays the same keys.
        sampling_method (`str`, *optional*, defaults to `"auto"`):
            How the keys are drawn; every method draws from the paper's law, but each from its own random stream:
            `"counter"` (noise per (example, head, query, key) from a counter-based generator, drawn inside a Triton
            kernel only for the keys that can still be selected; its torch reference with
            `attention_backend="reference"` or without Triton), `"thinning"` (exact thinning on the torch generator,
            the fastest on a CPU), `"literal"` (torch noise for every pair) or `"auto"`: `"counter"` where the
            attention runs Triton kernels (CUDA, or `attention_backend="triton"`) or off the CPU, `"thinning"` on the
            CPU. Under `"counter"`, evaluation draws one batch at once from the seed `sampling_seed` plus the layer
            index, every example with the counters of the first (so, again, its keys do not depend on its batch).

    Example:

    ```python
    >>> import attnzoo
    >>> from transformers import AutoModelForSequenceClassification
    >>> config = attnzoo.SmartBirdConfig(vocab_size=8000, hidden_size=256, num_attention_heads=4, num_labels=2)
    >>> model = AutoModelForSequenceClassification.from_config(config)
    ```
    """

    model_type = "smart_bird"

    sketch_hidden_size: int = 4
    sketch_num_layers: int | None = None
    sketch_intermediate_size: int = 16
    num_samples: int = 20
    sampling_function: str = "squared_inverse_log"
    sketch_loss_weight: float | int = 1.0
    sketch_freeze: bool = False
    eval_sampling: str = "sample"
    sampling_seed: int = 0
    sampling_method: str = "auto"

    def check_zoo_fields(self) -> None:
        super().check_zoo_fields()
        for name in ("sketch_hidden_size", "sketch_intermediate_size", "num_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)}.")
        if self.position_embedding_type in ("sinusoidal", "rotary") and self.sketch_hidden_size % 2:
            raise ValueError(
                f"`position_embedding_type={self.position_embedding_type!r}` gives the sketch the same positions "
                f"and needs an even `sketch_hidden_size`, got {self.sketch_hidden_size}."
            )
        if self.sketch_num_layers is not None and self.sketch_num_layers < 1:
            raise ValueError(f"`sketch_num_layers` must be a positive integer or None, got {self.sketch_num_layers}.")
        if self.sampling_function not in SAMPLING_FUNCTIONS:
            raise ValueError(
                f"`sampling_function` must be one of {SAMPLING_FUNCTIONS}, got {self.sampling_function!r}."
            )
        if self.eval_sampling not in EVAL_SAMPLING_MODES:
            raise ValueError(f"`eval_sampling` must be one of {EVAL_SAMPLING_MODES}, got {self.eval_sampling!r}.")
        if self.sketch_loss_weight < 0:
            raise ValueError(f"`sketch_loss_weight` must be >= 0, got {self.sketch_loss_weight}.")
        if self.sampling_method not in SAMPLING_METHODS:
            raise ValueError(f"`sampling_method` must be one of {SAMPLING_METHODS}, got {self.sampling_method!r}.")
        if self.sampling_seed < 0:
            raise ValueError(f"`sampling_seed` must be >= 0, got {self.sampling_seed}.")

    @property
    def sketch_layers(self) -> int:
        """Number of sketch layers actually built."""
        return self.sketch_num_layers if self.sketch_num_layers is not None else self.num_hidden_layers

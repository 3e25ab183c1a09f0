"""Configuration of FSAT (Fourier Sparse Attention for Transformer, Zhuang, Zhang and Tu, ACL 2022)."""

# No `from __future__ import annotations`: huggingface_hub's @strict checks field types only when the annotations
# are real types, not strings.

from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict
from transformers.activations import ACT2FN

from ..core.configuration import SparseZooConfig

FEATURE_MAPS = ("mlp", "dsconv")
INDEX_SCALES = ("max_length", "sequence_length")
INDEX_PRIORS = ("none", "key_position")
GLOBAL_KEY_SOFTMAXES = ("shared", "own")


@strict
class FSATConfig(SparseZooConfig):
    r"""
    Configuration of FSAT. Every encoder self-attention layer maps the hidden states with two learned feature maps,
    pools their pairwise products along antidiagonals with an FFT (the "hidden-state cross" `C`), takes queries from
    the hidden states and keys/values from `C`, predicts for every key `num_dominant_indices` query positions and
    attends only along those (key -> predicted query) edges, weighted by a Gaussian confidence. Training adds
    `num_random_indices` uniformly drawn queries per key (exploration); eval uses the predicted edges only.

    FSAT is encoder-only: it cannot be causal (the pooled cross mixes past and future tokens), so the decoder of
    [`FSATForConditionalGeneration`] uses dense self- and cross-attention. All fields of
    [`~attnzoo.core.SparseZooConfig`] apply; FSAT adds the fields below and halves the default FFN width.

    Args:
        intermediate_size (`int`, *optional*, defaults to 512):
            FFN width. The paper uses 2x `hidden_size` (instead of 4x) to offset the parameters of the two feature
            maps; the default is 2x the default `hidden_size` of 256.
        num_dominant_indices (`int`, *optional*, defaults to 4):
            `M`, predicted dominant query positions per key and head (paper ablation: 2, 4, 8).
        num_random_indices (`int`, *optional*, defaults to 4):
            Uniformly drawn query positions per key and head added in training (exploration). Random slot `r` is
            scored against the prediction of slot `r mod num_dominant_indices`; a query's random edges have a softmax
            of their own, so that they take no probability from the graph eval keeps. 0 disables exploration.
        confidence_variance (`float`, *optional*):
            `sigma^2` of the Gaussian confidence `rho(i | I_bar, sigma^2)`; defaults to the index scale `L_max` as in
            the paper.
        confidence_normalized (`bool`, *optional*, defaults to `False`):
            `True` uses the normalised Gaussian density (the paper; its peak `1/sqrt(2*pi*sigma^2)` is 0.009 at
            `sigma^2 = 2048`, so the predicted edges barely reach the output beside a global token's weight of 1).
            `False` (ours, the default) drops the normalising constant: peak 1, the attention output on the scale of
            the values (IMDB at 2048 tokens: 81.6% against 76.8% normalised; the long-inputs study).
        feature_map (`str`, *optional*, defaults to `"mlp"`):
            Form of the feature maps `f1`, `f2`: `"mlp"` (Linear -> activation -> Linear, D -> D -> D) or `"dsconv"`
            (depth-wise Conv1d over the sequence -> activation -> point-wise Linear; the paper's Text-task variant).
        feature_map_kernel_size (`int`, *optional*, defaults to 5):
            Kernel size of the depth-wise convolution of `feature_map="dsconv"` (odd, so it is centred).
        feature_map_act (`str`, *optional*, defaults to `"gelu"`):
            Activation inside the feature maps (any key of `transformers.activations.ACT2FN`).
        gradient_truncation (`bool`, *optional*, defaults to `True`):
            Clip the gradient reaching the confidences to `(-inf, 0]` in training (the paper's truncation).
        use_sparse (`bool`, *optional*, defaults to `True`):
            `False` gives the paper's "FAT" ablation: dense attention of the hidden-state queries over the keys and
            values of the pooled cross (no index prediction, O(N^2)).
        index_scale (`str`, *optional*, defaults to `"sequence_length"`):
            Scale `L` of the predicted positions `I_bar = sigmoid(C W_I + b_I) * L`: `"sequence_length"` uses each
            sample's real length (ours, the default: predictions stay inside every sequence), `"max_length"` uses
            `index_max_length` (the paper's). With `"max_length"` and the paper's `index_prior="none"`, a sequence
            much shorter than `L_max` (most documents of a long-input model) gets its predictions past its last token
            at initialisation (the sigmoid starts at 0.5, so near `L_max / 2`): those edges are dropped and its
            queries attend to nothing.
        index_max_length (`int`, *optional*):
            `L_max`, the task's longest sequence; defaults to `max_position_embeddings`.
        index_prior (`str`, *optional*, defaults to `"key_position"`):
            Fixed offset of the predictor's logits. `"key_position"` (ours, the default):
            `I_bar_j = sigmoid(C_j W_I + b_I + logit((j + 0.5) / L)) * L`, so that while the weights are small key `j`
            predicts queries around itself; the predictor learns offsets from there, over the same range `(0, L)`.
            `"none"` is the paper's `sigmoid(C W_I + b_I) * L`, whose untrained predictions all sit near `L / 2`: in a
            2048-token input only about a quarter of the queries get a predicted edge, and the first token none (see
            the long-inputs study). The predictor reads the pooled cross `C_j`, unrotated: with
            `position_embedding_type="rotary"` nothing is added to the embeddings, so under `"none"` the first
            layer's predictor has no position to start from, while `"key_position"` still gives each key its own.
        shared_index_predictor (`bool`, *optional*, defaults to `False`):
            Predict one index set per key shared by all heads (`W_I` of shape `D x M`, the paper's printed shape)
            instead of one per head (`D x H*M`).
        global_key_softmax (`str`, *optional*, defaults to `"own"`):
            How a query reads the global keys (`num_global_tokens`). `"own"` (ours, the default): in a softmax of
            their own, added to the output of the softmax over the query's predicted edges (as the exploration edges
            are), so that every real query reads the global tokens at full weight however many edges were predicted
            for it. `"shared"`: in one softmax with the predicted edges, as the other families' global tokens. Then
            the global share of a query falls as its predicted edges grow: at initialisation on 2048-token ListOps
            inputs it is 0.24 with `index_prior="key_position"` and 0.89 with the paper's predictor, which leaves
            most queries with the global key alone. With `"shared"` and the key-position prior FSAT left ListOps's
            label prior late (30.6% against dense attention's 33.8% at LRA's lengths; `"own"`: 33.8%; see the model
            card, "Long inputs").

    Example:

    ```python
    >>> import attnzoo
    >>> from transformers import AutoModelForSequenceClassification
    >>> config = attnzoo.FSATConfig(vocab_size=8000, hidden_size=128, intermediate_size=256, num_labels=2)
    >>> model = AutoModelForSequenceClassification.from_config(config)
    ```
    """

    model_type = "fsat"

    intermediate_size: int = 512
    num_dominant_indices: int = 4
    num_random_indices: int = 4
    confidence_variance: float | int | None = None
    confidence_normalized: bool = False
    feature_map: str = "mlp"
    feature_map_kernel_size: int = 5
    feature_map_act: str = "gelu"
    gradient_truncation: bool = True
    use_sparse: bool = True
    index_scale: str = "sequence_length"
    index_max_length: int | None = None
    index_prior: str = "key_position"
    shared_index_predictor: bool = False
    global_key_softmax: str = "own"

    # Checkpoints saved before `index_prior` existed were trained with the paper's predictor, and those saved before
    # `global_key_softmax` with the global keys in the predicted edges' softmax.
    values_before_the_field: ClassVar[dict[str, Any]] = {
        **SparseZooConfig.values_before_the_field,
        "index_prior": "none",
        "global_key_softmax": "shared",
    }

    def check_zoo_fields(self) -> None:
        super().check_zoo_fields()
        if self.is_decoder:
            raise ValueError(
                "`is_decoder=True` is not supported by FSAT: its attention cannot be causal (the pooled cross mixes "
                "future tokens). Use `FSATForConditionalGeneration`, whose decoder uses dense attention."
            )
        if self.num_dominant_indices < 1:
            raise ValueError(f"`num_dominant_indices` must be >= 1, got {self.num_dominant_indices}.")
        if self.num_random_indices < 0:
            raise ValueError(f"`num_random_indices` must be >= 0, got {self.num_random_indices}.")
        if self.confidence_variance is not None and not self.confidence_variance > 0:
            raise ValueError(f"`confidence_variance` must be positive or None, got {self.confidence_variance}.")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"`feature_map` must be one of {FEATURE_MAPS}, got {self.feature_map!r}.")
        if self.feature_map_kernel_size < 1 or self.feature_map_kernel_size % 2 == 0:
            raise ValueError(
                f"`feature_map_kernel_size` must be a positive odd integer, got {self.feature_map_kernel_size}."
            )
        if self.feature_map_act not in ACT2FN:
            raise ValueError(f"`feature_map_act` {self.feature_map_act!r} is not a known activation (see ACT2FN).")
        if self.index_scale not in INDEX_SCALES:
            raise ValueError(f"`index_scale` must be one of {INDEX_SCALES}, got {self.index_scale!r}.")
        if self.global_key_softmax not in GLOBAL_KEY_SOFTMAXES:
            raise ValueError(
                f"`global_key_softmax` must be one of {GLOBAL_KEY_SOFTMAXES}, got {self.global_key_softmax!r}."
            )
        if self.index_prior not in INDEX_PRIORS:
            raise ValueError(f"`index_prior` must be one of {INDEX_PRIORS}, got {self.index_prior!r}.")
        if self.index_max_length is not None and self.index_max_length < 1:
            raise ValueError(f"`index_max_length` must be a positive integer or None, got {self.index_max_length}.")

    @property
    def fsat_index_length(self) -> int:
        """`L_max`: the index scale of `index_scale="max_length"` and the default confidence variance."""
        return self.index_max_length if self.index_max_length is not None else self.max_position_embeddings

    @property
    def fsat_confidence_variance(self) -> float:
        """`sigma^2` of the Gaussian confidence."""
        return float(self.confidence_variance if self.confidence_variance is not None else self.fsat_index_length)

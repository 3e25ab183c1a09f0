"""Configuration of the Sparse Transformer family (strided and fixed factorised attention, Child et al. 2019)."""

# No `from __future__ import annotations`: huggingface_hub's @strict checks field types only when the annotations
# are real types, not strings.

from typing import ClassVar

from huggingface_hub.dataclasses import strict

from ..core.configuration import SparseZooConfig

SPARSE_PATTERNS = ("strided", "fixed")
HEAD_ASSIGNMENTS = ("split", "merged", "interleaved")
SPARSE_PRESETS = (None, "lra")

# The Long Range Arena baseline: causal, every head attends to the union of the two fixed sub-patterns.
LRA_PRESET = {
    "sparse_pattern": "fixed",
    "sparse_stride": 128,
    "sparse_summary_size": 32,
    "sparse_causal": True,
    "sparse_head_assignment": "merged",
}


@strict
class SparseTransformerConfig(SparseZooConfig):
    r"""
    Configuration of the Sparse Transformer family: the zoo's Transformer whose self-attention (encoder and causal
    decoder) only looks at the keys of a fixed factorised pattern with stride `l` (Child et al., 2019). Cross-attention
    is dense. Inherits every field of [`~attnzoo.core.SparseZooConfig`].

    Sub-patterns of query `i` (keys `j`; `l` = `sparse_stride`, `c` = `sparse_summary_size`):

    - `"strided"`: A1 = local window `|i - j| <= l` and A2 = same residue `(i - j) mod l == 0`.
    - `"fixed"`: A1 = own block `floor(j / l) == floor(i / l)` and A2 = summary columns `j mod l >= l - c`.

    In causal mode both sub-patterns are intersected with `j <= i` (the paper's definitions). The decoder's
    self-attention is always causal; `sparse_causal` only concerns the encoder.

    Args:
        sparse_pattern (`str`, *optional*, defaults to `"strided"`):
            `"strided"` or `"fixed"` (see above). The paper prefers `"fixed"` for text; `"strided"` with split heads is
            the encoder baseline of Smart Bird and the cheapest pattern to compute.
        sparse_stride (`int`, *optional*, defaults to 64):
            Stride / block length `l`. The paper uses `l` close to `sqrt(N)`; it is a fixed number here so that the
            pattern of a sequence never depends on how much padding its batch has (64 suits `N` up to 4096).
        sparse_summary_size (`int`, *optional*, defaults to 8):
            Number `c` of summary positions at the end of every block (fixed pattern only, where `1 <= c <= l` is
            checked; unused by the strided pattern).
        sparse_causal (`bool`, *optional*, defaults to `False`):
            Causal encoder pattern (the paper's and LRA's setting) instead of the symmetric bidirectional extension.
        sparse_head_assignment (`str`, *optional*, defaults to `"split"`):
            How the two sub-patterns are used: `"split"` (the first `ceil(H / 2)` heads use A1, the others A2),
            `"merged"` (every head attends to A1 and A2 jointly) or `"interleaved"` (even layers A1, odd layers A2).
        sparse_preset (`str`, *optional*):
            `"lra"` sets the Long Range Arena baseline (fixed, `l = 128`, `c = 32`, causal, merged), whose summary
            sub-pattern also keeps the first column of every block, and whose first token (CLS) attends to and is
            attended by every position in the encoder. Overrides the five fields above.

    Example:

    ```python
    >>> import attnzoo
    >>> from transformers import AutoModelForSequenceClassification
    >>> config = attnzoo.SparseTransformerConfig(sparse_pattern="fixed", sparse_stride=64, sparse_summary_size=8)
    >>> model = AutoModelForSequenceClassification.from_config(config)
    ```
    """

    model_type = "sparse_transformer"
    method_sites: ClassVar[tuple[str, ...]] = ("encoder", "decoder")

    sparse_pattern: str = "strided"
    sparse_stride: int = 64
    sparse_summary_size: int = 8
    sparse_causal: bool = False
    sparse_head_assignment: str = "split"
    sparse_preset: str | None = None

    def __post_init__(self, **kwargs):
        if self.sparse_preset == "lra":
            for name, value in LRA_PRESET.items():
                setattr(self, name, value)
        super().__post_init__(**kwargs)

    def check_zoo_fields(self) -> None:
        super().check_zoo_fields()
        if self.sparse_preset not in SPARSE_PRESETS:
            raise ValueError(f"`sparse_preset` must be one of {SPARSE_PRESETS}, got {self.sparse_preset!r}.")
        if self.sparse_pattern not in SPARSE_PATTERNS:
            raise ValueError(f"`sparse_pattern` must be one of {SPARSE_PATTERNS}, got {self.sparse_pattern!r}.")
        if self.sparse_head_assignment not in HEAD_ASSIGNMENTS:
            raise ValueError(
                f"`sparse_head_assignment` must be one of {HEAD_ASSIGNMENTS}, got {self.sparse_head_assignment!r}."
            )
        if self.sparse_stride < 1:
            raise ValueError(f"`sparse_stride` must be a positive integer, got {self.sparse_stride}.")
        # c only enters the fixed pattern; a strided config keeps working when its stride goes below the default c.
        if self.sparse_pattern == "fixed" and not 1 <= self.sparse_summary_size <= self.sparse_stride:
            raise ValueError(
                f"`sparse_summary_size` must be in [1, sparse_stride={self.sparse_stride}], "
                f"got {self.sparse_summary_size}."
            )
        if self.sparse_head_assignment == "split" and self.num_attention_heads < 2:
            raise ValueError(
                "`sparse_head_assignment='split'` needs `num_attention_heads` >= 2; use 'merged' or 'interleaved'."
            )

"""The Sparse Transformer's patterns (Child et al., 2019) as rules on positions: the one definition that the reference
mask, the reshaped kernels, the edge lists and FlexAttention's `mask_mod` all evaluate.

Sub-patterns of query `i` (keys `j`; `l` = stride, `c` = summary size): `"local"` `|i - j| <= l` and `"residue"`
`(i - j) mod l == 0` (strided A1, A2); `"block"` `floor(i / l) == floor(j / l)` and `"summary"` `j mod l >= l - c`
(fixed A1, A2). A causal pattern intersects each with `j <= i`. A head attends to the union of its sub-patterns and
the global columns `j < num_global`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

#: the two sub-patterns (A1, A2) of each pattern
SUB_PATTERNS = {"strided": ("local", "residue"), "fixed": ("block", "summary")}

_R = TypeVar("_R")
_Movable = TypeVar("_Movable", Tensor, BlockMask)


@dataclass(frozen=True)
class PatternSpec:
    """Everything that defines the pattern of one attention module (hashable: it keys the caches).

    Args:
        stride (`int`): stride / block length `l`.
        summary_size (`int`): summary positions `c` per block (fixed pattern).
        causal (`bool`): keys after the query are excluded.
        first_column (`bool`): the summary sub-pattern also keeps the first position of every block (LRA).
        num_global (`int`): every query also attends to the first `num_global` keys (global columns; the global
            rows are computed by the core, see `attnzoo.core.global_tokens`).
    """

    stride: int
    summary_size: int
    causal: bool
    first_column: bool = False
    num_global: int = 0


def is_summary_column(j: Tensor, spec: PatternSpec) -> Tensor:
    """Whether key position(s) `j` are summary columns of the fixed pattern (elementwise)."""
    offset = torch.remainder(j, spec.stride)
    keep = offset >= spec.stride - spec.summary_size
    if spec.first_column:
        keep = keep | (offset == 0)
    return keep


def summary_positions(length: int, spec: PatternSpec) -> Tensor:
    """Positions `j < length` of the fixed pattern's summary columns, ascending (on the CPU: the device paths take
    them from a per-device cache, see [`device_cache`])."""
    j = torch.arange(length)
    return j[is_summary_column(j, spec)]


def sub_pattern(kind: str, i: Tensor, j: Tensor, spec: PatternSpec) -> Tensor:
    """Whether query position(s) `i` attend to key position(s) `j` under one sub-pattern (elementwise, broadcasting;
    also the body of FlexAttention's `mask_mod`, where `i` and `j` are scalars).

    Args:
        kind (`str`): `"local"`, `"residue"` (strided A1, A2), `"block"` or `"summary"` (fixed A1, A2).
        i (`torch.LongTensor`): absolute query positions.
        j (`torch.LongTensor`): absolute key positions.
        spec ([`PatternSpec`]): the pattern.
    """
    stride = spec.stride
    if kind == "local":
        mask = (i - j).abs() <= stride
    elif kind == "residue":
        mask = torch.remainder(i - j, stride) == 0
    elif kind == "block":
        mask = torch.div(i, stride, rounding_mode="floor") == torch.div(j, stride, rounding_mode="floor")
    elif kind == "summary":
        mask = is_summary_column(j, spec)
    else:
        raise ValueError(f"unknown sub-pattern {kind!r}")
    if spec.causal:
        mask = mask & (j <= i)
    return mask


def sub_pattern_mask(kind: str, q_pos: Tensor, k_pos: Tensor, spec: PatternSpec) -> Tensor:
    """`(Nq, Nk)` boolean mask of one sub-pattern for arbitrary query and key positions (True = attended).

    Args:
        kind (`str`): `"local"`, `"residue"` (strided A1, A2), `"block"` or `"summary"` (fixed A1, A2).
        q_pos (`torch.LongTensor` of shape `(Nq,)`): absolute query positions.
        k_pos (`torch.LongTensor` of shape `(Nk,)`): absolute key positions.
        spec ([`PatternSpec`]): the pattern.
    """
    mask = sub_pattern(kind, q_pos[:, None], k_pos[None, :], spec)
    return mask.expand(q_pos.shape[0], k_pos.shape[0])  # the summary columns do not depend on the query


def pattern_mask(kinds: tuple[tuple[str, ...], ...], q_pos: Tensor, k_pos: Tensor, spec: PatternSpec) -> Tensor:
    """`(H, Nq, Nk)` mask: head `h` attends to the union of the sub-patterns `kinds[h]` and the global columns."""
    cache: dict[tuple[str, ...], Tensor] = {}
    masks = []
    for head_kinds in kinds:
        if head_kinds not in cache:
            mask = torch.zeros(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
            for kind in head_kinds:
                mask |= sub_pattern_mask(kind, q_pos, k_pos, spec)
            if spec.num_global:
                mask |= (k_pos < spec.num_global)[None, :]
            cache[head_kinds] = mask
        masks.append(cache[head_kinds])
    return torch.stack(masks)


def device_cache(builder: Callable[..., _R]) -> Callable[..., _R]:
    """Cache the constant tensors a pattern needs, keyed by the builder's (hashable) arguments, the device included.

    The hot path then reads them without building anything, and without copying a CPU tensor to the device (a
    synchronising copy on CUDA) at every forward. They are built outside inference mode, since autograd may save
    them (indices, BlockMasks) in a later training step; and under `torch.compile` the lookup stays a host-side call
    (dynamo would otherwise bypass the cache and trace the builder into every graph).
    """
    cached = functools.lru_cache(maxsize=64)(builder)

    @torch.compiler.disable
    @functools.wraps(builder)
    def lookup(*args):
        with torch.inference_mode(False):
            return cached(*args)

    lookup.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return lookup


def to_device(value: _Movable, device: torch.device) -> _Movable:
    """`value` (a tensor or a `BlockMask`) on `device`: the one place where the builders of [`device_cache`] copy
    what they built on the CPU (a copy from the host, which CUDA waits for: once per cache entry, never per forward).

    Args:
        value (`torch.Tensor` or `BlockMask`): a constant of the pattern, built on the CPU.
        device (`torch.device`): where the layer runs.

    Returns:
        The same kind of object on `device`.
    """
    return value.to(device)

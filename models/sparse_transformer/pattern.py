"""The Sparse Transformer's patterns (Child et al., 2019) as rules on positions: the one definition that the reference
mask, the reshaped kernels, the edge lists and FlexAttention's `mask_mod` all evaluate.

Sub-patterns of query `i` (keys `j`; `l` = stride, `c` = summary size): `"local"` `|i - j| <= l` and `"residue"`
`(i - j) mod l == 0` (strided A1, A2); `"block"` `floor(i / l) == floor(j / l)` and `"summary"` `j mod l >= l - c`
(fixed A1, A2). A causal pattern intersects each with `j <= i`. A head attends to the union of its sub-patterns and
the global columns `j < num_global`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from ..kernels.constants import host_cached_constant

#: the two sub-patterns (A1, A2) of each pattern
SUB_PATTERNS = {"strided": ("local", "residue"), "fixed": ("block", "summary")}

_R = TypeVar("_R")


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


def summary_positions(length: int, spec: PatternSpec, device: torch.device | None = None) -> Tensor:
    """Positions `j < length` of the fixed pattern's summary columns, ascending, on `device` (default: the CPU).

    Selecting them waits for the device on CUDA: the forward paths read them from a cache ([`device_cache`])."""
    j = torch.arange(length, device=device)
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

    The builders make them on the device itself, so that no forward copies host data to the device (a synchronising
    copy on CUDA) or selects with a boolean mask: whatever waits for the device while building (a selection, a
    `unique`) does so once per cache entry. The hot path then reads them without building anything. Under
    `torch.compile` the lookup is a host-side call ([`~attnzoo.kernels.constants.host_cached_constant`]).
    """
    return host_cached_constant(builder)


def filled_table(values: Sequence[int], device: torch.device) -> Tensor:
    """`(len(values),)` int64 tensor of `values` built on `device` by one fill per run of equal values: a short table
    of Python integers without a copy of host data to the device.

    Args:
        values (`Sequence[int]`): the entries, e.g. every head's group index (a few runs).
        device (`torch.device`): where the table is used.
    """
    runs = [
        torch.full((len(list(run)),), value, dtype=torch.long, device=device)
        for value, run in itertools.groupby(values)
    ]
    return torch.cat(runs) if runs else torch.empty(0, dtype=torch.long, device=device)

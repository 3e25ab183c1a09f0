"""Sparse Transformer attention (Child et al., 2019): strided and fixed factorised patterns.

Selection and compute are separate. The selection step is closed-form: [`pattern.sub_pattern`] decides a sub-pattern
for any query/key positions (the reference path, incremental decoding and FlexAttention's `mask_mod` use it) and
:func:`merged_pattern_edges` lists the deduplicated (query, key) pairs of a merged pattern for one length (cached).
The compute step never builds an `N x N` mask. Its fast paths:

- **FlexAttention** (`attention_backend="fast"` on CUDA, the kernel dispatch's choice): the whole layer in one call
  over a cached, closed-form `BlockMask`, residue heads permuted to class-major order, global rows and columns and
  padding in the mask (see [`flex_pattern`]); in training with attention dropout two calls, the kept entries'
  softmax rescaled by their share of the full normaliser (`attnzoo.kernels.flex.flex_block_attention`). Every
  pattern but the merged strided heads.
- **reshapes and the edge kernel** (elsewhere, and for what FlexAttention does not take):
  - split / interleaved heads: every sub-pattern is a reshape of the sequence followed by SDPA (local window = blocks
    of `l` queries against their `3l` (causal: `2l`) neighbouring keys; same residue = the transposed `(l, N / l)`
    view; own block = block-diagonal view; summary = all queries against the gathered summary columns);
  - merged fixed heads: blocks of `l` queries against [own non-summary keys ‖ all summary keys] (one SDPA call);
  - merged strided heads need one softmax over a window and a residue class, which no reshape gives, and which
    touches every tile in any order (no BlockMask skips much): the shared edge kernel runs over the cached edge list
    (CSR torch path on CPU, Triton on CUDA: see `attnzoo.kernels.dispatch`), padding as -inf logits.

  Global tokens (`num_global_tokens > 0`): the global keys join every key set of the reshapes (block, class, window,
  summary columns) unless the set already holds them, masked per group so that each key counts once; a causal pattern
  with global columns and the merged strided heads take the edge kernel. Lengths that are not a multiple of `l` are
  padded internally with masked keys and sliced back.

The index tensors every path needs (and the density) are built on the device itself, once per length and device, so
that no forward copies host data to the device or selects with a boolean mask (each a wait for the device on CUDA).
Which fast path is faster on a GPU has not been measured yet (`scripts/tools/bench_sparse_transformer_flex.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.attention import AttentionOutput, ZooAttention
from ..kernels import (
    batch_head_offsets,
    dense_attention,
    edge_attention,
    resolve_backend,
)
from ..kernels.dispatch import uses_flex_attention
from ..kernels.hashing import draw_seed
from .configuration_sparse_transformer import SparseTransformerConfig
from .flex_pattern import flex_pattern_attention, takes_flex
from .pattern import (
    SUB_PATTERNS,
    PatternSpec,
    device_cache,
    is_summary_column,
    pattern_mask,
    sub_pattern_mask,
    summary_positions,
)


def _sub_pattern_edges(kind: str, length: int, spec: PatternSpec, device: torch.device) -> tuple[Tensor, Tensor]:
    """Unsorted `(rows, cols)` of one sub-pattern for `length` tokens, built from candidate offsets (O(N * K))."""
    stride = spec.stride
    i = torch.arange(length, device=device)[:, None]
    if kind == "local":
        cols = i - torch.arange(0 if spec.causal else -stride, stride + 1, device=device)
    elif kind == "residue":
        reach = math.ceil(length / stride)
        cols = i - stride * torch.arange(0 if spec.causal else -reach, reach + 1, device=device)
    elif kind == "block":
        cols = torch.div(i, stride, rounding_mode="floor") * stride + torch.arange(stride, device=device)
    else:
        cols = summary_positions(length, spec, device)[None, :].expand(length, -1)
    rows = i.expand_as(cols)
    keep = (cols >= 0) & (cols < length)
    if spec.causal:
        keep &= cols <= rows
    return rows[keep], cols[keep]


@device_cache
def merged_pattern_edges(
    kinds: tuple[str, ...], length: int, spec: PatternSpec, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Row-sorted, duplicate-free `(rows, cols)` of the union of `kinds` for `length` tokens (one head) on `device`."""
    parts = [_sub_pattern_edges(kind, length, spec, device) for kind in kinds]
    if spec.num_global:
        queries, keys = torch.arange(length, device=device), torch.arange(min(spec.num_global, length), device=device)
        rows, cols = torch.meshgrid(queries, keys, indexing="ij")
        parts.append((rows.reshape(-1), cols.reshape(-1)))
    rows = torch.cat([r for r, _ in parts])
    cols = torch.cat([c for _, c in parts])
    # A key in both sub-patterns (e.g. j = i, or the own block's summary columns) must count once in the softmax.
    flat = torch.unique(rows * length + cols)  # sorted, so rows come out non-decreasing
    return torch.div(flat, length, rounding_mode="floor"), flat % length


class FixedColumns(NamedTuple):
    """Key positions of the fixed pattern's reshaped paths at one length, on one device (see [`fixed_columns`])."""

    #: `(S,)` the summary columns, ascending
    summary: Tensor
    #: `(S',)` the summary columns and the global columns, ascending, each once
    summary_and_global: Tensor
    #: `(m,)` offsets inside a block of the keys that are not summary columns
    own: Tensor
    #: `(E,)` global columns that are not summary columns
    extra: Tensor


@device_cache
def fixed_columns(length: int, spec: PatternSpec, device: torch.device) -> FixedColumns:
    """The [`FixedColumns`] of `length` tokens on `device` (built once: the boolean selections and `unique` wait for
    the device)."""
    summary = summary_positions(length, spec, device)
    glob = torch.arange(_global_count(spec, length), device=device)
    offsets = torch.arange(spec.stride, device=device)
    return FixedColumns(
        summary=summary,
        summary_and_global=torch.unique(torch.cat([summary, glob])),
        own=offsets[~is_summary_column(offsets, spec)],
        extra=glob[~torch.isin(glob, summary)],
    )


def _pad_length(x: Tensor, length: int, dim: int = 2, value: float | bool = 0) -> Tensor:
    """Right-pad `x` along `dim` to `length` (no copy when nothing is missing)."""
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.dim() - dim - 1) + [0, missing]
    return F.pad(x, pad, value=value)


def _valid_keys(key_valid: Tensor | None, batch: int, length: int, padded: int, device: torch.device) -> Tensor:
    """`(B, padded)` key validity: real, non-padding keys; internal padding beyond `length` is invalid."""
    if key_valid is None:
        key_valid = torch.ones(batch, length, dtype=torch.bool, device=device)
    return _pad_length(key_valid, padded, dim=1, value=False)


def _sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    dropout_p: float,
    scale: float,
    bias: Tensor | None = None,
) -> Tensor:
    # SDPA through the shared dense primitive, which zeroes query rows without any valid key: SDPA's CUDA kernels
    # under bf16 autocast return an average of the masked values there (seen on an H100; the CPU kernels give
    # zeros). A causal structure is SDPA's own flag only without a mask or bias; with one the callers fold it in.
    # `bias` is a cached pattern bias (`structure_bias`), given only where every real query row keeps a key.
    return dense_attention(
        q,
        k,
        v,
        mask,
        logit_bias=bias,
        is_causal=causal and mask is None and bias is None,
        scale=scale,
        dropout_p=dropout_p,
        training=dropout_p > 0,
    )


def _global_count(spec: PatternSpec, length: int) -> int:
    """Global columns the reshaped paths add to every key set (they serve bidirectional patterns only)."""
    if spec.num_global and spec.causal:
        raise ValueError("The reshaped Sparse Transformer paths take global columns only without the causal mask.")
    return min(spec.num_global, length)


def _key_groups(groups: Tensor, x: Tensor, g: int) -> Tensor:
    """`groups` `(B, h, G, K, d)` (each head's `G` key sets, usually a strided view of `x`) with the `g` global keys
    of `x` `(B, h, N, d)` appended to every set, as one `(B, h * G, K + g, d)` tensor: a single copy, which the
    concatenation makes when there are global keys."""
    batch, heads, count, _, dim = groups.shape
    if g:
        groups = torch.cat([groups, x[:, :, None, :g].expand(-1, -1, count, -1, -1)], dim=3)
    return groups.reshape(batch, heads * count, -1, dim)


def _per_head(mask: Tensor, heads: int) -> Tensor:
    """`(B, G, Q, K)` mask shared by the heads -> `(B, heads * G, Q, K)` (head-major, as the key groups)."""
    batch, groups = mask.shape[:2]
    return mask[:, None].expand(-1, heads, -1, -1, -1).reshape(batch, heads * groups, *mask.shape[2:])


class _Blocks(NamedTuple):
    """Sizes of the reshaped paths at one length: `nb` blocks of `l`, `padded = nb * l`, and the local window's
    width `w` and right padding `after` (its left padding is `l`)."""

    blocks: int
    padded: int
    width: int
    after: int


def _blocks(length: int, spec: PatternSpec) -> _Blocks:
    stride = spec.stride
    blocks = math.ceil(length / stride)
    padded = blocks * stride
    width = 2 * stride if spec.causal else 3 * stride
    return _Blocks(blocks, padded, width, padded - length + (0 if spec.causal else stride))


def _window_keys_valid(valid: Tensor, length: int, spec: PatternSpec) -> Tensor:
    """`(B, padded)` key validity -> `(B, nb, w + g)` validity of every block's window keys and global keys."""
    blocks, padded, width, after = _blocks(length, spec)
    windows = F.pad(valid, (spec.stride, after - (padded - length)), value=False).unfold(1, width, spec.stride)
    g = _global_count(spec, length)
    if g:
        windows = torch.cat([windows, valid[:, None, :g].expand(-1, blocks, -1)], dim=-1)
    return windows


@device_cache
def window_structure(length: int, spec: PatternSpec, device: torch.device) -> Tensor:
    """`(nb, l, w + g)` pattern of the local-window blocks in a batch without padding (see
    [`local_window_attention`]): the band, keys inside the sequence, and the global keys outside the window."""
    stride = spec.stride
    blocks, padded, width, _ = _blocks(length, spec)
    r = torch.arange(stride, device=device)[:, None]
    t = torch.arange(width, device=device)[None, :]
    band = (t >= r) & (t <= r + (stride if spec.causal else 2 * stride))  # (l, w): i - j = r - t + l
    real = _window_keys_valid(_valid_keys(None, 1, length, padded, device), length, spec)[0]  # (nb, w + g)
    g = _global_count(spec, length)
    if g:
        # Global key j joins query i's softmax unless the window already holds it.
        queries, keys = torch.arange(padded, device=device), torch.arange(g, device=device)
        outside = ~sub_pattern_mask("local", queries, keys, spec).view(blocks, stride, g)  # (nb, l, g)
        band = torch.cat([band.expand(blocks, -1, -1), outside], dim=-1)  # (nb, l, w + g)
    return band & real[:, None, :]


@device_cache
def class_structure(length: int, spec: PatternSpec, device: torch.device) -> Tensor:
    """`(l, 1, nb + g)` (causal: `(l, nb, nb)`) pattern of the residue classes in a batch without padding (see
    [`residue_attention`]): keys inside the sequence, the global keys outside the class, the causal order."""
    stride = spec.stride
    blocks, padded, _, _ = _blocks(length, spec)
    real = _valid_keys(None, 1, length, padded, device)
    mask = real.view(blocks, stride).T  # (l, nb)
    g = _global_count(spec, length)
    if g:
        # Global key j joins class c's softmax unless it belongs to the class (query c stands for the class).
        classes, keys = torch.arange(stride, device=device), torch.arange(g, device=device)
        mask = torch.cat([mask, ~sub_pattern_mask("residue", classes, keys, spec)], dim=-1)  # (l, nb + g)
    mask = mask[:, None]
    if spec.causal:
        mask = mask & torch.ones(blocks, blocks, dtype=torch.bool, device=device).tril()
    return mask


#: The sub-patterns whose reshaped path has a cached structure ([`structure_bias`]): every real query attends to
#: itself there, so a batch without padding has no query row without a key.
STRUCTURES = {"local": window_structure, "residue": class_structure}


@device_cache
def structure_bias(
    kind: str, length: int, spec: PatternSpec, heads: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """`(1, heads * G, Q, K)` SDPA bias of a sub-pattern's structure ([`STRUCTURES`]) for a batch without padding:
    0 where attended, the dtype's minimum elsewhere (as the shared dense primitive masks), repeated for `heads`
    heads. Built once, so that such a forward builds no mask at all."""
    structure = STRUCTURES[kind](length, spec, device)  # (G, Q, K)
    bias = torch.zeros(structure.shape, dtype=dtype, device=device).masked_fill(~structure, torch.finfo(dtype).min)
    return _per_head(bias[None], heads)


def local_window_attention(q, k, v, key_valid, spec: PatternSpec, dropout_p: float, scale: float) -> Tensor:
    """Strided A1, `|i - j| <= l` (causal: `0 <= i - j <= l`): blocks of `l` queries against their neighbour blocks.

    Computes `3l` (causal: `2l`) scores per query instead of `N`; the band mask is `(nb, l, 3l)`, cached with the
    global keys' for a batch without padding ([`window_structure`]).
    """
    batch, heads, length, dim = q.shape
    stride = spec.stride
    blocks, padded, width, after = _blocks(length, spec)
    # The heads go into SDPA's batch dimension and the blocks into its head dimension, so that the cached bias of a
    # batch without padding broadcasts over the heads instead of being repeated for each. The cached lookups come
    # first: under torch.compile each is a graph break, and an overlapping window view of k or v crossing a graph
    # break gets wrong gradients from AOTAutograd (measured: compiled dK, dV off by up to 1.5, eager exact).
    mask, bias = None, None
    if key_valid is None:
        bias = structure_bias("local", length, spec, 1, q.dtype, q.device)  # (1, nb, l, w + g)
    else:
        keys_valid = _window_keys_valid(_valid_keys(key_valid, batch, length, padded, q.device), length, spec)
        mask = window_structure(length, spec, q.device)[None] & keys_valid[:, :, None, :]  # (B, nb, l, w + g)
        mask = mask[:, None].expand(-1, heads, -1, -1, -1).reshape(batch * heads, *mask.shape[1:])
    g = _global_count(spec, length)
    # Key window of block b covers positions (b - 1) * l ... (b - 1) * l + width - 1.
    k_win = F.pad(k, (0, 0, stride, after)).unfold(2, width, stride).transpose(-1, -2)  # (B, h, nb, w, d)
    v_win = F.pad(v, (0, 0, stride, after)).unfold(2, width, stride).transpose(-1, -2)
    out = _sdpa(
        _pad_length(q, padded).reshape(batch * heads, blocks, stride, dim),
        _key_groups(k_win, k, g).view(batch * heads, blocks, width + g, dim),
        _key_groups(v_win, v, g).view(batch * heads, blocks, width + g, dim),
        mask,
        False,
        dropout_p,
        scale,
        bias,
    )
    return out.reshape(batch, heads, padded, dim)[:, :, :length]


def residue_attention(q, k, v, key_valid, spec: PatternSpec, dropout_p: float, scale: float) -> Tensor:
    """Strided A2, `(i - j) mod l == 0`: attention inside each residue class on the transposed `(l, N / l)` view.

    Row-major order is kept inside a class, so the causal variant is SDPA's own causal mask.
    """
    batch, heads, length, dim = q.shape
    stride = spec.stride
    blocks = math.ceil(length / stride)
    padded = blocks * stride

    def to_classes(x: Tensor) -> Tensor:  # (B, h, N, d) -> (B, h, l, nb, d), a view of the padded x
        return _pad_length(x, padded).reshape(batch, heads, blocks, stride, dim).transpose(2, 3)

    mask, bias = None, None
    g = _global_count(spec, length)
    if key_valid is not None:
        valid = _valid_keys(key_valid, batch, length, padded, q.device)
        keys_valid = valid.view(batch, blocks, stride).transpose(1, 2)  # (B, l, nb)
        if g:
            keys_valid = torch.cat([keys_valid, valid[:, None, :g].expand(-1, stride, -1)], dim=-1)  # (B, l, nb + g)
        mask = _per_head(class_structure(length, spec, q.device)[None] & keys_valid[:, :, None, :], heads)
    elif padded != length or g:
        bias = structure_bias("residue", length, spec, heads, q.dtype, q.device)  # (1, h * l, 1 or nb, nb + g)
    keys, values = _key_groups(to_classes(k), k, g), _key_groups(to_classes(v), v, g)
    out = _sdpa(_key_groups(to_classes(q), q, 0), keys, values, mask, spec.causal, dropout_p, scale, bias)
    out = out.reshape(batch, heads, stride, blocks, dim).transpose(2, 3)
    return out.reshape(batch, heads, padded, dim)[:, :, :length]


def block_attention(q, k, v, key_valid, spec: PatternSpec, dropout_p: float, scale: float) -> Tensor:
    """Fixed A1, `floor(i / l) == floor(j / l)`: block-diagonal attention on the `(N / l, l)` view."""
    batch, heads, length, dim = q.shape
    stride = spec.stride
    blocks = math.ceil(length / stride)
    padded = blocks * stride

    def to_blocks(x: Tensor) -> Tensor:  # (B, h, N, d) -> (B, h, nb, l, d), a view of the padded x
        return _pad_length(x, padded).reshape(batch, heads, blocks, stride, dim)

    mask = None
    g = _global_count(spec, length)
    if key_valid is not None or padded != length or g:
        valid = _valid_keys(key_valid, batch, length, padded, q.device)
        mask = valid.reshape(batch, blocks, 1, stride)
        if g:
            # Global key j joins block b's softmax unless it lies in the block (query b * l stands for the block).
            starts, keys = torch.arange(0, padded, stride, device=q.device), torch.arange(g, device=q.device)
            other = ~sub_pattern_mask("block", starts, keys, spec)  # (nb, g)
            mask = torch.cat([mask, (other[None] & valid[:, None, :g])[:, :, None]], dim=-1)  # (B, nb, 1, l + g)
        mask = _per_head(mask, heads)
        if spec.causal:
            mask = mask & torch.ones(stride, stride, dtype=torch.bool, device=q.device).tril()
    keys, values = _key_groups(to_blocks(k), k, g), _key_groups(to_blocks(v), v, g)
    out = _sdpa(_key_groups(to_blocks(q), q, 0), keys, values, mask, spec.causal, dropout_p, scale)
    return out.reshape(batch, heads, padded, dim)[:, :, :length]


def summary_attention(q, k, v, key_valid, spec: PatternSpec, dropout_p: float, scale: float) -> Tensor:
    """Fixed A2, `j mod l >= l - c`: every query against the `c * N / l` gathered summary keys (one SDPA call)."""
    length = q.shape[2]
    # The same keys for every query: the global columns join the summary columns (each key once).
    columns = fixed_columns(length, spec, q.device)
    positions = columns.summary_and_global if _global_count(spec, length) else columns.summary  # (S,)
    if positions.numel() == 0:
        return torch.zeros_like(q)
    k_sum, v_sum = k.index_select(2, positions), v.index_select(2, positions)  # (B, h, S, d)
    mask = None
    if spec.causal:
        mask = (positions[None, :] <= torch.arange(length, device=q.device)[:, None])[None, None]  # (1, 1, N, S)
    if key_valid is not None:
        valid = key_valid.index_select(1, positions)[:, None, None, :]  # (B, 1, 1, S)
        mask = valid if mask is None else mask & valid
    return _sdpa(q, k_sum, v_sum, mask, False, dropout_p, scale)


def merged_fixed_attention(q, k, v, key_valid, spec: PatternSpec, dropout_p: float, scale: float) -> Tensor:
    """Fixed A1 ∪ A2 in one softmax: each block of `l` queries against [its own non-summary keys ‖ all summary keys].

    Leaving the own block's summary columns out of the first part keeps every key exactly once, so the bidirectional
    pattern without padding needs no mask at all. The summary keys are copied once per block (`N / l * S` rows).
    """
    batch, heads, length, dim = q.shape
    stride = spec.stride
    blocks = math.ceil(length / stride)
    padded = blocks * stride
    device = q.device
    positions, _, own, extra = fixed_columns(length, spec, device)  # (S,), (m,) offsets of own keys, (E,)
    offsets = torch.arange(stride, device=device)

    def own_keys(x: Tensor) -> Tensor:  # (B, h, N, d) -> (B, h, nb, m, d)
        return _pad_length(x, padded).reshape(batch, heads, blocks, stride, dim).index_select(3, own)

    # Global columns that are not summary columns (`extra`) are some block's own keys: block b adds those outside it.
    shared = torch.cat([positions, extra])  # (S + E,) keys appended to every block

    def block_keys(x: Tensor) -> Tensor:  # (B, h * nb, m + S + E, d)
        summary = x.index_select(2, shared)[:, :, None].expand(-1, -1, blocks, -1, -1)
        return torch.cat([own_keys(x), summary], dim=3).reshape(batch, heads * blocks, -1, dim)

    mask = None
    if spec.causal or key_valid is not None or padded != length or extra.numel():
        valid = _valid_keys(key_valid, batch, length, padded, device)
        own_mask = valid.reshape(batch, blocks, 1, stride).index_select(3, own)  # (B, nb, 1, m)
        summary_mask = valid.index_select(1, shared)[:, None, None, :]  # (B, 1, 1, S + E)
        if spec.causal:
            query = torch.arange(padded, device=device).reshape(blocks, stride, 1)  # (nb, l, 1)
            own_mask = own_mask & (own <= offsets[:, None])  # (B, nb, l, m)
            summary_mask = summary_mask & (positions <= query)  # (B, nb, l, S)
        if extra.numel():
            starts = torch.arange(0, padded, stride, device=device)  # one query per block
            outside = ~sub_pattern_mask("block", starts, extra, spec)  # (nb, E)
            outside = torch.cat([outside.new_ones(blocks, positions.numel()), outside], dim=-1)  # (nb, S + E)
            summary_mask = summary_mask & outside[None, :, None, :]  # (B, nb, 1, S + E)
        mask = torch.cat(
            [own_mask.expand(-1, blocks, stride, -1), summary_mask.expand(-1, blocks, stride, -1)], dim=-1
        )  # (B, nb, l, m + S + E)
        mask = _per_head(mask, heads)
    q_blocks = _pad_length(q, padded).reshape(batch, heads * blocks, stride, dim)
    out = _sdpa(q_blocks, block_keys(k), block_keys(v), mask, False, dropout_p, scale)
    return out.reshape(batch, heads, padded, dim)[:, :, :length]


SUB_PATTERN_ATTENTION = {
    "local": local_window_attention,
    "residue": residue_attention,
    "block": block_attention,
    "summary": summary_attention,
}


def _row_counts(kind: str, length: int, spec: PatternSpec, device: torch.device) -> Tensor:
    """`(N,)` number of keys of one sub-pattern in every row, in closed form."""
    i, stride = torch.arange(length, device=device), spec.stride
    if kind == "local":
        low = (i - stride).clamp(min=0)
        return (i if spec.causal else (i + stride).clamp(max=length - 1)) - low + 1
    if kind == "residue":
        return i // stride + 1 if spec.causal else (length - 1 - i % stride) // stride + 1
    if kind == "block":
        return i % stride + 1 if spec.causal else (length - i // stride * stride).clamp(max=stride)
    positions = summary_positions(length, spec, device)
    if spec.causal:
        return torch.searchsorted(positions, i, right=True)
    return torch.full((length,), positions.numel(), device=device)


def _overlap_counts(kinds: tuple[str, ...], length: int, spec: PatternSpec, device: torch.device) -> Tensor:
    """`(N,)` keys that belong to both sub-patterns of a merged head (counted once in its softmax)."""
    i, stride = torch.arange(length, device=device), spec.stride
    if kinds == SUB_PATTERNS["strided"]:  # j in {i - l, i, i + l}
        return 1 + (i >= stride).long() + (0 if spec.causal else (i + stride < length).long())
    # fixed: the summary columns of the own block (up to i when causal)
    positions = summary_positions(length, spec, device)
    first = i // stride * stride
    last = i if spec.causal else (first + stride - 1).clamp(max=length - 1)
    return torch.searchsorted(positions, last, right=True) - torch.searchsorted(positions, first)


def _pair_counts(kinds: tuple[tuple[str, ...], ...], length: int, spec: PatternSpec, device: torch.device) -> Tensor:
    """`(H,)` attended (query, key) pairs of every head at `length`, on `device` (closed form, `O(N)`)."""
    counts = []
    for head_kinds in kinds:
        if spec.num_global:
            # Global columns overlap the pattern in ways without a short closed form: count the edge list instead.
            rows = torch.bincount(merged_pattern_edges(head_kinds, length, spec, device)[0], minlength=length)
        else:
            rows = sum(_row_counts(kind, length, spec, device) for kind in head_kinds)
            if len(head_kinds) > 1:
                rows = rows - _overlap_counts(head_kinds, length, spec, device)
        # The global rows attend to every key (computed by the core).
        rows[: spec.num_global] = length
        counts.append(rows.sum())
    return torch.stack(counts)


@device_cache
def _density(kinds: tuple[tuple[str, ...], ...], length: int, spec: PatternSpec, device: torch.device) -> Tensor:
    """`(H,)` density of every head at `length`, counted on `device` once (every forward reads the cached tensor)."""
    return _pair_counts(kinds, length, spec, device).float() / float(length * length)


@dataclass
class FlexAttentionOutput(AttentionOutput):
    """An [`AttentionOutput`] whose hidden states hold the global queries' rows already (FlexAttention's mask gives
    them every real key), so that the core does not compute them again."""


class SparseTransformerAttention(ZooAttention):
    """Strided or fixed factorised self-attention (Child et al., 2019), bidirectional or causal with a KV cache.

    The pattern comes from the config (see [`SparseTransformerConfig`]); as decoder self-attention it is always
    causal. `config.attention_backend="reference"` (and `output_attentions=True`) runs dense masked attention over
    the same pattern (the plain truth of the reshapes and edge lists); incremental decoding steps build only the
    pattern rows of the new queries. Otherwise a fast path runs (module docstring): FlexAttention where the kernel
    dispatch takes it (`"fast"` on CUDA), else the reshapes and the edge kernel, whose implementation follows
    `attention_backend`.
    `density` is the fraction of the `N x N` (query, key) pairs each head attends to at the padded length `N`.
    """

    supports_causal = True
    supports_global_tokens = True

    def __init__(self, config: SparseTransformerConfig, **kwargs):
        super().__init__(config, **kwargs)
        preset_lra = config.sparse_preset == "lra"
        if preset_lra and self.num_global_tokens == 0 and not (self.is_causal or self.is_cross_attention):
            # LRA's CLS token attends to every key and every query attends to it (never in a decoder).
            self.num_global_tokens = 1
        self.spec = PatternSpec(
            stride=config.sparse_stride,
            summary_size=config.sparse_summary_size,
            causal=self.is_causal or config.sparse_causal,
            first_column=preset_lra,
            num_global=self.num_global_tokens,
        )
        first, second = SUB_PATTERNS[config.sparse_pattern]
        assignment = config.sparse_head_assignment
        if assignment == "merged":
            groups = [(first, second)] * self.num_heads
        elif assignment == "split":
            half = math.ceil(self.num_heads / 2)
            groups = [(first,)] * half + [(second,)] * (self.num_heads - half)
        else:
            groups = [(first,) if self.layer_idx % 2 == 0 else (second,)] * self.num_heads
        #: sub-patterns of every head, e.g. `(("local",), ("local",), ("residue",), ("residue",))`
        self.head_kinds: tuple[tuple[str, ...], ...] = tuple(groups)

    def pattern_mask(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """`(H, Nq, Nk)` pattern of this module for the given absolute positions (before padding)."""
        return pattern_mask(self.head_kinds, q_pos, k_pos, self.spec)

    def density(self, length: int, device: torch.device) -> Tensor:
        """`(H,)` fraction of the `length x length` (query, key) pairs each head attends to (a cached constant: do
        not modify it in place)."""
        return _density(self.head_kinds, length, self.spec, device)

    def runs_flex(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether the pattern of this forward runs as FlexAttention (the kernel dispatch's choice for the backend and
        device; every head block-sparse in some order)."""
        backend = self.config.attention_backend
        head_dim = min(q.shape[-1], v.shape[-1])
        flex = uses_flex_attention(backend, q.device, q.dtype, k.dtype, v.dtype, head_dim=head_dim)
        return flex and takes_flex(self.head_kinds)

    def attend(self, q, k, v, key_valid, *, query_offset=0, output_attentions=False):
        q_len, k_len = q.shape[2], k.shape[2]
        incremental = q_len != k_len or query_offset != 0
        reference = resolve_backend(self.config.attention_backend, q.device, q.dtype) == "reference"
        if incremental or output_attentions or reference:
            q_pos = torch.arange(q_len, device=q.device) + query_offset
            mask = self.pattern_mask(q_pos, torch.arange(k_len, device=q.device))[None]  # (1, H, Nq, Nk)
            if key_valid is not None:
                mask = mask & key_valid[:, None, None, :]
            out = self.dense_reference(q, k, v, mask, output_attentions)
        elif self.runs_flex(q, k, v):
            seed = draw_seed(q.device) if self.training and self.dropout > 0.0 else None
            hidden = flex_pattern_attention(
                q, k, v, key_valid, self.head_kinds, self.spec, self.scaling, dropout_p=self.dropout, keep_seed=seed
            )  # fmt: skip
            out = FlexAttentionOutput(hidden_states=hidden)
        else:
            out = AttentionOutput(hidden_states=self.fast_attention(q, k, v, key_valid))
        if not incremental:
            # The pattern does not depend on the example: every row of the batch has the same density.
            out.density = self.density(k_len, q.device).expand(q.shape[0], -1)
        return out

    def with_global_rows(self, out, q, k, v, key_valid):
        if isinstance(out, FlexAttentionOutput):
            return out  # FlexAttention's mask gave the global queries every real key already
        return super().with_global_rows(out, q, k, v, key_valid)

    def head_groups(self) -> list[tuple[slice, tuple[str, ...]]]:
        """Runs of consecutive heads with the same sub-patterns: `(heads, kinds)`."""
        groups, start = [], 0
        while start < self.num_heads:
            stop = start
            while stop < self.num_heads and self.head_kinds[stop] == self.head_kinds[start]:
                stop += 1
            groups.append((slice(start, stop), self.head_kinds[start]))
            start = stop
        return groups

    def fast_attention(self, q: Tensor, k: Tensor, v: Tensor, key_valid: Tensor | None) -> Tensor:
        """Pattern attention without any `N x N` tensor; `(B, H, N, d)` in and out."""
        dropout_p = self.dropout if self.training else 0.0
        outs = []
        groups = self.head_groups()
        # One split per tensor rather than a slice per group: its backward is one concatenation of the groups'
        # gradients, where slices would each scatter into a zero tensor and then be added.
        sizes = [heads.stop - heads.start for heads, _ in groups]
        for (_, kinds), qh, kh, vh in zip(groups, *(x.split(sizes, dim=1) for x in (q, k, v)), strict=True):
            if (self.spec.num_global and self.spec.causal) or (len(kinds) > 1 and kinds != SUB_PATTERNS["fixed"]):
                # One softmax over the union of the sub-patterns (and the global columns): the edge kernel.
                outs.append(self._edge_attention(qh, kh, vh, key_valid, dropout_p, kinds))
            elif len(kinds) > 1:
                outs.append(merged_fixed_attention(qh, kh, vh, key_valid, self.spec, dropout_p, self.scaling))
            else:
                outs.append(SUB_PATTERN_ATTENTION[kinds[0]](qh, kh, vh, key_valid, self.spec, dropout_p, self.scaling))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    # A compiler boundary, as in the other families that run the CSR edge kernel: its custom autograd Function breaks
    # dynamo's automatic-dynamic shapes pass (IndexError in torch 2.13), so under `torch.compile` this part runs
    # eagerly (one graph break per layer) and the rest of the model is compiled.
    @torch.compiler.disable
    def _edge_attention(self, q, k, v, key_valid, dropout_p: float, kinds: tuple[str, ...]) -> Tensor:
        # One softmax over the union of `kinds` (and the global columns) per head: the shared CSR edge kernel over
        # the cached, duplicate-free edge list.
        batch, heads, length, _ = q.shape
        rows, cols = merged_pattern_edges(kinds, length, self.spec, q.device)  # (E1,)
        offsets = batch_head_offsets(batch, heads, length, q.device).reshape(-1, 1)  # (B * H, 1)
        all_rows = (rows[None] + offsets).reshape(-1)
        all_cols = (cols[None] + offsets).reshape(-1)
        padding = None
        if key_valid is not None:
            # Edges to padding get a -inf logit rather than being dropped: a boolean selection would wait for the
            # device to learn how many edges remain.
            real = key_valid.index_select(1, cols)[:, None, :].expand(-1, heads, -1).reshape(-1)  # (B * H * E1,)
            padding = torch.where(real, 0.0, float("-inf"))
        # Head-split q, k, v: the Triton kernel reads them in place (the torch paths flatten them).
        return edge_attention(
            q,
            k,
            v,
            all_rows,
            all_cols,
            logit_bias=padding,
            scale=self.scaling,
            dropout_p=dropout_p,
            training=self.training,
            sorted_rows=True,
            backend=self.config.attention_backend,
        )

"""The Sparse Transformer's patterns as one FlexAttention call per layer (`attention_backend="fast"` on CUDA).

Every head's key set becomes tiles of a `BlockMask` (see [`attnzoo.kernels.flex`]):

- heads whose sub-patterns are bands or blocks in token order (local window, own block, summary columns, and the
  fixed pattern's union) run in token order: a local head touches 2-3 key tiles per query tile;
- residue heads (strided A2) touch every tile in token order, so their queries, keys and values are permuted to
  class-major order (`i mod l`, then `i div l`), where every residue class is a contiguous segment and the pattern is
  block-diagonal: about `N / l` keys per query in whole tiles;
- the global columns are listed in every query tile, the global rows (which attend to every real key: the core's
  `with_global_rows`) get every key tile, and padding is a per-example key lookup in the `mask_mod`.

The `mask_mod` evaluates the same rule as the reference ([`pattern.sub_pattern`]), so the union semantics (each key
once in one softmax) hold by construction. The tiles are classified in closed form from per-position facts of every
query and key tile (`O(N)` work, no pair of positions evaluated), exactly as `create_block_mask(mask_mod)` would
classify them, on the device, and cached per (heads, length, pattern, device, tile size).

The merged strided heads (one softmax over a window and a residue class) are block-sparse in no order, so they keep
the edge kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from ..kernels.flex import MaskMod, PositionPermutation, block_mask_from_tiles, flex_block_attention, with_mask_mod
from .pattern import SUB_PATTERNS, PatternSpec, device_cache, filled_table, is_summary_column, sub_pattern

#: Query and key tile of the BlockMask: FlexAttention's default, which its compiled kernels' tiles always divide.
FLEX_BLOCK_SIZE = (128, 128)

#: Head sub-patterns FlexAttention runs (in token order, or class-major for the residue heads).
FLEX_KINDS = (("local",), ("residue",), ("block",), ("summary",), SUB_PATTERNS["fixed"])


def takes_flex(head_kinds: tuple[tuple[str, ...], ...]) -> bool:
    """Whether every head's sub-patterns are block-sparse in some order (all but the merged strided heads)."""
    return all(kinds in FLEX_KINDS for kinds in head_kinds)


def class_major_order(length: int, stride: int, device: torch.device | None = None) -> Tensor:
    """`(N,)` token position at every class-major position, on `device` (default: the CPU): residue class
    `c = i mod l` after class `c - 1`, and token order inside a class."""
    i = torch.arange(length, device=device)
    per_class, longer = divmod(length, stride)  # the first `longer` classes hold one more position
    residue = i % stride
    start = residue * per_class + residue.clamp(max=longer)  # class-major position of the class's first token
    order = torch.empty_like(i)
    order[start + i // stride] = i
    return order


def _per_tile(values: Tensor, tile: int, fill: int | bool, reduce: str) -> Tensor:
    """`(ceil(N / tile),)` reduction (`"amin"`, `"amax"` or `"any"`) of `(N,)` values over each tile."""
    missing = -values.shape[0] % tile
    padded = torch.cat([values, values.new_full((missing,), fill)]).view(-1, tile)
    return getattr(padded, reduce)(-1)


def classify_tiles(
    kinds: tuple[str, ...], order: Tensor, spec: PatternSpec, q_tile: int, kv_tile: int
) -> tuple[Tensor, Tensor]:
    """The tiles one head touches and those it attends entirely, in closed form.

    A tile pair counts as *full* exactly when `create_block_mask` would mark it so: both tiles complete (within the
    length) and every pair attended. The global rows attend to every key and every row to the global columns, so a
    pair is full when the pattern covers the remaining rows (`rows'`) and keys (`cols'`); the tests of each
    sub-pattern need only the first and last of those (`a, b` and `x, y`, in the head's order).

    Args:
        kinds (`tuple[str, ...]`): the head's sub-patterns, one of [`FLEX_KINDS`].
        order (`torch.LongTensor` of shape `(N,)`): token position at every position of the head's order (class-major
            for `("residue",)`, else token order).
        spec ([`PatternSpec`]): the pattern.
        q_tile (`int`), kv_tile (`int`): tile sizes.

    Returns:
        `touched`, `full`: `torch.BoolTensor`s of shape `(ceil(N / q_tile), ceil(N / kv_tile))`.
    """
    if kinds not in FLEX_KINDS:
        raise ValueError(f"sub-patterns {kinds} are block-sparse in no order FlexAttention can use")
    length, stride, device = order.shape[0], spec.stride, order.device
    position = torch.arange(length, device=device)
    is_global = order < spec.num_global
    first = torch.where(is_global, length, position)  # non-global positions (the global ones never bind a pair)
    last = torch.where(is_global, -1, position)

    def tiles(tile: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        start = torch.arange(0, length, tile, device=device)
        return (
            start,
            (start + tile).clamp(max=length) - 1,
            _per_tile(first, tile, length, "amin"),
            _per_tile(last, tile, -1, "amax"),
            _per_tile(is_global, tile, False, "any"),
        )

    qs, ql, a, b, global_row = (t[:, None] for t in tiles(q_tile))
    ks, kl, x, y, global_col = (t[None, :] for t in tiles(kv_tile))
    # Sub-pattern tests on the whole tiles (touched) and on rows' x cols' (covered). With the causal rule, a tile
    # pair holds some j <= i iff ks <= ql; every pair has j <= i iff y <= a.
    some_causal = ks <= ql if spec.causal else torch.ones((), dtype=torch.bool, device=device)
    if kinds == ("local",):
        # i - j ranges over [qs - kl, ql - ks]; the band is [-l, l] ([0, l] when causal).
        touched = (ql - ks >= (0 if spec.causal else -stride)) & (qs - kl <= stride)
        covered = (x >= b - stride) & (y <= a + (0 if spec.causal else stride))
    else:
        touched = torch.zeros(qs.shape[0], ks.shape[1], dtype=torch.bool, device=device)
        covered = torch.zeros_like(touched)
    if kinds[0] in ("residue", "block"):
        # Segments: residue classes (contiguous in class-major order) or blocks of l; rows' and cols' all in one.
        if kinds == ("residue",):
            segment, segments = order % stride, min(stride, length)
        else:
            segment, segments = position // stride, -(-length // stride)
        seg_start = position.new_zeros(segments).scatter_reduce(0, segment, position, "amin", include_self=False)
        seg_end = torch.zeros_like(seg_start).scatter_reduce(0, segment, position, "amax", include_self=False)
        touched = (segment[qs] <= segment[kl]) & (segment[ks] <= segment[ql]) & some_causal
        own = segment[a.clamp(max=length - 1)]
        one_segment = own == segment[b.clamp(min=0)]
        covered = one_segment & (x >= seg_start[own]) & (y <= seg_end[own])
    if "summary" in kinds:
        # A key tile holds a summary column (when causal, one not after the query tile's last row)...
        summary = _per_tile(torch.where(is_summary_column(order, spec), position, length), kv_tile, length, "amin")
        touched = touched | (summary[None, :] <= ql if spec.causal else summary[None, :] < length)
        # ... and its other keys (neither summary nor global columns) are none, or all in the rows' own block.
        off_summary = ~is_summary_column(order, spec) & ~is_global
        off_first = _per_tile(torch.where(off_summary, position, length), kv_tile, length, "amin")[None, :]
        off_last = _per_tile(torch.where(off_summary, position, -1), kv_tile, -1, "amax")[None, :]
        covered = off_first == length
        if "block" in kinds:
            covered = covered | (one_segment & (off_first >= seg_start[own]) & (off_last <= seg_end[own]))
    if spec.causal:
        covered = covered & (y <= a)
    complete = (qs + q_tile <= length) & (ks + kv_tile <= length)
    full = complete & ((a == length) | (x == length) | covered)
    touched = touched | global_row | global_col | full
    return touched, full


@dataclass(frozen=True)
class FlexPattern:
    """The cached FlexAttention form of one layer's pattern at one length.

    Args:
        block_mask (`BlockMask`): the pattern's tiles, full and partial, for batches without padding.
        padded_tiles (`BlockMask`): the same tiles all partial, whose `mask_mod` is replaced per batch by one that
            reads the key validity.
        permutation ([`PositionPermutation`], *optional*): the heads' orders (class-major for residue heads), `None`
            when every head runs in token order.
        group_of_head (`torch.LongTensor` of shape `(H,)`, *optional*): index of every head's sub-patterns among the
            layer's distinct ones, `None` when all heads share them.
        head_kinds (`tuple`): the sub-patterns of every head.
        spec ([`PatternSpec`]): the pattern.
    """

    block_mask: BlockMask
    padded_tiles: BlockMask
    permutation: PositionPermutation | None
    group_of_head: Tensor | None
    head_kinds: tuple[tuple[str, ...], ...]
    spec: PatternSpec

    def mask_mod(self, key_valid: Tensor | None) -> MaskMod:
        """The pair rule of the partial tiles, reading `key_valid` `(B, N)` when given."""
        table = None if self.permutation is None else self.permutation.table
        return pattern_mask_mod(self.head_kinds, self.spec, table, self.group_of_head, key_valid)


def pattern_mask_mod(
    head_kinds: tuple[tuple[str, ...], ...],
    spec: PatternSpec,
    table: Tensor | None,
    group_of_head: Tensor | None,
    key_valid: Tensor | None,
) -> MaskMod:
    """`mask_mod(b, h, q, kv)` of a layer: head `h`'s sub-patterns or a global column; every key for a real global
    query; and only real keys (`key_valid`). `q` and `kv` are positions in the head's order, mapped back to token
    positions by `table` `(H, N)` (`None`: token order)."""
    groups = list(dict.fromkeys(head_kinds))
    g = spec.num_global

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        i, j = (q_idx, kv_idx) if table is None else (table[h, q_idx], table[h, kv_idx])
        keep = None
        for index, kinds in enumerate(groups):
            rule = None
            for kind in kinds:
                term = sub_pattern(kind, i, j, spec)
                rule = term if rule is None else rule | term
            if group_of_head is not None:
                rule = rule & (group_of_head[h] == index)
            keep = rule if keep is None else keep | rule
        if g:
            global_row = i < g
            if key_valid is not None:
                global_row = global_row & key_valid[b, i]
            keep = keep | (j < g) | global_row
        if key_valid is not None:
            keep = keep & key_valid[b, j]
        return keep

    return mask_mod


@device_cache
def flex_pattern(
    head_kinds: tuple[tuple[str, ...], ...],
    length: int,
    spec: PatternSpec,
    device: torch.device,
    block_size: tuple[int, int] = FLEX_BLOCK_SIZE,
) -> FlexPattern:
    """The layer's [`FlexPattern`] at `length`, built once on `device`."""
    q_tile, kv_tile = block_size
    token = torch.arange(length, device=device)
    orders, tiles = {}, {}
    for kinds in dict.fromkeys(head_kinds):
        orders[kinds] = class_major_order(length, spec.stride, device) if kinds == ("residue",) else token
        tiles[kinds] = classify_tiles(kinds, orders[kinds], spec, q_tile, kv_tile)
    touched_h = torch.stack([tiles[kinds][0] for kinds in head_kinds])  # (H, Q tiles, K tiles)
    full_h = torch.stack([tiles[kinds][1] for kinds in head_kinds])
    table = None
    if any(kinds == ("residue",) for kinds in head_kinds):
        table = torch.stack([orders[kinds] for kinds in head_kinds])
    groups = list(orders)
    group_of_head = filled_table([groups.index(kinds) for kinds in head_kinds], device) if len(groups) > 1 else None
    structure = pattern_mask_mod(head_kinds, spec, table, group_of_head, None)
    kwargs = {"q_block": q_tile, "kv_block": kv_tile, "seq_lengths": (length, length), "mask_mod": structure}
    return FlexPattern(
        block_mask=block_mask_from_tiles(touched_h & ~full_h, full_h, **kwargs),
        padded_tiles=block_mask_from_tiles(touched_h, None, **kwargs),
        permutation=None if table is None else PositionPermutation(table),
        group_of_head=group_of_head,
        head_kinds=head_kinds,
        spec=spec,
    )


def flex_pattern_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_valid: Tensor | None,
    head_kinds: tuple[tuple[str, ...], ...],
    spec: PatternSpec,
    scale: float,
    block_size: tuple[int, int] = FLEX_BLOCK_SIZE,
    *,
    dropout_p: float = 0.0,
    keep_seed: Tensor | None = None,
) -> Tensor:
    """The layer's pattern attention, global rows included, in one FlexAttention call (two with attention dropout,
    see [`~attnzoo.kernels.flex.flex_block_attention`]); `(B, H, N, d)` in and out.

    Args:
        q, k, v (`torch.Tensor` of shape `(B, H, N, d)`): queries, keys and values.
        key_valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real keys; `None` means all real.
        head_kinds (`tuple`): the sub-patterns of every head (all in [`FLEX_KINDS`]).
        spec ([`PatternSpec`]): the pattern.
        scale (`float`): logit scale.
        block_size (`tuple[int, int]`, *optional*): query and key tile (multiples of the kernel's tiles).
        dropout_p (`float`, *optional*, defaults to 0.0): attention dropout, with `keep_seed`.
        keep_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the dropout mask, whose decisions
            are hashed at each head's positions in its own order (class-major for residue heads): a permutation of
            independent decisions, so the same law.
    """
    layout = flex_pattern(head_kinds, q.shape[2], spec, q.device, block_size)
    block_mask = layout.block_mask
    if key_valid is not None:
        block_mask = with_mask_mod(layout.padded_tiles, layout.mask_mod(key_valid))
    if layout.permutation is not None:
        q, k, v = (layout.permutation.apply(x) for x in (q, k, v))
    out = flex_block_attention(q, k, v, block_mask, scale=scale, dropout_p=dropout_p, keep_seed=keep_seed)
    return out if layout.permutation is None else layout.permutation.undo(out)

"""fastRG sampling of SBM graphs (Rohe et al., "A note on quickly sampling a sparse matrix with low rank
expectation") as a fixed-size, row-sorted edge list that the device builds without telling the host its size.

The law is fastRG's: the number of times a pair `(i, j)` is drawn is Poisson(`p_ij`), independently over the pairs,
with `p = Q̂ Ŝ K̂ᵀ`; exploration adds Poisson(`δ`) draws of every pair of real positions; repeated draws of a pair
are one edge, so a pair is present with probability `1 - exp(-(p_ij + δ))`. Per head `(b, h)`:

- Poisson(`Σ_ij p_ij`) fastRG draws, each picking query row `i` ∝ its rate `r_i = Σ_v (Q̂_i Ŝ)_v z_v` (with
  `z = Σ_j K̂_j`), then cluster `v` ∝ `(Q̂_i Ŝ)_v z_v`, then key `j` ∝ `K̂_jv` (so pair `(i, j)` is drawn at rate
  `Σ_v (Q̂_i Ŝ)_v K̂_jv = p_ij`);
- Poisson(`δ n_q n_k`) exploration draws of a uniform pair of real positions;
- draws of a future key in causal attention are dropped (thinning a Poisson process keeps it Poisson).

Only the per-head totals come from a generator (a fixed number of draws, so an example's graph does not depend on
the padding of its batch); every other random number is a hash of a per-call seed and the draw's position
(head-major), so the graph does not depend on how many slots were reserved for it. Categorical draws use inverse
CDFs over integer cumulative sums (each row's weights quantised to 2^30 units: no float64, and no rounding error
accumulates along the sum). Repeated pairs are merged by one sort of the pair ids (int32 when they are below
2^32, stored less 2^31); the repeats stay in the list, after their first copy, and attend with weight 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..kernels.constants import scalar
from ..kernels.csr import row_pointers
from ..kernels.hashing import _GOLDEN, mix_bits_

#: seed offset of the exploration draws' stream (odd, below 2**62 so that seed + offset stays an int64)
_EXPLORATION_STREAM = 0x2545F4914F6CDD1D
_LOW31 = (1 << 31) - 1
#: each row's weights are quantised to this many units for the inverse CDF
_CDF_UNITS = float(1 << 30)
#: pair ids below this sort as int32, stored less `_INT32_OFFSET` so that the signed range holds every id below
#: 2^32 in order; the largest int32 (id 2^32 - 1) marks padding. At batch 1, 12 heads and 16,384 tokens the ids go to
#: about 3.2e9: int32 keys take half the radix passes of int64 keys and 3/4 of the bytes a pass (with the sort's
#: int64 positions), 1.5x faster on one CPU core at 12 M ids.
_INT32_PAIRS = 1 << 32
_INT32_OFFSET = 1 << 31
_INT32_MAX = (1 << 31) - 1
_INT64_SENTINEL = (1 << 63) - 1


@dataclass(frozen=True)
class FastRGDraws:
    """What a call of [`fastrg_edges`] takes from a generator and decides on the host; every other random number is
    a hash of `seed`, so the same draws and memberships give the same graph, bit for bit (SBM samples its graph again
    in backward from these instead of keeping the edge list).

    Attributes:
        cumulative (`torch.DoubleTensor` of shape `(2, 2, B*H)`): the expected and the Poisson numbers of fastRG
            and of exploration draws of every head, cumulated over the heads (`[kind, (expected, drawn), head]`).
        seed (`torch.LongTensor` of shape `()`): the hash seed of the call.
        fastrg_slots / exploration_slots (`int`): slots reserved for each kind of draw.
    """

    cumulative: Tensor
    seed: Tensor
    fastrg_slots: int
    exploration_slots: int


@dataclass
class FastRGGraph:
    """A sampled graph of every `(batch, head)`: a row-sorted edge list of a size the host chose in advance.

    Edge `e` joins flat query row `rows[e] = (b*H + h)*n + i` to flat key row `cols[e] = (b*H + h)*m + j`. Padding
    edges (slots no draw filled, dropped draws) come last, with `rows = num_rows` and `cols = 0`; a pair drawn
    several times is listed as often, its first copy first.

    Args:
        rows (`torch.LongTensor` of shape `(E,)`): query row of each edge, non-decreasing (int32 from the Triton
            sampler when the pair ids are int32, as `cols`).
        cols (`torch.LongTensor` of shape `(E,)`): key row of each edge.
        sampled (`torch.BoolTensor` of shape `(E,)`): the first copy of a drawn pair (fastRG or exploration); the
            other attended edges are structural only (self loops, window, global columns).
        duplicate (`torch.BoolTensor` of shape `(E,)`): a later copy of a pair (attends with weight 0).
        attended (`torch.BoolTensor` of shape `(E,)`): the first copy of a pair (not padding, not a duplicate).
        crow (`torch.LongTensor` of shape `(num_rows + 1,)`): row pointers (`crow[r]`: edges of rows below `r`).
        head_counts (`torch.IntTensor` of shape `(B * H, 2)`): the sampled and the attended edges of each head
            (int64 when the pair ids are).
        num_rows (`int`): number of query rows `B * H * n` (the row index of padding).
        draws ([`FastRGDraws`]): the call's random numbers that came from a generator (given back to
            [`fastrg_edges`], they make the same graph again).
    """

    rows: Tensor
    cols: Tensor
    sampled: Tensor
    duplicate: Tensor
    attended: Tensor
    crow: Tensor
    head_counts: Tensor
    num_rows: int
    draws: FastRGDraws

    @property
    def totals(self) -> Tensor:
        """The expected and the drawn numbers of fastRG draws, then of exploration draws, `(2, 2)` float64 (more
        fastRG draws than `slots` means some were dropped)."""
        return self.draws.cumulative[..., -1]

    @property
    def slots(self) -> int:
        """Slots reserved for the fastRG draws."""
        return self.draws.fastrg_slots

    @property
    def seed(self) -> Tensor:
        """The hash seed of the call, `()` int64 (also the edges' attention-dropout mask's,
        `attnzoo.kernels.hashing.position_keep`)."""
        return self.draws.seed

    @property
    def expected(self) -> Tensor:
        """The expected number of fastRG draws (exploration excluded), a `()` tensor."""
        return self.totals[0, 0]

    @property
    def drawn(self) -> Tensor:
        """The number of fastRG draws made, a `()` tensor (float64, an exact integer)."""
        return self.totals[0, 1]


def poisson_slots(mean: float) -> int:
    """Slots that hold a Poisson(`mean`) count but with probability below about 1e-13 (mean + 8 standard deviations
    + 24: the Chernoff bound of the excess is under e^-30 for every mean)."""
    return math.ceil(mean + 8.0 * math.sqrt(mean) + 24.0)


def slot_bits(seed: Tensor, num_slots: int, stream: int) -> Tensor:
    """64 hashed bits for each draw position `0 .. num_slots - 1`, `(num_slots,)` int64 (a splitmix-style hash of
    `seed + stream offset + position * golden`, so a position's bits do not depend on `num_slots`)."""
    x = torch.arange(num_slots, device=seed.device, dtype=torch.int64).mul_(_GOLDEN)
    x.add_(seed + stream * _EXPLORATION_STREAM)
    return mix_bits_(x, torch.empty_like(x))


def draw_categorical(weights: Tensor, which: Tensor, bits31: Tensor, total: Tensor | None = None) -> Tensor:
    """For every entry of `which`, a column of row `which[e]` of `weights` drawn with probability ∝ its weight.

    Each row's weights are quantised to `2^30` units in total and summed in int64, so a weight is kept to 1e-9 of
    its row's total with no rounding error along the sum; the global search key `row << 32 | partial sum` keeps the
    rows apart in one `searchsorted`.

    Args:
        weights (`torch.Tensor` of shape `(T, L)`): non-negative weights.
        which (`torch.LongTensor` of shape `(E,)`): row of each draw (a row without weight gives column `L - 1`;
            callers never draw from such a row).
        bits31 (`torch.LongTensor` of shape `(E,)`): uniform integers in `[0, 2^31)`.
        total (`torch.Tensor` with `T` elements, *optional*): each row's total weight (its sum when `None`); the
            Triton sampler reads the same totals, so that both quantise every weight alike.

    Returns:
        `torch.LongTensor` of shape `(E,)` with values in `[0, L)`.
    """
    num_rows, length = weights.shape
    weights = weights.contiguous()  # the global search runs over the flat rows
    total = weights.sum(-1, keepdim=True) if total is None else total.reshape(num_rows, 1).to(weights.dtype)
    total = total.clamp_min(torch.finfo(weights.dtype).tiny)
    cum = (weights / total).mul_(_CDF_UNITS).floor_().to(torch.int64).cumsum_(-1)  # (T, L), last column <= 2^30
    base = torch.arange(num_rows, device=weights.device, dtype=torch.int64).bitwise_left_shift_(32)
    units = cum[:, -1].index_select(0, which)  # (E,) the row's total
    cum.add_(base[:, None])
    target = (bits31 * units).bitwise_right_shift_(31).add_(base.index_select(0, which))  # < 2^62 before the shift
    flat = torch.searchsorted(cum.view(-1), target, right=True)
    return flat.sub_(which * length).clamp_(max=length - 1)


def _slot_heads(ends: Tensor, num_slots: int) -> tuple[Tensor, Tensor]:
    """Owner of each slot when head `(b, h)` owns the slots from `ends[b*H + h - 1]` to `ends[b*H + h]` (cumulative
    draw counts, fp64 holding integers): `(bh, live)`, `(num_slots,)` each; slots past the last draw (and draws
    past the slots) get `live = False` and the last head."""
    slots = torch.arange(num_slots, device=ends.device, dtype=torch.int64)
    bh = torch.searchsorted(ends.to(torch.int64), slots, right=True)
    live = bh < ends.shape[0]
    return bh.clamp_(max=ends.shape[0] - 1), live


@dataclass
class SamplerInputs:
    """What both implementations of the draws read (the Triton kernel's tables are built from these same tensors,
    so that both quantise every weight alike).

    Attributes:
        weights (`torch.Tensor` of shape `(B, H, n, k)`): rate of draws of query `i` into cluster `v`,
            `(Q̂ Ŝ)_iv z_v`.
        row_rates (`torch.Tensor` of shape `(B, H, n)`): their sums over `v` (each query row's rate).
        rates (`torch.Tensor` of shape `(B, H)`): the rows' sums (each head's expected number of fastRG draws).
        k_memb (`torch.Tensor` of shape `(B, H, m, k)`): key memberships `K̂`.
        cluster_totals (`torch.Tensor` of shape `(B, H, k)`): `z = Σ_j K̂_j`.
        query_counts / key_counts (`torch.Tensor` of shape `(B, 1)` or `None`): real positions per sequence (`None`:
            no padding).
    """

    weights: Tensor
    row_rates: Tensor
    rates: Tensor
    k_memb: Tensor
    cluster_totals: Tensor
    query_counts: Tensor | None
    key_counts: Tensor | None


def sampler_inputs(
    q_memb: Tensor,
    k_memb: Tensor,
    blocks: Tensor,
    query_valid: Tensor | None,
    key_valid: Tensor | None,
    weights_kernel: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
) -> SamplerInputs:
    """The rates of the fastRG draws (module docstring); the sum over `v` of `weights[..., i, :]` is row `i`'s
    expected number of draws `Σ_j p_ij`. `weights_kernel(q_memb, blocks, cluster_totals)`: a fused computation of
    `(weights, row_rates)` (`attnzoo.kernels.triton.memberships.fastrg_weights_triton`), else the torch code."""
    cluster_totals = k_memb.sum(2)  # (B, H, k)
    if weights_kernel is not None:
        weights, row_rates = weights_kernel(q_memb, blocks, cluster_totals)
    else:
        weights = (q_memb @ blocks) * cluster_totals[:, :, None, :]  # (B, H, n, k)
        row_rates = weights.sum(-1)  # (B, H, n)
    return SamplerInputs(
        weights=weights,
        row_rates=row_rates,
        rates=row_rates.sum(-1),
        k_memb=k_memb,
        cluster_totals=cluster_totals,
        query_counts=None if query_valid is None else query_valid.sum(-1, keepdim=True),
        key_counts=None if key_valid is None else key_valid.sum(-1, keepdim=True),
    )


def fastrg_weights(q_memb: Tensor, k_memb: Tensor, blocks: Tensor) -> Tensor:
    """Rate of fastRG draws of every query row into every cluster, `(Q̂ Ŝ)_iv z_v`: `(B, H, n, k)` (its sum over
    `v` is the row's expected number of draws `Σ_j p_ij`)."""
    return sampler_inputs(q_memb, k_memb, blocks, None, None).weights


def _draw_totals(
    inputs: SamplerInputs, delta: float, n: int, m: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Expected and Poisson numbers of fastRG and of exploration draws of every head, cumulated over the heads:
    `(2, 2, B*H)` float64, `[kind, (expected, drawn)]`. Exploration draws Poisson(`δ`) times each pair of real
    positions."""
    rates = inputs.rates  # (B, H)
    if inputs.query_counts is None and inputs.key_counts is None:
        explore = scalar(delta * n * m, rates.dtype, rates.device).expand_as(rates)  # made once per length
    else:
        queries = n if inputs.query_counts is None else inputs.query_counts  # (B, 1)
        keys = m if inputs.key_counts is None else inputs.key_counts
        explore = (delta * queries * keys).expand_as(rates)  # (B, H)
    # Two numbers per head in fp64, which keeps counts above 2^24 exact (fp32 Poisson draws of such means are
    # rounded), written where the cumulative sum reads them: `[(expected, drawn), kind, head]`.
    both = torch.empty(2, 2, rates.numel(), dtype=torch.float64, device=rates.device)
    torch.stack([rates, explore], out=both[0].view(2, *rates.shape))  # cast to fp64 as it is written
    both[1].copy_(torch.poisson(both[0], generator=generator))
    # One cumulative sum over the heads gives the slot range of every head and, in its last column, the totals
    # (exact integers below 2^53 for the draws).
    return both.cumsum_(-1).transpose(0, 1)  # (2, 2, B*H)


def _uniform_position(
    valid: Tensor | None, total: Tensor | None, batch: Tensor, bits31: Tensor, length: int
) -> Tensor:
    """A uniform real position of sequence `batch[e]` for each draw (`valid` `(B, L)` with `total` real positions
    each, `None`: all are real); it does not depend on the padding after the real positions."""
    if valid is None:
        return (bits31 * length).bitwise_right_shift_(31)
    return draw_categorical(valid.float(), batch, bits31, total)


def _fastrg_draws(inputs: SamplerInputs, ends: Tensor, num_slots: int, seed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The fastRG draws in `num_slots` slots: `(row, key, live)`, `(num_slots,)` each, `row = (b*H + h)*n + i`.

    Each draw of head `(b, h)` picks row `i` ∝ its rate, cluster `v` ∝ `(Q̂_i Ŝ)_v z_v`, key `j` ∝ `K̂_jv`."""
    B, H, n, k = inputs.weights.shape
    m = inputs.k_memb.shape[2]
    bh, live = _slot_heads(ends, num_slots)
    bits = slot_bits(seed, num_slots, 0)
    row = draw_categorical(inputs.row_rates.reshape(B * H, n), bh, bits & _LOW31, inputs.rates)
    row.add_(bh * n)
    high = bits.bitwise_right_shift_(32).bitwise_and_(_LOW31)
    cluster = draw_categorical(inputs.weights.reshape(B * H * n, k), row, high, inputs.row_rates)
    keys = inputs.k_memb.transpose(2, 3).reshape(B * H * k, m)  # (B*H*k, m): each cluster's key weights
    key_bits = slot_bits(seed, num_slots, 3).bitwise_and_(_LOW31)
    key = draw_categorical(keys, bh.mul_(k).add_(cluster), key_bits, inputs.cluster_totals)
    return row, key, live


def _exploration_draws(
    inputs: SamplerInputs, ends: Tensor, num_slots: int, seed: Tensor, query_valid, key_valid
) -> tuple[Tensor, Tensor, Tensor]:
    """The exploration draws in `num_slots` slots: `(row, key, live)`, a uniform pair of real positions each."""
    _, H, n, _ = inputs.weights.shape
    m = inputs.k_memb.shape[2]
    bh, live = _slot_heads(ends, num_slots)
    bits = slot_bits(seed, num_slots, 1)
    batch = bh // H
    i = _uniform_position(query_valid, inputs.query_counts, batch, bits & _LOW31, n)
    high = bits.bitwise_right_shift_(32).bitwise_and_(_LOW31)
    key = _uniform_position(key_valid, inputs.key_counts, batch, high, m)
    return bh.mul_(n).add_(i), key, live


def fastrg_multigraph(
    q_memb: Tensor, k_memb: Tensor, blocks: Tensor, generator: torch.Generator | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The fastRG draws alone (no exploration, no merging): `(owner, i, j)`, `(E,)` each, the flat `(b*H + h)`
    index, query and key of every draw. Pair counts are independent Poisson(`p_ij`)."""
    n, m = q_memb.shape[2], k_memb.shape[2]
    inputs = sampler_inputs(q_memb, k_memb, blocks, None, None)
    cumulative = _draw_totals(inputs, 0.0, n, m, generator)
    seed = torch.randint(0, 1 << 62, (), device=q_memb.device, generator=generator)
    row, key, live = _fastrg_draws(inputs, cumulative[0, 1], int(cumulative[0, 1, -1]), seed)
    row, key = row[live], key[live]
    return row // n, row % n, key


@dataclass(frozen=True)
class StructuralPairs:
    """Pairs attended without sampling (self loops, the sliding window, global columns): query `i` and key `j` on a
    diagonal `j - i - query_offset` in `[first, first + diagonals)`, and every key `j < columns`; only real pairs
    (inside the sequence, real positions, no future key in causal attention).

    Attributes:
        first (`int`): the first diagonal.
        diagonals (`int`): the number of diagonals.
        columns (`int`): the number of global columns.
    """

    first: int
    diagonals: int
    columns: int


def structural_pair_ids(
    pairs: StructuralPairs,
    shape: tuple[int, int, int, int],
    query_offset: int,
    causal: bool,
    query_valid: Tensor | None,
    key_valid: Tensor | None,
    device: torch.device,
) -> Tensor:
    """Linear pair ids `((b*H + h)*n + i)*m + j` of the structural pairs, `(B, H, n, T)` (`T` = diagonals +
    columns) with `-1` where a slot holds no pair (a fixed size: no compaction on the device). The Triton sampler
    computes the same ids in its kernel."""
    B, H, n, m = shape
    i = torch.arange(n, device=device)[:, None]
    # The diagonals are one range: made on the device, not copied from the host.
    diagonals = torch.arange(pairs.first, pairs.first + pairs.diagonals, device=device)
    j = i + query_offset + diagonals[None]  # (n, D)
    if pairs.columns:
        # The global columns (a pair that is also on a diagonal is merged by the sampler's sort).
        j = torch.cat([j, torch.arange(pairs.columns, device=device)[None].expand(n, -1)], dim=-1)  # (n, T)
    ok = (j >= 0) & (j < m)
    if causal:
        ok &= j <= i + query_offset
    ok = ok[None].expand(B, -1, -1)
    jc = j.clamp(0, m - 1)
    if key_valid is not None:
        ok = ok & key_valid[:, jc]
    if query_valid is not None:
        ok = ok & query_valid[:, :, None]
    bh = torch.arange(B * H, device=device).view(B, H, 1, 1)
    ids = (bh * n + i[None, None]) * m + jc[None, None]  # (B, H, n, T)
    return torch.where(ok[:, None], ids, -1)


@dataclass
class PairIdRequest:
    """One call's draws, as the two implementations of the pair ids take them.

    Attributes:
        ends (`torch.DoubleTensor` of shape `(2, B*H)`): cumulative fastRG and exploration draws over the heads
            (integers; head `b*H + h` owns the slots from `ends[:, b*H + h - 1]` to `ends[:, b*H + h]`).
        seed (`torch.LongTensor` of shape `()`): the hash seed.
        fastrg_slots / exploration_slots (`int`): slots of each kind.
        query_valid / key_valid (`torch.BoolTensor`, *optional*): real positions.
        causal (`bool`), query_offset (`int`): causal thinning.
        structural ([`StructuralPairs`] or `torch.LongTensor`, *optional*): the structural pairs, or their ids
            (`-1` for none).
        sentinel (`int`), dtype (`torch.dtype`): the empty slots' stored id and the ids' dtype.
        offset (`int`): subtracted from every pair id as it is stored (`_INT32_OFFSET` for int32 ids, else 0).
    """

    ends: Tensor
    seed: Tensor
    fastrg_slots: int
    exploration_slots: int
    query_valid: Tensor | None
    key_valid: Tensor | None
    causal: bool
    query_offset: int
    structural: StructuralPairs | Tensor | None
    sentinel: int
    dtype: torch.dtype
    offset: int


def int32_pairs(num_rows: int, n: int, m: int) -> bool:
    """Whether the pair ids of `num_rows` query rows (`n` a head) by `m` keys sort as int32: every id and the
    padding's stored less `_INT32_OFFSET`, and every row and flat key column `(b*H + h)*m + j` an int32."""
    return num_rows * m < _INT32_PAIRS and max(num_rows, num_rows // n * m) < _INT32_MAX


def pair_ids(inputs: SamplerInputs, request: PairIdRequest) -> Tensor:
    """The padded, unsorted pair ids `((b*H + h)*n + i)*m + j` of the fastRG slots, the exploration slots and the
    structural pairs, in that order, less `request.offset`, `request.sentinel` where a slot holds no pair (the
    torch reference of the Triton sampler `fastrg_pair_ids_triton`)."""
    _, _, n, _ = inputs.weights.shape
    m = inputs.k_memb.shape[2]
    r = request
    row, key, live = _fastrg_draws(inputs, r.ends[0], r.fastrg_slots, r.seed)
    if r.exploration_slots:
        row_e, key_e, live_e = _exploration_draws(
            inputs, r.ends[1], r.exploration_slots, r.seed, r.query_valid, r.key_valid
        )
        row, key, live = torch.cat([row, row_e]), torch.cat([key, key_e]), torch.cat([live, live_e])
    if r.causal:
        live &= key <= row % n + r.query_offset
    ids = row.mul_(m).add_(key)  # pair id ((b*H + h)*n + i)*m + j
    structural = r.structural
    if isinstance(structural, StructuralPairs):
        B, H = inputs.rates.shape
        shape = (B, H, n, m)
        structural = structural_pair_ids(
            structural, shape, r.query_offset, r.causal, r.query_valid, r.key_valid, ids.device
        )
    if structural is not None:
        ids = torch.cat([ids, structural.reshape(-1)])
        live = torch.cat([live, structural.reshape(-1) >= 0])
    return torch.where(live, ids - r.offset, r.sentinel).to(r.dtype)


def edges_from_sorted_ids(
    ids: Tensor, order: Tensor, *, num_drawn: int, n: int, m: int, num_rows: int, sentinel: int, offset: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The edge list of stably sorted pair ids: `(rows, cols, sampled, duplicate, attended, crow, head_counts)`
    (see [`FastRGGraph`]; `order` is each id's position before the sort, the draws' below `num_drawn`; the ids are
    stored less `offset`, `sentinel` for padding). The torch reference of `fastrg_edge_list_triton`."""
    real = ids != sentinel
    first = torch.ones_like(real)
    first[1:] = ids[1:] != ids[:-1]
    attended = first & real
    sampled = attended & (order < num_drawn)
    wide = ids.to(torch.int64) + offset  # padding's id is past every real one: its row is clamped to `num_rows`
    rows = (wide // m).clamp_(max=num_rows)
    cols = torch.where(real, (rows // n) * m + wide % m, 0)
    # Padding's head is the one past the last: counted there, then left out.
    flags = torch.stack([sampled, attended], -1).to(ids.dtype)  # (E, 2)
    head_counts = flags.new_zeros(num_rows // n + 1, 2).index_add_(0, rows // n, flags)[:-1]
    return rows, cols, sampled, real & ~first, attended, row_pointers(rows, num_rows), head_counts


class FastRGKernels(NamedTuple):
    """A fast implementation of the sampler's two steps around its sort (the kernel dispatch's Triton sampler):
    `pair_ids(inputs_as_keywords...)` and `edge_list(ids, order, ...)`, with the signatures of
    `attnzoo.kernels.triton.fastrg`'s `fastrg_pair_ids_triton` and `fastrg_edge_list_triton`."""

    pair_ids: Callable[..., Tensor]
    edge_list: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]]


def fastrg_edges(
    q_memb: Tensor,
    k_memb: Tensor,
    blocks: Tensor,
    *,
    delta: float,
    query_valid: Tensor | None,
    key_valid: Tensor | None,
    causal: bool,
    query_offset: int,
    structural: StructuralPairs | Tensor | None,
    generator: torch.Generator | None,
    reserve: Callable[[Tensor], int] | None = None,
    kernels: FastRGKernels | None = None,
    weights_kernel: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
    draws: FastRGDraws | None = None,
) -> FastRGGraph:
    """Sample the SBM graph of every `(batch, head)` with fastRG, as a fixed-size edge list (module docstring).

    Padded rows of `q_memb` / `k_memb` must be zero (they draw, and are drawn, nothing).

    Args:
        q_memb (`torch.Tensor` of shape `(B, H, n, k)`): query memberships.
        k_memb (`torch.Tensor` of shape `(B, H, m, k)`): key memberships.
        blocks (`torch.Tensor` of shape `(H, k, k)`): block matrix Ŝ of each head (sums to 1).
        delta (`float`): exploration rate `δ` per pair.
        query_valid / key_valid (`torch.BoolTensor` of shape `(B, n)` / `(B, m)`, *optional*): real positions.
        causal (`bool`): drop draws of future keys; query `i` sits at key position `i + query_offset`.
        structural ([`StructuralPairs`] or `torch.LongTensor`, *optional*): pairs always attended (self loops,
            window, global columns), or their linear pair ids `((b*H + h)*n + i)*m + j` (`-1` for none); they carry
            no probability gradient.
        generator (`torch.Generator`, *optional*): RNG (eval); the global RNG when `None` (training).
        reserve (`callable`, *optional*): given the expected number of fastRG draws (a device scalar), the number of
            slots to reserve for them, which the host must know without reading the device (see
            [`~attnzoo.sbm.budget.EdgeBudget`]); draws past the slots are dropped and counted in `drawn`. `None`
            reserves exactly what was drawn (a host read of the count: free on CPU).
        kernels ([`FastRGKernels`], *optional*): the fused sampler (`attnzoo.kernels.dispatch.fastrg_kernels`);
            `None` runs the torch reference. Both give the same graph, bit for bit.
        weights_kernel (`callable`, *optional*): the fused rates of the draws ([`sampler_inputs`]); chosen with the
            attention backend, not with `kernels`, so that both samplers read the same rates.
        draws ([`FastRGDraws`], *optional*): an earlier call's `graph.draws`: that call's graph again (with the
            same memberships and arguments), no generator draw and no `reserve`.

    Returns:
        [`FastRGGraph`].
    """
    B, H, n, _ = q_memb.shape
    m = k_memb.shape[2]
    num_rows = B * H * n
    inputs = sampler_inputs(q_memb, k_memb, blocks, query_valid, key_valid, weights_kernel)
    if draws is None:
        draws = _draw(inputs, delta, generator, reserve)
    # The sort merges repeated pairs (int32 ids when they fit); the largest id of the dtype marks an empty slot.
    small = int32_pairs(num_rows, n, m)
    request = PairIdRequest(
        ends=draws.cumulative[:, 1], seed=draws.seed, fastrg_slots=draws.fastrg_slots,
        exploration_slots=draws.exploration_slots,
        query_valid=query_valid, key_valid=key_valid, causal=causal, query_offset=query_offset,
        structural=structural, sentinel=_INT32_MAX if small else _INT64_SENTINEL,
        dtype=torch.int32 if small else torch.int64, offset=_INT32_OFFSET if small else 0,
    )  # fmt: skip
    ids = pair_ids(inputs, request) if kernels is None else kernels.pair_ids(**vars(inputs), **vars(request))
    # Being stable, the sort lists a drawn copy of a pair before a structural one.
    ids, order = torch.sort(ids, stable=True)
    edge_list = edges_from_sorted_ids if kernels is None else kernels.edge_list
    num_drawn = draws.fastrg_slots + draws.exploration_slots
    rows, cols, sampled, duplicate, attended, crow, head_counts = edge_list(
        ids, order, num_drawn=num_drawn, n=n, m=m, num_rows=num_rows, sentinel=request.sentinel, offset=request.offset
    )
    return FastRGGraph(
        rows=rows,
        cols=cols,
        sampled=sampled,
        duplicate=duplicate,
        attended=attended,
        crow=crow,
        head_counts=head_counts,
        num_rows=num_rows,
        draws=draws,
    )


def _draw(
    inputs: SamplerInputs, delta: float, generator: torch.Generator | None, reserve: Callable[[Tensor], int] | None
) -> FastRGDraws:
    """The generator's draws of one call of [`fastrg_edges`] and the slots reserved for them."""
    B, H, n, _ = inputs.weights.shape
    m = inputs.k_memb.shape[2]
    num_rows = B * H * n
    cumulative = _draw_totals(inputs, delta, n, m, generator)  # (2, 2, B*H)
    totals = cumulative[..., -1]  # (2, 2): expected and drawn, of fastRG and of exploration draws
    fastrg_slots = int(totals[0, 1]) if reserve is None else reserve(totals[0, 0])
    # The exploration rate is at most δ per pair, known on the host: its slots hold the count but with a negligible
    # probability.
    exploration_slots = poisson_slots(delta * m * num_rows) if delta > 0 else 0
    seed = torch.randint(0, 1 << 62, (), device=inputs.weights.device, generator=generator)
    return FastRGDraws(cumulative, seed, fastrg_slots, exploration_slots)

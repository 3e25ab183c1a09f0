"""Triton fastRG sampler (SBM): the padded pair ids of a fastRG graph in two launches, and its edge list in one more.

The law and the random numbers are those of the torch sampler (`attnzoo.sbm.fastrg`, the reference): every draw's
bits are the same counter hash of `(seed, stream, slot)` in int64 (wrapping products, logical shifts as masked
arithmetic ones), and every categorical draw is the same inverse CDF over integer cumulative sums of weights
quantised to `2^30` units per row (`floor(w / total * 2^30)`, the totals computed once by the caller and read by both
implementations), so the two give the same ids bit for bit: integer ops and one correctly rounded fp32 division.

1. [`_cumulative_units`] (one launch): the int32 cumulative sums of the categorical tables, a block of table rows
   per program: rows of each head ∝ their rate, clusters of each row ∝ `(Q̂_i Ŝ)_v z_v`, keys of each (head,
   cluster) ∝ `K̂_jv` (read in place from `K̂`, no transposed copy), and the real positions of each sequence when
   some are padding. int32 holds them (a row sums to at most about `2^30`), half the bytes of the reference's int64.
2. [`_draw_pair_ids`] (one launch): one lane per slot (fastRG slots, then exploration slots, then the structural
   pairs): the slot's head by a binary search of the cumulative draw counts, its hashed bits, its query, cluster
   and key by binary searches of the tables, causal thinning, and the pair id `((b*H + h)*n + i)*m + j`, stored
   less an offset (`2^31` for int32 ids, so that they reach `2^32`; the largest id of the dtype where the slot holds
   no pair).
3. After one stable sort of the ids (torch), [`_edge_list`] (one launch) writes the edge list: rows, columns and the
   sampled / duplicate / attended flags of every edge, comparing each id with the one before it, the sampled and
   attended edges of each head (a block's sum per head, added atomically: a head's edges are contiguous, so a block
   adds to one head, two at a head's end), and the row pointers (a binary search of the sorted ids per row).
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl
from torch import Tensor

from .hashing import GOLDEN, mix

# Must equal `attnzoo.sbm.fastrg` (`_EXPLORATION_STREAM`, `_CDF_UNITS`); a test compares them (and the hash's own
# constants, `hashing.py`, with `attnzoo.kernels.hashing`'s).
EXPLORATION_STREAM = 0x2545F4914F6CDD1D
CDF_UNITS = float(1 << 30)
_GOLDEN = tl.constexpr(GOLDEN)
_STREAM = tl.constexpr(EXPLORATION_STREAM)
#: the key draws' stream (3 * the exploration offset, below 2**63)
_KEY_STREAM = tl.constexpr(3 * EXPLORATION_STREAM)
_CDF = tl.constexpr(CDF_UNITS)
_LOW31 = tl.constexpr((1 << 31) - 1)
#: the smallest normal fp32, the reference's floor of a row total
_TINY = tl.constexpr(torch.finfo(torch.float32).tiny)
#: slots per program of the draw and edge-list kernels; entries of a table row per step of the cumulative sums, and
#: entries of a step in all (several rows when theirs are shorter)
BLOCK_SLOTS = 256
BLOCK_TABLE = 128
TABLE_TILE = 4096


@triton.jit
def _table_block(
    W, TOTAL, OUT, block, rows, length, group, stride_group, stride_in_group, stride_entry,
    BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    """Rows `block * BLOCK_R ...` of a cumulative table: `OUT[r, j] = Σ_{l <= j} floor(W[r, l] / max(TOTAL[r], tiny)
    * 2^30)`, where entry `l` of row `r` sits at `(r // group) * stride_group + (r % group) * stride_in_group + l *
    stride_entry`; `BLOCK_L` entries of `BLOCK_R` rows per step (a row of K̂'s columns reads its neighbours' entries
    in the same step: coalesced)."""
    r = block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    row_ok = r < rows
    total = tl.maximum(tl.load(TOTAL + r, mask=row_ok, other=1).to(tl.float32), _TINY)
    base = (r // group) * stride_group + (r % group) * stride_in_group
    carry = tl.zeros([BLOCK_R], tl.int32)
    for start in range(0, length, BLOCK_L):
        j = start + tl.arange(0, BLOCK_L).to(tl.int64)
        ok = row_ok[:, None] & (j < length)[None, :]
        w = tl.load(W + base[:, None] + j[None, :] * stride_entry, mask=ok, other=0).to(tl.float32)
        # the reference's division is correctly rounded: so is this one (plain `/` is approximate on CUDA)
        units = tl.floor(tl.math.div_rn(w, total[:, None]) * _CDF).to(tl.int32)
        cum = tl.cumsum(units, 1) + carry[:, None]
        tl.store(OUT + r[:, None] * length + j[None, :], cum, mask=ok)
        carry += tl.sum(units, 1)


@triton.jit
def _cumulative_units(
    ROW_W, ROW_TOTAL, ROW_OUT, num_heads_flat, n,
    CLUSTER_W, CLUSTER_TOTAL, CLUSTER_OUT, k,
    KEY_W, KEY_TOTAL, KEY_OUT, m,
    QV_W, QV_TOTAL, QV_OUT, KV_W, KV_TOTAL, KV_OUT, batch,
    cluster_start, key_start, qv_start, kv_start,
    HAS_QV: tl.constexpr, HAS_KV: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
    ROWS_N: tl.constexpr, ROWS_K: tl.constexpr, ROWS_M: tl.constexpr,
):  # fmt: skip
    # program blocks, in order: rows of each head (BH rows of n) | clusters of each query row (BH n rows of k) |
    # keys of each (head, cluster) (BH k rows of m) | real queries (B rows of n), real keys (B rows of m) if padded
    pid = tl.program_id(0).to(tl.int64)
    if pid < cluster_start:
        _table_block(ROW_W, ROW_TOTAL, ROW_OUT, pid, num_heads_flat, n, 1, n, 0, 1, ROWS_N, BLOCK_N)
    elif pid < key_start:
        _table_block(
            CLUSTER_W, CLUSTER_TOTAL, CLUSTER_OUT, pid - cluster_start, num_heads_flat * n, k, 1, k, 0, 1,
            ROWS_K, BLOCK_K,
        )  # fmt: skip
    elif pid < qv_start:
        # K̂ is (BH, m, k): the keys of cluster v of head bh are its column v, read in place
        _table_block(
            KEY_W, KEY_TOTAL, KEY_OUT, pid - key_start, num_heads_flat * k, m, k, m * k, 1, k, ROWS_M, BLOCK_M
        )
    elif pid < kv_start:
        if HAS_QV:
            _table_block(QV_W, QV_TOTAL, QV_OUT, pid - qv_start, batch, n, 1, n, 0, 1, ROWS_N, BLOCK_N)
    else:
        if HAS_KV:
            _table_block(KV_W, KV_TOTAL, KV_OUT, pid - kv_start, batch, m, 1, m, 0, 1, ROWS_M, BLOCK_M)


@triton.jit
def _count_at_most(TABLE, base, length, target, mask, STEPS: tl.constexpr):
    """How many entries of the sorted `TABLE[base : base + length]` are `<= target`, per lane (a binary search of
    `STEPS >= bit_length(length)` steps: `searchsorted(..., right=True)`)."""
    lo = tl.zeros_like(target)
    hi = lo + length
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        value = tl.load(TABLE + base + mid, mask=mask & active, other=0).to(tl.int64)
        below = value <= target
        lo = tl.where(active & below, mid + 1, lo)
        hi = tl.where(active & ~below, mid, hi)
    return lo


@triton.jit
def _draw(TABLE, row, length, bits31, mask, STEPS: tl.constexpr):
    """Inverse-CDF draw of an entry of `row` of a cumulative table `(rows, length)` from uniform 31-bit integers, as
    the reference's `draw_categorical` (a row without weight gives `length - 1`)."""
    base = row * length
    units = tl.load(TABLE + base + length - 1, mask=mask, other=0).to(tl.int64)
    target = (bits31 * units) >> 31
    return tl.minimum(_count_at_most(TABLE, base, length, target, mask, STEPS), length - 1)


@triton.jit
def _draw_pair_ids(
    SEED, ENDS, ends_stride, ROW_CUM, CLUSTER_CUM, KEY_CUM, QV_CUM, KV_CUM, QUERY_VALID, KEY_VALID, STRUCT, OUT,
    num_fastrg, num_exploration, num_struct, num_heads_flat, heads, n, k, m, query_offset, sentinel, id_offset,
    first_diagonal, num_diagonals, num_columns,
    HAS_QV: tl.constexpr, HAS_KV: tl.constexpr, CAUSAL: tl.constexpr, GIVEN: tl.constexpr,
    STEPS_BH: tl.constexpr, STEPS_N: tl.constexpr, STEPS_K: tl.constexpr, STEPS_M: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    slot = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    drawn = num_fastrg + num_exploration
    in_range = slot < drawn + num_struct
    fast = slot < num_fastrg
    explore = (slot >= num_fastrg) & (slot < drawn)
    # The draw's position in its own stream, and the stream's cumulative counts per head (ENDS is (2, BH)).
    position = tl.where(fast, slot, slot - num_fastrg)
    stream_row = tl.where(fast, 0, ends_stride)
    bh = _count_at_most(ENDS, stream_row, num_heads_flat, position, fast | explore, STEPS_BH)
    live = (fast | explore) & (bh < num_heads_flat)
    bh = tl.minimum(bh, num_heads_flat - 1)
    seed = tl.load(SEED)
    bits = mix(seed + tl.where(fast, 0, _STREAM) + position * _GOLDEN)
    low = bits & _LOW31
    high = (bits >> 32) & _LOW31
    # fastRG: query ∝ its rate, cluster ∝ (Q̂_i Ŝ)_v z_v, key ∝ K̂_jv
    i_fast = _draw(ROW_CUM, bh, n, low, fast, STEPS_N)
    cluster = _draw(CLUSTER_CUM, bh * n + i_fast, k, high, fast, STEPS_K)
    key_bits = mix(seed + _KEY_STREAM + position * _GOLDEN) & _LOW31
    j_fast = _draw(KEY_CUM, bh * k + cluster, m, key_bits, fast, STEPS_M)
    # exploration: a uniform real position on each side
    batch = bh // heads
    i_explore = _draw(QV_CUM, batch, n, low, explore, STEPS_N) if HAS_QV else (low * n) >> 31
    j_explore = _draw(KV_CUM, batch, m, high, explore, STEPS_M) if HAS_KV else (high * m) >> 31
    i = tl.where(fast, i_fast, i_explore)
    j = tl.where(fast, j_fast, j_explore)
    if CAUSAL:
        live &= j <= i + query_offset
    ids = (bh * n + i) * m + j
    # structural pairs (self loops, window, global columns), in the reference's (B, H, n, T) order
    struct = in_range & ~(fast | explore)
    place = slot - drawn
    if GIVEN:  # their ids, -1 for none
        pair = tl.load(STRUCT + place, mask=struct, other=-1).to(tl.int64)
        real = pair >= 0
    else:  # diagonals j - i - query_offset in [first, first + D), then the first C keys
        width = num_diagonals + num_columns
        t = place % width
        query_row = place // width  # (b*H + h)*n + i
        i_struct = query_row % n
        b_struct = query_row // (n * heads)
        j_struct = tl.where(t < num_diagonals, i_struct + query_offset + first_diagonal + t, t - num_diagonals)
        real = (j_struct >= 0) & (j_struct < m)
        if CAUSAL:
            real &= j_struct <= i_struct + query_offset
        j_struct = tl.minimum(tl.maximum(j_struct, 0), m - 1)
        if HAS_KV:
            real &= tl.load(KEY_VALID + b_struct * m + j_struct, mask=struct, other=0) != 0
        if HAS_QV:
            real &= tl.load(QUERY_VALID + b_struct * n + i_struct, mask=struct, other=0) != 0
        pair = query_row * m + j_struct
    ids = tl.where(struct, pair, ids)
    live |= struct & real
    tl.store(OUT + slot, tl.where(live, ids - id_offset, sentinel).to(OUT.dtype.element_ty), mask=in_range)


@triton.jit
def _edge_list(
    IDS, ORDER, ROWS, COLS, SAMPLED, DUPLICATE, ATTENDED, CROW, COUNTS, num_edges, num_drawn, n, m, num_rows,
    sentinel, id_offset, edge_programs, STEPS_E: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    if pid < edge_programs:
        e = pid * BLOCK + tl.arange(0, BLOCK)
        ok = e < num_edges
        ids = tl.load(IDS + e, mask=ok, other=0).to(tl.int64)
        before = tl.load(IDS + e - 1, mask=ok & (e > 0), other=0).to(tl.int64)
        real = ids != sentinel
        first = (e == 0) | (ids != before)
        attended = first & real
        ids += id_offset  # the pair id (padding's is past every real one: its row is clamped to `num_rows`)
        rows = tl.minimum(ids // m, num_rows)
        cols = tl.where(real, (rows // n) * m + ids % m, 0)
        order = tl.load(ORDER + e, mask=ok, other=0)
        sampled = attended & (order < num_drawn)
        tl.store(ROWS + e, rows, mask=ok)
        tl.store(COLS + e, cols, mask=ok)
        tl.store(SAMPLED + e, sampled, mask=ok)
        tl.store(DUPLICATE + e, real & ~first, mask=ok)
        tl.store(ATTENDED + e, attended, mask=ok)
        # Per-head counts: the block's first head takes one atomic add of its sum; the edges of a later head in the
        # block (rare: heads hold thousands of edges) add one by one. Padding (no head) is not counted.
        head = rows // n
        counted = ok & real
        lead = tl.min(tl.where(counted, head, num_rows))
        in_lead = counted & (head == lead)
        one = tl.full([BLOCK], 1, COUNTS.dtype.element_ty)
        zero = tl.zeros([BLOCK], COUNTS.dtype.element_ty)
        sampled_one, attended_one = tl.where(sampled, one, zero), tl.where(attended, one, zero)
        has_lead = lead < num_rows
        tl.atomic_add(COUNTS + lead * 2, tl.sum(tl.where(in_lead, sampled_one, zero)), mask=has_lead)
        tl.atomic_add(COUNTS + lead * 2 + 1, tl.sum(tl.where(in_lead, attended_one, zero)), mask=has_lead)
        rest = counted & ~in_lead
        tl.atomic_add(COUNTS + head * 2, sampled_one, mask=rest)
        tl.atomic_add(COUNTS + head * 2 + 1, attended_one, mask=rest)
    else:
        # row pointers: row r's edges start after every id below r * m (searchsorted of the rows, stored ids)
        r = (pid - edge_programs) * BLOCK + tl.arange(0, BLOCK)
        ok = r <= num_rows
        start = _count_at_most(IDS, 0, num_edges, r * m - 1 - id_offset, ok, STEPS_E)
        tl.store(CROW + r, start, mask=ok)


def _table_steps(length: int) -> tuple[int, int]:
    """Entries and rows of a table's step: up to `BLOCK_TABLE` entries of a row, `TABLE_TILE` entries in all."""
    entries = min(BLOCK_TABLE, triton.next_power_of_2(max(length, 1)))
    return entries, max(TABLE_TILE // entries, 1)


def _steps(length: int) -> int:
    """Binary-search steps that find a position in `[0, length]`."""
    return max(int(length).bit_length(), 1)


def fastrg_pair_ids_triton(
    row_rates: Tensor,
    rates: Tensor,
    weights: Tensor,
    k_memb: Tensor,
    cluster_totals: Tensor,
    ends: Tensor,
    seed: Tensor,
    *,
    fastrg_slots: int,
    exploration_slots: int,
    query_valid: Tensor | None,
    key_valid: Tensor | None,
    query_counts: Tensor | None,
    key_counts: Tensor | None,
    causal: bool,
    query_offset: int,
    structural: object | None,
    sentinel: int,
    dtype: torch.dtype,
    offset: int,
) -> Tensor:
    """The padded, unsorted pair ids of a fastRG graph (`attnzoo.sbm.fastrg.fastrg_edges` before its sort).

    Args:
        row_rates (`torch.Tensor` of shape `(B, H, n)`): each query row's rate `Σ_v (Q̂_i Ŝ)_v z_v` (fp32).
        rates (`torch.Tensor` of shape `(B, H)`): their sums per head (the rows' total).
        weights (`torch.Tensor` of shape `(B, H, n, k)`): `(Q̂_i Ŝ)_v z_v` (fp32).
        k_memb (`torch.Tensor` of shape `(B, H, m, k)`): key memberships `K̂` (fp32).
        cluster_totals (`torch.Tensor` of shape `(B, H, k)`): `z_v = Σ_j K̂_jv`.
        ends (`torch.Tensor` of shape `(2, B*H)`): cumulative fastRG and exploration draws over the heads (integers,
            any dtype: fp64 from the Poisson draws); head `b*H + h` owns slots `ends[:, b*H + h - 1]` to
            `ends[:, b*H + h]` (a stride between the two rows is fine).
        seed (`torch.LongTensor` of shape `()`): the call's hash seed.
        fastrg_slots / exploration_slots (`int`): slots of each kind of draw (draws past them are dropped).
        query_valid / key_valid (`torch.BoolTensor` of shape `(B, n)` / `(B, m)`, *optional*): real positions.
        query_counts / key_counts (`torch.Tensor` of shape `(B, 1)`, *optional*): their numbers (with the masks).
        causal (`bool`): drop draws of a key past `i + query_offset`.
        query_offset (`int`): key position of query 0.
        structural (*optional*): the structural pairs, appended after the draws: their ids (a `torch.LongTensor`,
            `-1` for none), or their description (`first`, `diagonals`, `columns` attributes, as
            `attnzoo.sbm.fastrg.StructuralPairs`: the kernel computes the ids of its `(B, H, n, T)` slots).
        sentinel (`int`): the stored id of an empty slot (the largest of `dtype`).
        dtype (`torch.dtype`): `torch.int32` or `torch.int64`, the ids' dtype.
        offset (`int`): subtracted from every pair id as it is stored (`2^31` for int32 ids, else 0).

    Returns:
        `torch.Tensor` of shape `(fastrg_slots + exploration_slots + S,)` in `dtype`, `S` the structural slots.
    """
    B, H, n, k = weights.shape
    m = k_memb.shape[2]
    bh = B * H
    device = weights.device
    weights, k_memb, row_rates = weights.contiguous(), k_memb.contiguous(), row_rates.contiguous()
    row_cum = torch.empty(bh, n, dtype=torch.int32, device=device)
    cluster_cum = torch.empty(bh * n, k, dtype=torch.int32, device=device)
    key_cum = torch.empty(bh * k, m, dtype=torch.int32, device=device)
    has_qv, has_kv = query_valid is not None, key_valid is not None
    qv_cum = torch.empty(B, n, dtype=torch.int32, device=device) if has_qv else row_cum
    kv_cum = torch.empty(B, m, dtype=torch.int32, device=device) if has_kv else row_cum
    steps = {length: _table_steps(length) for length in (n, k, m)}  # (entries, rows) per step
    starts = list(
        itertools.accumulate(
            [
                triton.cdiv(bh, steps[n][1]),
                triton.cdiv(bh * n, steps[k][1]),
                triton.cdiv(bh * k, steps[m][1]),
                triton.cdiv(B, steps[n][1]) if has_qv else 0,
                triton.cdiv(B, steps[m][1]) if has_kv else 0,
            ]
        )
    )
    _cumulative_units[(starts[-1],)](
        row_rates, rates, row_cum, bh, n,
        weights, row_rates, cluster_cum, k,
        k_memb, cluster_totals, key_cum, m,
        query_valid if has_qv else row_rates, query_counts if has_qv else rates, qv_cum,
        key_valid if has_kv else row_rates, key_counts if has_kv else rates, kv_cum, B,
        *starts[:4], HAS_QV=has_qv, HAS_KV=has_kv,
        BLOCK_N=steps[n][0], BLOCK_K=steps[k][0], BLOCK_M=steps[m][0],
        ROWS_N=steps[n][1], ROWS_K=steps[k][1], ROWS_M=steps[m][1],
    )  # fmt: skip
    # no structural pairs: none given (no width of 0 to divide by)
    given = structural is None or isinstance(structural, Tensor)
    if given:
        num_struct, diagonal_range = 0 if structural is None else structural.numel(), (0, 0, 0)
    else:
        diagonal_range = (structural.first, structural.diagonals, structural.columns)
        num_struct = bh * n * (structural.diagonals + structural.columns)
    struct = ends if structural is None or not given else structural.reshape(-1)  # a placeholder when not read
    total = fastrg_slots + exploration_slots + num_struct
    out = torch.empty(total, dtype=dtype, device=device)
    if total > 0:
        _draw_pair_ids[(triton.cdiv(total, BLOCK_SLOTS),)](
            seed, ends, ends.stride(0), row_cum, cluster_cum, key_cum, qv_cum, kv_cum,
            query_valid if has_qv else row_cum, key_valid if has_kv else row_cum, struct, out,
            fastrg_slots, exploration_slots, num_struct, bh, H, n, k, m, query_offset, sentinel, offset,
            *diagonal_range,
            HAS_QV=has_qv, HAS_KV=has_kv, CAUSAL=causal, GIVEN=given,
            STEPS_BH=_steps(bh), STEPS_N=_steps(n), STEPS_K=_steps(k), STEPS_M=_steps(m), BLOCK=BLOCK_SLOTS,
        )  # fmt: skip
    return out


def fastrg_edge_list_triton(
    ids: Tensor, order: Tensor, *, num_drawn: int, n: int, m: int, num_rows: int, sentinel: int, offset: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The edge list of sorted pair ids: `(rows, cols, sampled, duplicate, attended, crow, head_counts)` as
    `attnzoo.sbm.fastrg.edges_from_sorted_ids` computes them (`crow`: the `(num_rows + 1,)` row pointers, int64),
    with `rows` and `cols` in the ids' dtype: int32 ids mean that the caller checked that every row and column fits
    (half the bytes of int64 for the edge attention and the estimator to keep for backward).

    Args:
        ids (`torch.Tensor` of shape `(E,)`): pair ids sorted stably, `sentinel` for empty slots (last).
        order (`torch.LongTensor` of shape `(E,)`): each sorted id's position before the sort.
        num_drawn (`int`): positions below it were draws, the others structural pairs.
        n, m (`int`): queries and keys per head.
        num_rows (`int`): `B * H * n`, the row of padding.
        sentinel (`int`): the empty slots' stored id.
        offset (`int`): what was subtracted from every id as it was stored.
    """
    num_edges = ids.shape[0]
    rows = torch.empty(num_edges, dtype=ids.dtype, device=ids.device)
    cols = torch.empty_like(rows)
    sampled, duplicate, attended = (torch.empty(num_edges, dtype=torch.bool, device=ids.device) for _ in range(3))
    crow = torch.empty(num_rows + 1, dtype=torch.int64, device=ids.device)
    head_counts = torch.zeros(num_rows // n, 2, dtype=ids.dtype, device=ids.device)
    edge_programs = triton.cdiv(num_edges, BLOCK_SLOTS)
    _edge_list[(edge_programs + triton.cdiv(num_rows + 1, BLOCK_SLOTS),)](
        ids, order, rows, cols, sampled, duplicate, attended, crow, head_counts, num_edges, num_drawn, n, m,
        num_rows, sentinel, offset, edge_programs, STEPS_E=_steps(num_edges), BLOCK=BLOCK_SLOTS,
    )  # fmt: skip
    return rows, cols, sampled, duplicate, attended, crow, head_counts

"""Triton interpolated attention: A²-Former's selection and attention in one kernel per pass.

The torch implementation ([`attnzoo.kernels.interpolated`]) builds `(B, H, Nq, K + g, 2)` int64 neighbour indices
and weights and about seventy small ops around the attention kernel; here each program recomputes them in registers
from the offsets. Forward: one program per block of `BLOCK_M` queries of one (batch, head) loads the `(BLOCK_M,)`
offsets of each point (K is a compile-time constant, so the point loop is unrolled), bounds the position (clamp or
reflect inside the real span, never past the query when causal), finds its two real neighbours (`i0 = floor`,
`i1 = i0 + 1` without holes; with holes two int32 tables of the nearest real key before and after every position),
gathers their key and value rows, mixes them with the interpolation weight, and folds the slot into an online softmax
(FlashAttention's running max and sum) together with the `g` global keys. It stores the output, the row log-sum-exp
and, on request, the per-block counts behind the density diagnostic (distinct keys with weight per query).

Backward recomputes the positions and scores from the offsets and the log-sum-exp; it writes dQ, the offsets'
gradient (through the interpolation weight and the bound) and the point logits' gradient per query, and scatters
dK / dV with relaxed fp32 atomic adds (no ordering is needed between independent additions). Nothing of size
`(N, K, d)`, no index tensor and no host sync exists in either pass: saved for backward are q, k, v, the output, the
log-sum-exp, the offsets (and point logits / dropout keep-mask when used) and two `(B, Nk)` int32 tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..global_rows import replace_global_rows, row_settings
from ..hashing import keep_threshold
from .gathered import _query_block
from .global_rows import BLOCK_N, MAX_FUSED_GLOBALS, global_rows_bwd, global_rows_fwd, is_real, key_tables
from .global_rows import load_rows as _load_rows
from .global_rows import replaced_rows as _replaced
from .global_rows import scatter_rows as _scatter_rows
from .hashing import is_seed, keep_argument, keep_factor
from .launch import check_dtypes, query_tile_meta, row_strides
from .launch import pointer_or as _or


@triton.jit
def _span(BEFORE, AFTER, b, num_keys, meta, HAS_TABLES: tl.constexpr, CAUSAL: tl.constexpr):
    """Allowed positions `[lo, hi]` of each query (fp32) and whether it has any key (`lo = hi = 0` otherwise)."""
    if HAS_TABLES:
        lo = tl.load(AFTER + b * num_keys).to(tl.float32) + 0.0 * meta  # first real key (Nk if none)
        hi = tl.load(BEFORE + b * num_keys + num_keys - 1).to(tl.float32) + 0.0 * meta  # last (-1 if none)
    else:
        lo = 0.0 * meta
        hi = (num_keys - 1).to(tl.float32) + 0.0 * meta
    if CAUSAL:
        hi = tl.minimum(hi, meta)  # never the future
    live = hi >= lo
    return tl.where(live, lo, 0.0), tl.where(live, hi, 0.0), live


@triton.jit
def _neighbours(
    off, meta, lo, hi, BEFORE, AFTER, b, num_keys, REFLECT: tl.constexpr, HAS_TABLES: tl.constexpr
):  # fmt: skip
    """Neighbours `i0 <= p <= i1` (int32) of the bounded positions `p`, the weight `w1` of `i1`, and `d w1 / d off`
    (elementwise on tensors of any shape; the arithmetic of `kernels.interpolated.interpolation_points`)."""
    raw = meta + off
    if REFLECT:
        span = hi - lo
        period = tl.maximum(2.0 * span, 1.0)
        folded = (raw - lo) % period  # fmod; torch.remainder takes the divisor's sign
        folded = tl.where(folded < 0.0, folded + period, folded)
        mirror = span - folded
        pos = tl.where(span > 0.0, lo + span - tl.abs(mirror), lo)
        slope = tl.where(span > 0.0, tl.where(mirror > 0.0, 1.0, tl.where(mirror < 0.0, -1.0, 0.0)), 0.0)
    else:
        pos = tl.minimum(tl.maximum(raw, lo), hi)
        slope = tl.where((raw >= lo) & (raw <= hi), 1.0, 0.0)  # clamp passes the gradient inside, ends included
    floor = tl.minimum(tl.floor(pos), hi).to(tl.int32)
    last = hi.to(tl.int32)
    if HAS_TABLES:
        # Nearest real keys around the interval [floor, floor + 1): holes in the mask are bridged.
        i0 = tl.maximum(tl.load(BEFORE + b * num_keys + floor), 0)
        i1 = tl.load(AFTER + b * num_keys + tl.minimum(floor + 1, num_keys - 1))
        i1 = tl.where(i1 > last, i0, i1)
    else:
        i0 = floor
        i1 = tl.minimum(floor + 1, last)
    gap = i1 - i0
    gapf = tl.maximum(gap, 1).to(tl.float32)
    w1 = tl.where(gap > 0, (pos - i0.to(tl.float32)) / gapf, 0.0)
    dw1 = tl.where(gap > 0, slope / gapf, 0.0)
    return i0, i1, w1, dw1


@triton.jit
def _softmax_step(row_max, row_sum, acc, logit, v_mix, factor, HAS_KEEP: tl.constexpr):
    """Fold one slot (logits `(BLOCK_M,)`, mixed values `(BLOCK_M, BLOCK_D)`) into the online softmax."""
    m_new = tl.maximum(row_max, logit)
    # A row that has seen only -inf logits keeps a finite shift, so exp(-inf - shift) = 0 and never NaN.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(row_max - shift)
    p = tl.exp(logit - shift)
    row_sum = row_sum * alpha + p
    if HAS_KEEP:
        p = p * factor
    return m_new, row_sum, acc * alpha[:, None] + p[:, None] * v_mix


@triton.jit
def _distinct_keys(
    i0, i1, w1, used, GLOBALS: tl.constexpr, BEFORE, b, num_keys, HAS_TABLES: tl.constexpr, P2: tl.constexpr
):
    """Per query, the number of distinct keys with weight among the points `(BLOCK_M, P2)` and the global keys."""
    first = used & (w1 < 1.0)  # i0 carries weight 1 - w1
    second = used & (w1 > 0.0)
    lanes = tl.arange(0, P2)
    earlier = lanes[None, :] < lanes[:, None]  # (s, t): t before s
    # An entry counts unless an earlier entry with weight holds the same key: left entries first, then right ones.
    same_left = (i0[:, :, None] == i0[:, None, :]) & first[:, None, :] & earlier[None, :, :]
    repeat_left = tl.max(same_left.to(tl.int32), 2) > 0
    right_in_left = (i1[:, :, None] == i0[:, None, :]) & first[:, None, :]
    same_right = (i1[:, :, None] == i1[:, None, :]) & second[:, None, :] & earlier[None, :, :]
    repeat_right = tl.max((right_in_left | same_right).to(tl.int32), 2) > 0
    count = tl.sum((first & ~repeat_left).to(tl.int32), 1) + tl.sum((second & ~repeat_right).to(tl.int32), 1)
    for j in tl.static_range(GLOBALS):
        seen = tl.max(((first & (i0 == j)) | (second & (i1 == j))).to(tl.int32), 1) > 0
        count += (is_real(BEFORE, b, num_keys, count * 0 + j, HAS_TABLES) & ~seen).to(tl.int32)
    return count


@triton.jit
def _points_fwd(
    pid, Q, K, V, OFF, LOGIT, KEEP, BEFORE, AFTER, REAL, OUT, LSE, STATS,
    num_heads, num_queries, num_keys, query_offset, scale, keep_scale, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    sp_b, sp_h, sp_n, sp_k, sl_b, sl_h, sl_n, sl_k,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, POINTS: tl.constexpr, P2: tl.constexpr,
    GLOBALS: tl.constexpr, CAUSAL: tl.constexpr, REFLECT: tl.constexpr, HAS_TABLES: tl.constexpr,
    DOT: tl.constexpr, HAS_KEEP: tl.constexpr, DENSITY: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
    KEEP_HASH: tl.constexpr,
):  # fmt: skip
    """One block of queries: their K points and the global slots (the method's own attention)."""
    bh, b, h, rows, row_ok, dim, dim_ok = _query_block(pid, num_heads, num_queries, D, BLOCK_M, BLOCK_D)
    # Rows of real global queries belong to the global-row programs when those run: not stored here.
    kept_rows = row_ok & ~_replaced(BEFORE, b, num_keys, rows, GLOBALS, HAS_TABLES, GLOBAL_ROWS)
    row_mask = row_ok[:, None] & dim_ok[None, :]
    q = _load_rows(Q, sq_b, sq_h, sq_n, b, h, rows, dim, row_mask)  # (BLOCK_M, BLOCK_D)
    meta = (rows + query_offset).to(tl.float32)
    lo, hi, live = _span(BEFORE, AFTER, b, num_keys, meta, HAS_TABLES, CAUSAL)
    live = live & row_ok
    rows64 = rows.to(tl.int64)
    off_base = OFF + b * sp_b + h * sp_h + rows64 * sp_n  # (BLOCK_M,) pointers to point 0
    logit_base = LOGIT + b * sl_b + h * sl_h + rows64 * sl_n
    keep_row = (bh * num_queries + rows64) * (POINTS + GLOBALS)  # (B, H, Nq, K + g) keep-mask
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    factor = 1.0
    for s in tl.static_range(POINTS):
        off = tl.load(off_base + s * sp_k, mask=row_ok, other=0.0).to(tl.float32)
        i0, i1, w1, _ = _neighbours(off, meta, lo, hi, BEFORE, AFTER, b, num_keys, REFLECT, HAS_TABLES)
        w0 = 1.0 - w1
        mask0 = (live & (w0 != 0.0))[:, None] & dim_ok[None, :]
        mask1 = (live & (w1 != 0.0))[:, None] & dim_ok[None, :]
        v_mix = w0[:, None] * _load_rows(V, sv_b, sv_h, sv_n, b, h, i0, dim, mask0)
        v_mix += w1[:, None] * _load_rows(V, sv_b, sv_h, sv_n, b, h, i1, dim, mask1)
        if DOT:
            k_mix = w0[:, None] * _load_rows(K, sk_b, sk_h, sk_n, b, h, i0, dim, mask0)
            k_mix += w1[:, None] * _load_rows(K, sk_b, sk_h, sk_n, b, h, i1, dim, mask1)
            logit = tl.sum(q * k_mix, 1) * scale
        else:
            logit = tl.load(logit_base + s * sl_k, mask=row_ok, other=0.0).to(tl.float32)
        logit = tl.where(live, logit, float("-inf"))
        if HAS_KEEP:
            slot = rows64 * 0 + s  # a hashed mask's position: (b*H + h, query, slot)
            factor = keep_factor(KEEP, keep_row + s, bh, rows64, slot, live, keep_scale, keep_threshold, KEEP_HASH)
        row_max, row_sum, acc = _softmax_step(row_max, row_sum, acc, logit, v_mix, factor, HAS_KEEP)
    for j in tl.static_range(GLOBALS):
        key_row = tl.zeros([BLOCK_M], tl.int32) + j
        ok = live & is_real(BEFORE, b, num_keys, key_row, HAS_TABLES)
        mask = ok[:, None] & dim_ok[None, :]
        v_mix = _load_rows(V, sv_b, sv_h, sv_n, b, h, key_row, dim, mask)
        if DOT:
            logit = tl.sum(q * _load_rows(K, sk_b, sk_h, sk_n, b, h, key_row, dim, mask), 1) * scale
        else:
            logit = tl.zeros([BLOCK_M], tl.float32)  # a global slot has no learned logit
        logit = tl.where(ok, logit, float("-inf"))
        if HAS_KEEP:
            slot = rows64 * 0 + POINTS + j
            factor = keep_factor(KEEP, keep_row + slot, bh, rows64, slot, ok, keep_scale, keep_threshold, KEEP_HASH)
        row_max, row_sum, acc = _softmax_step(row_max, row_sum, acc, logit, v_mix, factor, HAS_KEEP)
    has_mass = row_sum > 0.0
    out = acc / tl.where(has_mass, row_sum, 1.0)[:, None]
    o_ptr = OUT + b * so_b + h * so_h + rows64[:, None] * so_n + dim[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=kept_rows[:, None] & dim_ok[None, :])
    # Empty rows store lse = 0: their recomputed probabilities exp(-inf - 0) are exact zeros in backward.
    lse = tl.where(has_mass, row_max + tl.log(tl.where(has_mass, row_sum, 1.0)), 0.0)
    tl.store(LSE + bh * num_queries + rows, lse, mask=kept_rows)
    if DENSITY:
        # All points at once as (BLOCK_M, P2) tiles; only the block's sums leave the program.
        lanes = tl.arange(0, P2)
        used = live[:, None] & (lanes[None, :] < POINTS)
        offs = tl.load(off_base[:, None] + lanes[None, :] * sp_k, mask=used, other=0.0).to(tl.float32)
        i0, i1, w1, _ = _neighbours(
            offs, meta[:, None], lo[:, None], hi[:, None], BEFORE, AFTER, b, num_keys, REFLECT, HAS_TABLES
        )
        count = _distinct_keys(i0, i1, w1, used, GLOBALS, BEFORE, b, num_keys, HAS_TABLES, P2)
        # Queries that count: real ones (the last Nq keys are the queries) that have a key.
        counted = live & is_real(BEFORE, b, num_keys, num_keys - num_queries + rows, HAS_TABLES)
        # Real keys of the sample (at least 1).
        real = tl.load(REAL + b).to(tl.float32) if HAS_TABLES else num_keys.to(tl.float32)
        # (B * H * blocks, 2) fp32: the fraction of the sample's keys each counted query reads, summed over the
        # block, and the number of counted queries; the blocks of one (b, h) are consecutive.
        stats = STATS + pid * 2
        tl.store(stats, tl.sum(tl.where(counted, count.to(tl.float32) / real, 0.0), 0))
        tl.store(stats + 1, tl.sum(counted.to(tl.float32), 0))


@triton.jit
def _interpolated_fwd(
    Q, K, V, OFF, LOGIT, KEEP, BEFORE, AFTER, REAL, OUT, LSE, STATS, SEED,
    num_heads, num_queries, num_keys, query_offset, scale, keep_scale, keep_threshold, global_programs,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    sp_b, sp_h, sp_n, sp_k, sl_b, sl_h, sl_n, sl_k,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, POINTS: tl.constexpr, P2: tl.constexpr,
    GLOBALS: tl.constexpr, CAUSAL: tl.constexpr, REFLECT: tl.constexpr, HAS_TABLES: tl.constexpr,
    DOT: tl.constexpr, HAS_KEEP: tl.constexpr, DENSITY: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
    GLOBAL_DROPOUT: tl.constexpr, KEEP_HASH: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # The global-row programs (one per (batch, head)) come first, so that their loops over every key start early
    # and overlap the thousands of short point programs.
    pid = tl.program_id(0).to(tl.int64)
    if pid < global_programs:
        global_rows_fwd(
            pid, Q, K, V, BEFORE, OUT, LSE, SEED, num_heads, num_queries, num_keys, scale, keep_threshold,
            keep_scale, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
            D, BLOCK_D, BLOCK_G, BLOCK_N, GLOBALS, HAS_TABLES, GLOBAL_DROPOUT,
        )  # fmt: skip
    else:
        _points_fwd(
            pid - global_programs, Q, K, V, OFF, LOGIT, KEEP, BEFORE, AFTER, REAL, OUT, LSE, STATS,
            num_heads, num_queries, num_keys, query_offset, scale, keep_scale, keep_threshold,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
            sp_b, sp_h, sp_n, sp_k, sl_b, sl_h, sl_n, sl_k,
            D, BLOCK_D, BLOCK_M, POINTS, P2, GLOBALS, CAUSAL, REFLECT, HAS_TABLES, DOT, HAS_KEEP, DENSITY,
            GLOBAL_ROWS, KEEP_HASH,
        )  # fmt: skip


@triton.jit
def _points_bwd(
    pid, Q, K, V, OFF, LOGIT, KEEP, BEFORE, AFTER, OUT, DO, LSE, DQ, DK, DV, DOFF, DLOGIT,
    num_heads, num_queries, num_keys, query_offset, scale, keep_scale, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
    sdq_b, sdq_h, sdq_n, sdk_b, sdk_h, sdk_n, sp_b, sp_h, sp_n, sp_k, sl_b, sl_h, sl_n, sl_k,
    sdp_b, sdp_h, sdp_n, sdp_k,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, POINTS: tl.constexpr,
    GLOBALS: tl.constexpr, CAUSAL: tl.constexpr, REFLECT: tl.constexpr, HAS_TABLES: tl.constexpr,
    DOT: tl.constexpr, HAS_KEEP: tl.constexpr, NEED_OFFSETS: tl.constexpr, NEED_LOGITS: tl.constexpr,
    GLOBAL_ROWS: tl.constexpr, KEEP_HASH: tl.constexpr,
):  # fmt: skip
    """Backward of one block of queries' points and global slots."""
    bh, b, h, rows, row_ok, dim, dim_ok = _query_block(pid, num_heads, num_queries, D, BLOCK_M, BLOCK_D)
    # A replaced row's method output reaches nothing: no gradient from it, and its dQ is the global programs'.
    kept_rows = row_ok & ~_replaced(BEFORE, b, num_keys, rows, GLOBALS, HAS_TABLES, GLOBAL_ROWS)
    row_mask = row_ok[:, None] & dim_ok[None, :]
    q = _load_rows(Q, sq_b, sq_h, sq_n, b, h, rows, dim, row_mask)
    do = _load_rows(DO, sdo_b, sdo_h, sdo_n, b, h, rows, dim, row_mask)  # (BLOCK_M, BLOCK_D)
    # rowsum(dO * O), the softmax backward's correction term, from the stored output.
    delta = tl.sum(do * _load_rows(OUT, so_b, so_h, so_n, b, h, rows, dim, row_mask), 1)
    lse = tl.load(LSE + bh * num_queries + rows, mask=row_ok, other=0.0)
    meta = (rows + query_offset).to(tl.float32)
    lo, hi, live = _span(BEFORE, AFTER, b, num_keys, meta, HAS_TABLES, CAUSAL)
    live = live & kept_rows
    rows64 = rows.to(tl.int64)
    off_base = OFF + b * sp_b + h * sp_h + rows64 * sp_n
    logit_base = LOGIT + b * sl_b + h * sl_h + rows64 * sl_n
    keep_row = (bh * num_queries + rows64) * (POINTS + GLOBALS)
    # dK and dV: fp32 buffers of one layout (strides sdk_*), fed by atomics.
    dk = DK + b * sdk_b + h * sdk_h
    dv = DV + b * sdk_b + h * sdk_h
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    factor = 1.0
    for s in tl.static_range(POINTS):
        off = tl.load(off_base + s * sp_k, mask=row_ok, other=0.0).to(tl.float32)
        i0, i1, w1, dw1 = _neighbours(off, meta, lo, hi, BEFORE, AFTER, b, num_keys, REFLECT, HAS_TABLES)
        w0 = 1.0 - w1
        # d / d w1 needs both rows even where one weight is 0 (a point on a key); i1 == i0 has no such derivative.
        read0 = live[:, None] & dim_ok[None, :]
        read1 = (live & (i1 != i0))[:, None] & dim_ok[None, :]
        v0 = _load_rows(V, sv_b, sv_h, sv_n, b, h, i0, dim, read0)
        v1 = _load_rows(V, sv_b, sv_h, sv_n, b, h, i1, dim, read1)
        # The scatters skip rows of weight 0 (nothing to add).
        mask0 = (live & (w0 != 0.0))[:, None] & dim_ok[None, :]
        mask1 = (live & (w1 != 0.0))[:, None] & dim_ok[None, :]
        if DOT:
            k0 = _load_rows(K, sk_b, sk_h, sk_n, b, h, i0, dim, read0)
            k1 = _load_rows(K, sk_b, sk_h, sk_n, b, h, i1, dim, read1)
            k_mix = w0[:, None] * k0 + w1[:, None] * k1
            logit = tl.sum(q * k_mix, 1) * scale
        else:
            logit = tl.load(logit_base + s * sl_k, mask=row_ok, other=0.0).to(tl.float32)
        logit = tl.where(live, logit, float("-inf"))
        p = tl.exp(logit - lse)  # the recomputed softmax probability of the slot
        if HAS_KEEP:
            slot = rows64 * 0 + s  # a hashed mask's position: (b*H + h, query, slot)
            factor = keep_factor(KEEP, keep_row + s, bh, rows64, slot, live, keep_scale, keep_threshold, KEEP_HASH)
        kept = p * factor
        grad_p = tl.sum(do * (w0[:, None] * v0 + w1[:, None] * v1), 1) * factor
        grad_s = tl.where(live, p * (grad_p - delta), 0.0)  # softmax backward; delta = sum_s p_s grad_p_s
        _scatter_rows(dv, sdk_n, i0, (kept * w0)[:, None] * do, mask0, dim)
        _scatter_rows(dv, sdk_n, i1, (kept * w1)[:, None] * do, mask1, dim)
        grad_w = kept * tl.sum(do * (v1 - v0), 1)  # value path: d v~ / d w1 = v[i1] - v[i0]
        if DOT:
            dq += (grad_s * scale)[:, None] * k_mix
            _scatter_rows(dk, sdk_n, i0, (grad_s * scale * w0)[:, None] * q, mask0, dim)
            _scatter_rows(dk, sdk_n, i1, (grad_s * scale * w1)[:, None] * q, mask1, dim)
            grad_w += grad_s * scale * tl.sum(q * (k1 - k0), 1)  # score path: d <q, k~> / d w1
        if NEED_OFFSETS:
            tl.store(DOFF + b * sdp_b + h * sdp_h + rows64 * sdp_n + s * sdp_k, grad_w * dw1, mask=row_ok)
        if NEED_LOGITS:
            tl.store(DLOGIT + b * sdp_b + h * sdp_h + rows64 * sdp_n + s * sdp_k, grad_s, mask=row_ok)
    for j in tl.static_range(GLOBALS):
        ok = live & is_real(BEFORE, b, num_keys, rows * 0 + j, HAS_TABLES)
        # Every query of the block reads the same key row: load it once, scatter the block's sum once.
        k_row = tl.load(K + b * sk_b + h * sk_h + j * sk_n + dim, mask=dim_ok, other=0.0).to(tl.float32)
        v_row = tl.load(V + b * sv_b + h * sv_h + j * sv_n + dim, mask=dim_ok, other=0.0).to(tl.float32)
        # A global slot has no learned logit.
        logit = tl.sum(q * k_row[None, :], 1) * scale if DOT else tl.zeros([BLOCK_M], tl.float32)
        logit = tl.where(ok, logit, float("-inf"))
        p = tl.exp(logit - lse)
        if HAS_KEEP:
            slot = rows64 * 0 + POINTS + j
            factor = keep_factor(KEEP, keep_row + slot, bh, rows64, slot, ok, keep_scale, keep_threshold, KEEP_HASH)
        kept = tl.where(ok, p * factor, 0.0)
        grad_s = tl.where(ok, p * (tl.sum(do * v_row[None, :], 1) * factor - delta), 0.0)
        tl.atomic_add(dv + j * sdk_n + dim, tl.sum(kept[:, None] * do, 0), mask=dim_ok, sem="relaxed")
        if DOT:
            dq += (grad_s * scale)[:, None] * k_row[None, :]
            grad_k = tl.sum((grad_s * scale)[:, None] * q, 0)
            tl.atomic_add(dk + j * sdk_n + dim, grad_k, mask=dim_ok, sem="relaxed")
    if DOT or GLOBAL_ROWS:  # with point logits, the global rows alone reach q: the other rows' dQ is zero
        dq_ptr = DQ + b * sdq_b + h * sdq_h + rows64[:, None] * sdq_n + dim[None, :]
        tl.store(dq_ptr, dq.to(DQ.dtype.element_ty), mask=kept_rows[:, None] & dim_ok[None, :])


@triton.jit
def _interpolated_bwd(
    Q, K, V, OFF, LOGIT, KEEP, BEFORE, AFTER, OUT, DO, LSE, DQ, DK, DV, DOFF, DLOGIT, SEED,
    num_heads, num_queries, num_keys, query_offset, scale, keep_scale, keep_threshold, global_programs,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
    sdq_b, sdq_h, sdq_n, sdk_b, sdk_h, sdk_n, sp_b, sp_h, sp_n, sp_k, sl_b, sl_h, sl_n, sl_k,
    sdp_b, sdp_h, sdp_n, sdp_k,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, POINTS: tl.constexpr,
    GLOBALS: tl.constexpr, CAUSAL: tl.constexpr, REFLECT: tl.constexpr, HAS_TABLES: tl.constexpr,
    DOT: tl.constexpr, HAS_KEEP: tl.constexpr, NEED_OFFSETS: tl.constexpr, NEED_LOGITS: tl.constexpr,
    GLOBAL_ROWS: tl.constexpr, GLOBAL_DROPOUT: tl.constexpr, KEEP_HASH: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    if pid < global_programs:  # first, as in the forward
        global_rows_bwd(  # dK / dV by atomics (no DELTA: LSE is its placeholder)
            pid, Q, K, V, BEFORE, OUT, DO, LSE, LSE, DQ, DK, DV, SEED, num_heads, num_queries, num_keys, scale,
            keep_threshold, keep_scale,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
            sdq_b, sdq_h, sdq_n, sdk_b, sdk_h, sdk_n, sdk_b, sdk_h, sdk_n, D, BLOCK_D, BLOCK_G, BLOCK_N, GLOBALS,
            HAS_TABLES, True, GLOBAL_DROPOUT,
        )  # fmt: skip
    else:
        _points_bwd(
            pid - global_programs, Q, K, V, OFF, LOGIT, KEEP, BEFORE, AFTER, OUT, DO, LSE, DQ, DK, DV, DOFF,
            DLOGIT, num_heads, num_queries, num_keys, query_offset, scale, keep_scale, keep_threshold,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
            sdq_b, sdq_h, sdq_n, sdk_b, sdk_h, sdk_n, sp_b, sp_h, sp_n, sp_k, sl_b, sl_h, sl_n, sl_k,
            sdp_b, sdp_h, sdp_n, sdp_k, D, BLOCK_D, BLOCK_M, POINTS, GLOBALS, CAUSAL, REFLECT, HAS_TABLES,
            DOT, HAS_KEEP, NEED_OFFSETS, NEED_LOGITS, GLOBAL_ROWS, KEEP_HASH,
        )  # fmt: skip


@dataclass(frozen=True)
class _Selection:
    """What the kernels need to know beyond the tensors (compile-time flags and scalars)."""

    num_global: int
    causal: bool
    reflect: bool
    query_offset: int
    scale: float
    keep_scale: float
    density: bool
    global_rows: bool  # the global queries' dense rows are computed in the kernels
    keep_threshold: int  # the dropout's (hashing.keep_threshold), of the hashed masks
    keep_hash: bool = False  # the slots' mask is hashed from a seed (given in place of the mask)


def _meta(head_dim: int, num_points: int, selection: _Selection, before, point_logits, keep, seed) -> dict:
    return {
        # As the gathered kernel: the same two-neighbour gathers per slot.
        **query_tile_meta(head_dim),
        "POINTS": num_points,
        "GLOBALS": selection.num_global,
        "CAUSAL": selection.causal,
        "REFLECT": selection.reflect,
        "HAS_TABLES": before is not None,
        "DOT": point_logits is None,
        "HAS_KEEP": keep is not None,
        "KEEP_HASH": selection.keep_hash,  # `keep` is the seed of the hashed mask (`hashing.grid_keep`)
        "GLOBAL_ROWS": selection.global_rows,
        "GLOBAL_DROPOUT": seed is not None,
        # The global rows' programs: up to 16 queries (tl.dot's smallest tile) against key tiles.
        "BLOCK_G": MAX_FUSED_GLOBALS,
        "BLOCK_N": BLOCK_N,
    }


def _strides4(x: Tensor | None, like: Tensor) -> tuple[int, ...]:
    return tuple((like if x is None else x).stride())


class InterpolatedAttentionTriton(torch.autograd.Function):
    """Autograd wrapper of the two kernels; see [`interpolated_attention_triton`] for the arguments."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, point_logits, keep, before, after, real, seed, selection: _Selection):
        B, H, Nq, D = q.shape
        num_points = offsets.shape[3]
        # (B, Nq, H, d) in memory, as the heads are merged next: the merge is then a view, not a copy.
        out = torch.empty(B, Nq, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)
        lse = torch.empty(B * H * Nq, dtype=torch.float32, device=q.device)
        meta = _meta(D, num_points, selection, before, point_logits, keep, seed)
        blocks = triton.cdiv(Nq, meta["BLOCK_M"]) * B * H
        global_programs = B * H if selection.global_rows else 0
        stats = torch.empty(blocks if selection.density else 0, 2, dtype=torch.float32, device=q.device)
        if blocks > 0:
            _interpolated_fwd[(global_programs + blocks,)](
                q, k, v, offsets, _or(point_logits, offsets), _or(keep, offsets), _or(before, offsets),
                _or(after, offsets), _or(real, offsets), out, lse, stats, _or(seed, offsets),
                H, Nq, k.shape[2], selection.query_offset, selection.scale, selection.keep_scale,
                selection.keep_threshold, global_programs,
                *row_strides(q), *row_strides(k), *row_strides(v), *row_strides(out),
                *offsets.stride(), *_strides4(point_logits, offsets),
                P2=max(2, triton.next_power_of_2(num_points)), DENSITY=selection.density, **meta,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, offsets, point_logits, keep, before, after, out, lse, seed)
        ctx.selection = selection
        ctx.mark_non_differentiable(stats)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for the statistics
        return out, stats

    @staticmethod
    # A hand-written backward: a second derivative through it must fail loudly, not come out wrong or cryptic.
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, _grad_stats):
        if grad_out is None:  # only the statistics were used
            return (None,) * 11
        q, k, v, offsets, point_logits, keep, before, after, out, lse, seed = ctx.saved_tensors
        selection = ctx.selection
        B, H, Nq, D = q.shape
        Nk = k.shape[2]
        dot = point_logits is None
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        need_offsets = ctx.needs_input_grad[3]
        need_logits = not dot and ctx.needs_input_grad[4]
        reads_q = dot or selection.global_rows  # with point logits, only the global rows take q . k
        # One zero-filled fp32 buffer for the atomics of dK (when q . k is taken) and dV, cast once at the end;
        # (B, Nk, H, d) in memory like the projections' outputs, so that their backward merges heads without a copy.
        dkv = torch.zeros(2 if reads_q else 1, B, Nk, H, D, dtype=torch.float32, device=q.device)
        dq = torch.empty_like(q) if reads_q else None
        doff = torch.empty_like(offsets, dtype=torch.float32) if need_offsets else None
        dlogits = torch.empty_like(offsets, dtype=torch.float32) if need_logits else None
        meta = _meta(D, offsets.shape[3], selection, before, point_logits, keep, seed)
        blocks = triton.cdiv(Nq, meta["BLOCK_M"]) * B * H
        global_programs = B * H if selection.global_rows else 0
        if blocks > 0:
            _interpolated_bwd[(global_programs + blocks,)](
                q, k, v, offsets, _or(point_logits, offsets), _or(keep, offsets), _or(before, offsets),
                _or(after, offsets), out, grad_out, lse,
                _or(dq, q), dkv[0], dkv[-1], _or(doff, offsets), _or(dlogits, offsets), _or(seed, offsets),
                H, Nq, Nk, selection.query_offset, selection.scale, selection.keep_scale, selection.keep_threshold,
                global_programs,
                *row_strides(q), *row_strides(k), *row_strides(v), *row_strides(out), *row_strides(grad_out),
                *row_strides(_or(dq, q)), *row_strides(dkv[0].transpose(1, 2)), *offsets.stride(),
                *_strides4(point_logits, offsets),
                *_or(doff, _or(dlogits, offsets)).stride(),
                NEED_OFFSETS=need_offsets, NEED_LOGITS=need_logits, **meta,
            )  # fmt: skip
        if dkv.dtype != k.dtype:
            dkv = dkv.to(k.dtype)
        dkv = dkv.transpose(2, 3)  # (2 or 1, B, H, Nk, d)
        if doff is not None and doff.dtype != offsets.dtype:
            doff = doff.to(offsets.dtype)
        if dlogits is not None and dlogits.dtype != point_logits.dtype:
            dlogits = dlogits.to(point_logits.dtype)
        return dq, dkv[0] if reads_q else None, dkv[-1], doff, dlogits, None, None, None, None, None, None


def interpolated_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    point_logits: Tensor | None = None,
    key_valid: Tensor | None = None,
    causal: bool = False,
    query_offset: int = 0,
    position_bound: str = "clamp",
    num_global: int = 0,
    global_rows: bool = False,
    scale: float | None = None,
    keep: Tensor | None = None,
    dropout_p: float = 0.0,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
    density: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Triton implementation of [`attnzoo.kernels.dispatch.interpolated_attention`] (arguments as there, checked
    there; an explicit keep-mask, or the seed of a hashed one that the kernels regenerate, `keep_seed`, or neither).
    q, k and v share one dtype among fp32, bf16 and fp16; the offsets and point logits are fp32.

    The global queries' dense rows run in the kernels (one extra program per (batch, head), started first), with
    the dropout mask hashed from `global_seed` (`None`: no dropout on them), except beyond 16 global tokens: then
    [`~attnzoo.kernels.global_rows.replace_global_rows`] follows the kernel.

    Returns:
        The output `(B, H, Nq, d)` in the dtype of the inputs and the density `(B, H)` (None without `density`).
    """
    check_dtypes(q, k, v)
    for name, tensor in (("offsets", offsets), ("point_logits", point_logits)):
        if tensor is not None and tensor.dtype != torch.float32:
            # Positions beyond 256 need fp32 (bf16 cannot hold their fraction), and fp64 is not a kernel dtype.
            raise ValueError(f"The Triton interpolated attention takes fp32 {name}, got {tensor.dtype}.")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    B = q.shape[0]
    before = after = real = None
    if key_valid is not None:
        before, after, real = key_tables(key_valid)
    keep = keep_argument(keep, keep_seed)
    fused_rows = global_rows and 0 < num_global <= MAX_FUSED_GLOBALS
    selection = _Selection(
        num_global=num_global,
        causal=causal,
        reflect=position_bound == "reflect",
        query_offset=query_offset,
        scale=scale,
        keep_scale=0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p),
        density=density,
        global_rows=fused_rows,
        keep_threshold=keep_threshold(dropout_p),
        keep_hash=is_seed(keep),
    )
    seed = global_seed if fused_rows else None
    out, stats = InterpolatedAttentionTriton.apply(
        q, k, v, offsets, point_logits, keep, before, after, real, seed, selection
    )
    if global_rows and num_global and not fused_rows:
        out = replace_global_rows(out, q, k, v, key_valid, num_global, **row_settings(scale, dropout_p, global_seed))
    if not density:
        return out, None
    sums = stats.view(B, q.shape[1], -1, 2).sum(2)  # (B, H, 2): over the blocks of queries of each (b, h)
    return out, sums[..., 0] / sums[..., 1].clamp(min=1)

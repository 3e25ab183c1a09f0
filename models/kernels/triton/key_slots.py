"""Triton key-slot attention (FSAT's edges): softmax groups, global keys and confidences in registers.

The semantics are [`attnzoo.kernels.key_slots`]'s. The slots `(B, H, N, S)` arrive in key-major order; one stable sort
of each head's query positions (int32; the dropped slots, -1, sort first) gives the query-major order, without any
host sync. Three kernels:

- **forward**, one program per query row: finds its slots among the sorted queries (two binary searches; it writes
  the CSR row pointers and the order as int32 for the backward), walks the row's edges (a few, in chunks of
  `BLOCK_E`) and the `g` global keys with one online softmax per group (graph, exploration, global keys), computes
  every edge's Gaussian confidence from its slot's prediction, and stores the summed output, one log-sum-exp per
  group and the row's number of distinct keys (duplicates of a pair come from one key's slots, adjacent after the
  stable sort);
- **backward, query-major**, one program per query row: a first pass over the edges gives each group's
  `delta = sum_e p_e factor_e <dO, v_e>`, a second writes dQ and, per slot, the score gradient, the probability
  times its factor and the prediction's gradient (with the truncation clamp); per global key, the same two numbers;
- **backward, key-major**, one program per block of keys: each key's `S` slots in their native layout give
  `dK = sum_s dS_s q_i` and `dV = sum_s p_s factor_s dO_i` without atomics; the global keys' sums over every query
  come from a small reduction kernel run before it (one partial sum per chunk of queries, `(chunks, 2, B*H, g, d)`,
  which the key-major kernel adds up: no atomics, no zero-filled buffer).

With `global_rows` (FSAT's global queries' dense rows, `ZooAttention.with_global_rows` inside the primitive), the
forward and the query-major backward run `B*H` extra programs first, one per (batch, head), each over the `g <= 16`
global queries against every real key in tiles (`global_rows.py`'s, reading the padding mask itself: no table):
the forward stores their rows and a log-sum-exp per row of its own `(B*H, g)`, the backward their dQ and
`delta = rowsum(dO * O)` `(B*H, g)`; the key-major kernel adds their dK and dV per key from those (no atomics). A
replaced row's own program skips its output, takes its dO as zero (so that its slots get no gradient) and leaves
its dQ to them.

q, k, v and dO are read through their strides (the heads' transposed views need no copy), and dQ, dK, dV and the
output are written in the layout of q, k, v.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..global_rows import replace_global_rows, row_settings
from ..hashing import keep_threshold
from .global_rows import BLOCK_N as GLOBAL_BLOCK_N
from .global_rows import MAX_FUSED_GLOBALS, dropout_factor, global_rows_bwd, global_rows_fwd, replaced_rows
from .hashing import keep_argument, keep_factor
from .launch import block_d, check_dtypes, row_strides
from .launch import pointer_or as _or

BLOCK_E = 16  # edges per chunk (rows hold about M + R + g of them)
BLOCK_K = 16  # keys per program of the key-major backward
BLOCK_Q = 64  # query rows per tile of the global keys' reduction
GLOBAL_CHUNK = 1024  # query rows per program of that reduction: N / 1024 partial sums per element
NUM_GROUPS = 3  # graph, exploration, global keys: one log-sum-exp each
NUM_WARPS = 4


@triton.jit
def _row_of(pid, N, H):
    """The query row `pid = (b*H + h)*N + i` as `(bh, b, h, i)`."""
    bh = pid // N
    return bh, bh // H, bh % H, pid % N


@triton.jit
def _gather(X, s_b, s_h, s_n, b, h, pos, dim, mask):
    """Rows `pos` (L,) of head (b, h) of a `(B, H, N, d)` tensor with the given strides: (L, BLOCK_D) fp32."""
    ptr = X + b * s_b + h * s_h + pos[:, None].to(tl.int64) * s_n + dim[None, :]
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _confidence(i, mean, inv_two_var, norm):
    diff = i - mean
    return tl.exp(-diff * diff * inv_two_var) * norm


@triton.jit
def _online(m, total, acc, score, factor, v_rows):
    """One chunk of an online softmax (running max `m`, sum `total`, accumulator `acc`): `score` is -inf on the lanes
    outside the group, `factor` multiplies a probability after the normalisation (dropout, confidence)."""
    m_new = tl.maximum(m, tl.max(score, 0))
    # Only -inf so far: a finite shift keeps exp(-inf - shift) = 0 instead of NaN.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - shift)
    p = tl.exp(score - shift)
    total = total * alpha + tl.sum(p, 0)
    acc = acc * alpha + tl.sum((p * factor)[:, None] * v_rows, 0)
    return m_new, total, acc


@triton.jit
def _finish(m, total):
    """`(1 / total, lse)` of a finished group; a group without any edge gives 0 and 0."""
    has = total > 0.0
    safe = tl.where(has, total, 1.0)
    return tl.where(has, 1.0 / safe, 0.0), tl.where(has, m + tl.log(safe), 0.0)


@triton.jit
def _edge_chunk(
    K, V, MEAN, ORDER, SKEEP, q, e0, end, bh, b, h, i_f, dim, dim_ok, N, S, G,
    sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold, inv_two_var, norm,
    BLOCK_E: tl.constexpr, HAS_SKEEP: tl.constexpr, KEEP_HASH: tl.constexpr,
):  # fmt: skip
    """Edges `e0 .. e0 + BLOCK_E` of a row (those below `end`, of keys past the `G` global ones): edge ids, live
    lanes, flat slot ids, key positions, slot indices, key and value rows, logits (-inf off the live lanes),
    predictions, confidences and dropout factors."""
    edge = e0 + tl.arange(0, BLOCK_E)
    in_row = edge < end
    head = bh * N * S
    local = tl.load(ORDER + head + edge, mask=in_row, other=0)  # (j, s) within the head
    key = local // S
    s = local % S
    ok = in_row & (key >= G)  # a global key's own slots are ignored: every query reads it anyway
    slot_id = head + local  # flat (b, h, j, s)
    mask = ok[:, None] & dim_ok[None, :]
    k_rows = _gather(K, sk_b, sk_h, sk_n, b, h, key, dim, mask)
    v_rows = _gather(V, sv_b, sv_h, sv_n, b, h, key, dim, mask)
    score = tl.where(ok, tl.sum(k_rows * q[None, :], 1) * scale, float("-inf"))
    mean = tl.load(MEAN + slot_id, mask=ok, other=0.0)
    conf = tl.where(ok, _confidence(i_f, mean, inv_two_var, norm), 0.0)
    keep = tl.where(ok, 1.0, 0.0)
    if HAS_SKEEP:  # a hashed mask's position: (b*H + h, key, slot)
        keep = keep_factor(SKEEP, slot_id, bh, key, s, ok, keep_scale, keep_threshold, KEEP_HASH)
    return edge, ok, slot_id, key, s, k_rows, v_rows, score, mean, conf, keep


@triton.jit
def _global_chunk(
    K, V, VALID, GKEEP, q, g0, pid, b, h, q_real, dim, dim_ok, N, S, G,
    sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold,
    BLOCK_G: tl.constexpr, HAS_VALID: tl.constexpr, HAS_GKEEP: tl.constexpr, KEEP_HASH: tl.constexpr,
):  # fmt: skip
    """Global keys `g0 .. g0 + BLOCK_G` of a row: positions, live lanes (real query and key), key and value rows,
    logits (-inf off the live lanes) and post-softmax factors (dropout; confidence 1)."""
    key = g0 + tl.arange(0, BLOCK_G)
    ok = (key < G) & q_real
    if HAS_VALID:
        ok = ok & (tl.load(VALID + b * N + key, mask=key < G, other=0) != 0)
    mask = ok[:, None] & dim_ok[None, :]
    k_rows = _gather(K, sk_b, sk_h, sk_n, b, h, key, dim, mask)
    v_rows = _gather(V, sv_b, sv_h, sv_n, b, h, key, dim, mask)
    score = tl.where(ok, tl.sum(k_rows * q[None, :], 1) * scale, float("-inf"))
    factor = tl.where(ok, 1.0, 0.0)
    if HAS_GKEEP:  # a hashed mask's position: (b*H + h, query, S + global key), after the slots'
        row = pid + 0 * key
        offset = pid * G + key
        factor = keep_factor(GKEEP, offset, row // N, row % N, S + key, ok, keep_scale, keep_threshold, KEEP_HASH)
    return key, ok, k_rows, v_rows, score, factor


@triton.jit
def _query_real(VALID, b, i, N, HAS_VALID: tl.constexpr):
    """Whether query `i` of example `b` is a real token, as a (1,) block (broadcasts against the global keys)."""
    if HAS_VALID:
        return tl.load(VALID + b * N + i + tl.arange(0, 1)) != 0
    return tl.full([1], 1, tl.int1)


@triton.jit
def _lower_bound(SORTED, length, target):
    """The first position of `SORTED[:length]` (ascending) holding a value >= `target` (`length` if none)."""
    lo = length * 0
    hi = length
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(SORTED + mid) < target
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    return lo


@triton.jit
def _global_rows_dkv(
    dk, dv, Q, K, V, DO, VALID, GLSE, GDELTA, SEED, ok, bh, b, h, j, dim, dim_ok, N, G, scale, keep_scale,
    keep_threshold, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n,
    HAS_VALID: tl.constexpr, DROPOUT: tl.constexpr,
):  # fmt: skip
    """`dk`, `dv` `(BLOCK_K, BLOCK_D)` of a block of keys (lanes `ok`, each of its own (b, h)) plus the `G` global
    rows' parts: `sum_r dS_rj q_r` and `sum_r p_rj f_rj dO_r`, the probabilities recomputed from the rows' lse and
    the dropout factors `f` regenerated from the hash (`DROPOUT`)."""
    key_ok = ok
    if HAS_VALID:
        key_ok = key_ok & (tl.load(VALID + b * N + j, mask=ok, other=0) != 0)
    mask = key_ok[:, None] & dim_ok[None, :]
    k_ptr = K + b[:, None] * sk_b + h[:, None] * sk_h + j[:, None] * sk_n + dim[None, :]
    v_ptr = V + b[:, None] * sv_b + h[:, None] * sv_h + j[:, None] * sv_n + dim[None, :]
    k_rows = tl.load(k_ptr, mask=mask, other=0.0).to(tl.float32)
    v_rows = tl.load(v_ptr, mask=mask, other=0.0).to(tl.float32)
    for r in range(0, G):
        live = key_ok
        if HAS_VALID:  # a padded global position is no global query
            live = live & (tl.load(VALID + b * N + r, mask=key_ok, other=0) != 0)
        mask = live[:, None] & dim_ok[None, :]
        q_r = tl.load(Q + b[:, None] * sq_b + h[:, None] * sq_h + r * sq_n + dim[None, :], mask=mask, other=0.0)
        do_r = tl.load(DO + b[:, None] * sdo_b + h[:, None] * sdo_h + r * sdo_n + dim[None, :], mask=mask, other=0.0)
        q_r, do_r = q_r.to(tl.float32), do_r.to(tl.float32)
        lse = tl.load(GLSE + bh * G + r, mask=live, other=0.0)
        delta = tl.load(GDELTA + bh * G + r, mask=live, other=0.0)
        p = tl.where(live, tl.exp(tl.sum(k_rows * q_r, 1) * scale - lse), 0.0)
        grad_p = tl.sum(v_rows * do_r, 1)
        kept = p
        if DROPOUT:
            factor = dropout_factor(SEED, bh, j * 0 + r, j, keep_threshold, keep_scale)  # a tensor row: `.to` works
            grad_p = grad_p * factor
            kept = p * factor
        grad_s = p * (grad_p - delta) * scale
        dk += grad_s[:, None] * q_r
        dv += kept[:, None] * do_r
    return dk, dv


@triton.jit
def _row_fwd(
    pid, Q, K, V, MEAN, ORDER, QUERIES, CROW, ORDER32, SKEEP, GKEEP, VALID, OUT, LSE, PAIRS,
    H, N, S, G0, G, scale, keep_scale, inv_two_var, norm, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr,
    HAS_SKEEP: tl.constexpr, HAS_GKEEP: tl.constexpr, KEEP_HASH: tl.constexpr, HAS_VALID: tl.constexpr,
    HAS_GLOBAL: tl.constexpr, OWN_GLOBAL: tl.constexpr, GLOBAL_ROWS: tl.constexpr, GLOBALS: tl.constexpr,
    KEYS: tl.constexpr,
):  # fmt: skip
    """One query row's edges and global keys (the row `pid = (b*H + h)*N + i`)."""
    bh, b, h, i = _row_of(pid, N, H)
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    q = tl.load(Q + b * sq_b + h * sq_h + i * sq_n + dim, mask=dim_ok, other=0.0).to(tl.float32)
    # The row's edges within its head's sorted slots (binary searches of the sorted queries), kept for the backward
    # as CSR pointers.
    start = _lower_bound(QUERIES + bh * N * S, N * S, i)
    end = _lower_bound(QUERIES + bh * N * S, N * S, i + 1)
    one = tl.arange(0, 1)
    tl.store(CROW + bh * (N + 1) + i + one, start + one * 0)
    tl.store(CROW + bh * (N + 1) + i + 1 + one, end + one * 0, mask=(i + one) == N - 1)
    i_f = i.to(tl.float32)
    m0 = tl.full([1], float("-inf"), tl.float32)
    m1 = tl.full([1], float("-inf"), tl.float32)
    m2 = tl.full([1], float("-inf"), tl.float32)
    l0 = tl.zeros([1], tl.float32)
    l1 = tl.zeros([1], tl.float32)
    l2 = tl.zeros([1], tl.float32)
    acc0 = tl.zeros([BLOCK_D], tl.float32)
    acc1 = tl.zeros([BLOCK_D], tl.float32)
    acc2 = tl.zeros([BLOCK_D], tl.float32)
    pairs = tl.zeros([1], tl.int32)
    for e0 in range(start, end, BLOCK_E):
        edge, ok, _, key, s, _, v_rows, score, _, conf, keep = _edge_chunk(
            K, V, MEAN, ORDER, SKEEP, q, e0, end, bh, b, h, i_f, dim, dim_ok, N, S, G,
            sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold, inv_two_var, norm, BLOCK_E,
            HAS_SKEEP, KEEP_HASH,
        )  # fmt: skip
        # The row's slots in query-major order, as int32 for the backward (the sort gives int64 positions).
        tl.store(ORDER32 + bh * N * S + edge, key * S + s, mask=edge < end)
        graph = s < G0
        factor = conf * keep
        m0, l0, acc0 = _online(m0, l0, acc0, tl.where(graph, score, float("-inf")), factor, v_rows)
        m1, l1, acc1 = _online(m1, l1, acc1, tl.where(graph, float("-inf"), score), factor, v_rows)
        # The stable sort keeps a row's edges in key-major order: a pair's duplicates are adjacent.
        first = edge == start
        before = tl.load(ORDER + bh * N * S + edge - 1, mask=ok & (edge > start), other=0)
        pairs += tl.sum(tl.where(ok & (first | (before // S != key)), 1, 0), 0)
    q_real = _query_real(VALID, b, i, N, HAS_VALID)
    if HAS_GLOBAL:
        for g0 in range(0, G, BLOCK_G):
            _, ok, _, v_rows, score, factor = _global_chunk(
                K, V, VALID, GKEEP, q, g0, pid, b, h, q_real, dim, dim_ok, N, S, G,
                sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold, BLOCK_G, HAS_VALID, HAS_GKEEP,
                KEEP_HASH,
            )  # fmt: skip
            if OWN_GLOBAL:
                m2, l2, acc2 = _online(m2, l2, acc2, score, factor, v_rows)
            else:
                m0, l0, acc0 = _online(m0, l0, acc0, score, factor, v_rows)
            pairs += tl.sum(tl.where(ok, 1, 0), 0)
    inv0, lse0 = _finish(m0, l0)
    inv1, lse1 = _finish(m1, l1)
    inv2, lse2 = _finish(m2, l2)
    out = acc0 * inv0 + acc1 * inv1 + acc2 * inv2
    # A real global query's row is the global-row programs' (everything else of the row is still stored: its
    # log-sum-exps, pair count, row pointers and order).
    kept = ~replaced_rows(VALID, b, N, i + one, GLOBALS, KEYS, GLOBAL_ROWS)  # (1,): a scalar meets an interpreter bug
    tl.store(OUT + b * so_b + h * so_h + i * so_n + dim, out.to(OUT.dtype.element_ty), mask=dim_ok & kept)
    tl.store(LSE + pid * 3 + one, lse0)
    tl.store(LSE + pid * 3 + 1 + one, lse1)
    tl.store(LSE + pid * 3 + 2 + one, lse2)
    tl.store(PAIRS + pid + one, pairs)


@triton.jit
def _slots_fwd(
    Q, K, V, MEAN, ORDER, QUERIES, CROW, ORDER32, SKEEP, GKEEP, VALID, OUT, LSE, PAIRS, GLSE, SEED,
    H, N, S, G0, G, scale, keep_scale, inv_two_var, norm, global_programs, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr,
    HAS_SKEEP: tl.constexpr, HAS_GKEEP: tl.constexpr, KEEP_HASH: tl.constexpr, HAS_VALID: tl.constexpr,
    HAS_GLOBAL: tl.constexpr, OWN_GLOBAL: tl.constexpr, GLOBAL_ROWS: tl.constexpr, GLOBAL_DROPOUT: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, GLOBALS: tl.constexpr, KEYS: tl.constexpr,
):  # fmt: skip
    # The global-row programs (one per (batch, head), only with GLOBAL_ROWS) come first: their loops over every key
    # start early and overlap the many short row programs. Their log-sum-exps: GLSE (B*H, G).
    pid = tl.program_id(0).to(tl.int64)
    if pid < global_programs:
        if GLOBAL_ROWS:
            global_rows_fwd(
                pid, Q, K, V, VALID, OUT, GLSE, SEED, H, G, N, scale, keep_threshold, keep_scale,
                sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
                D, BLOCK_D, BLOCK_R, BLOCK_N, GLOBALS, KEYS, GLOBAL_DROPOUT,
            )  # fmt: skip
    else:
        _row_fwd(
            pid - global_programs, Q, K, V, MEAN, ORDER, QUERIES, CROW, ORDER32, SKEEP, GKEEP, VALID, OUT, LSE,
            PAIRS, H, N, S, G0, G, scale, keep_scale, inv_two_var, norm, keep_threshold,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
            D, BLOCK_D, BLOCK_E, BLOCK_G, HAS_SKEEP, HAS_GKEEP, KEEP_HASH, HAS_VALID, HAS_GLOBAL, OWN_GLOBAL,
            GLOBAL_ROWS,
            GLOBALS, KEYS,
        )  # fmt: skip


@triton.jit
def _row_bwd(
    pid, Q, K, V, MEAN, ORDER, CROW, SKEEP, GKEEP, VALID, DO, LSE, DQ, DS, PW, DMEAN, DSG, PG,
    H, N, S, G0, G, scale, keep_scale, inv_two_var, norm, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n, sdq_b, sdq_h, sdq_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr,
    HAS_SKEEP: tl.constexpr, HAS_GKEEP: tl.constexpr, KEEP_HASH: tl.constexpr, HAS_VALID: tl.constexpr,
    HAS_GLOBAL: tl.constexpr, OWN_GLOBAL: tl.constexpr, TRUNCATE: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
    GLOBALS: tl.constexpr, KEYS: tl.constexpr,
):  # fmt: skip
    """Backward of one query row (`pid = (b*H + h)*N + i`)."""
    bh, b, h, i = _row_of(pid, N, H)
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    one = tl.arange(0, 1)
    # A replaced row's output reaches nothing: its dO is taken as zero (zero score, prediction and p * factor
    # entries for its slots and global keys), and its dQ is the global-row programs'.
    kept = ~replaced_rows(VALID, b, N, i + one, GLOBALS, KEYS, GLOBAL_ROWS)  # (1,): a scalar meets an interpreter bug
    q = tl.load(Q + b * sq_b + h * sq_h + i * sq_n + dim, mask=dim_ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * sdo_b + h * sdo_h + i * sdo_n + dim, mask=dim_ok & kept, other=0.0).to(tl.float32)
    start = tl.load(CROW + bh * (N + 1) + i)
    end = tl.load(CROW + bh * (N + 1) + i + 1)
    i_f = i.to(tl.float32)
    kept_f = tl.where(kept, 1.0, 0.0)
    lse0 = tl.load(LSE + pid * 3 + one)
    lse1 = tl.load(LSE + pid * 3 + 1 + one)
    lse2 = tl.load(LSE + pid * 3 + 2 + one)
    lse_global = lse0
    if OWN_GLOBAL:
        lse_global = lse2
    q_real = _query_real(VALID, b, i, N, HAS_VALID)
    # Pass 1: each group's delta = sum_e p_e factor_e <dO, v_e> (rowsum(dO * O) of the group's own output).
    delta0 = tl.zeros([1], tl.float32)
    delta1 = tl.zeros([1], tl.float32)
    delta2 = tl.zeros([1], tl.float32)
    for e0 in range(start, end, BLOCK_E):
        _, ok, _, _, s, _, v_rows, score, _, conf, keep = _edge_chunk(
            K, V, MEAN, ORDER, SKEEP, q, e0, end, bh, b, h, i_f, dim, dim_ok, N, S, G,
            sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold, inv_two_var, norm, BLOCK_E,
            HAS_SKEEP, KEEP_HASH,
        )  # fmt: skip
        graph = s < G0
        p = tl.exp(score - tl.where(graph, lse0, lse1))
        term = p * conf * keep * tl.sum(v_rows * do[None, :], 1)
        delta0 += tl.sum(tl.where(graph, term, 0.0), 0)
        delta1 += tl.sum(tl.where(graph, 0.0, term), 0)
    if HAS_GLOBAL:
        for g0 in range(0, G, BLOCK_G):
            _, ok, _, v_rows, score, factor = _global_chunk(
                K, V, VALID, GKEEP, q, g0, pid, b, h, q_real, dim, dim_ok, N, S, G,
                sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold, BLOCK_G, HAS_VALID, HAS_GKEEP,
                KEEP_HASH,
            )  # fmt: skip
            term = tl.sum(tl.exp(score - lse_global) * factor * tl.sum(v_rows * do[None, :], 1), 0)
            if OWN_GLOBAL:
                delta2 += term
            else:
                delta0 += term
    # Pass 2: dQ, and per slot the score gradient, p * factor and the prediction's gradient.
    dq = tl.zeros([BLOCK_D], tl.float32)
    for e0 in range(start, end, BLOCK_E):
        _, ok, slot_id, _, s, k_rows, v_rows, score, mean, conf, keep = _edge_chunk(
            K, V, MEAN, ORDER, SKEEP, q, e0, end, bh, b, h, i_f, dim, dim_ok, N, S, G,
            sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold, inv_two_var, norm, BLOCK_E,
            HAS_SKEEP, KEEP_HASH,
        )  # fmt: skip
        graph = s < G0
        p = tl.exp(score - tl.where(graph, lse0, lse1))
        grad_final = tl.sum(v_rows * do[None, :], 1)  # d loss / d (p * keep * conf)
        ds = tl.where(ok, p * (grad_final * keep * conf - tl.where(graph, delta0, delta1)), 0.0)
        dq += tl.sum(ds[:, None] * k_rows, 0) * scale
        tl.store(DS + slot_id, ds * scale, mask=ok)
        tl.store(PW + slot_id, p * keep * conf * kept_f, mask=ok)
        # d loss / d confidence = p * keep * <dO, v>; the truncation keeps its non-positive part.
        grad_conf = p * keep * grad_final
        if TRUNCATE:
            grad_conf = tl.minimum(grad_conf, 0.0)
        tl.store(DMEAN + slot_id, grad_conf * conf * (i_f - mean) * (2.0 * inv_two_var), mask=ok)
    if HAS_GLOBAL:
        for g0 in range(0, G, BLOCK_G):
            key, ok, k_rows, v_rows, score, factor = _global_chunk(
                K, V, VALID, GKEEP, q, g0, pid, b, h, q_real, dim, dim_ok, N, S, G,
                sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, keep_scale, keep_threshold, BLOCK_G, HAS_VALID, HAS_GKEEP,
                KEEP_HASH,
            )  # fmt: skip
            p = tl.exp(score - lse_global)
            delta = delta0
            if OWN_GLOBAL:
                delta = delta2
            ds = tl.where(ok, p * (tl.sum(v_rows * do[None, :], 1) * factor - delta), 0.0)
            dq += tl.sum(ds[:, None] * k_rows, 0) * scale
            tl.store(DSG + pid * G + key, ds * scale, mask=key < G)
            tl.store(PG + pid * G + key, tl.where(ok, p * factor * kept_f, 0.0), mask=key < G)
    tl.store(DQ + b * sdq_b + h * sdq_h + i * sdq_n + dim, dq.to(DQ.dtype.element_ty), mask=dim_ok & kept)


@triton.jit
def _slots_bwd_rows(
    Q, K, V, MEAN, ORDER, CROW, SKEEP, GKEEP, VALID, OUT, DO, LSE, GLSE, GDELTA, DQ, DS, PW, DMEAN, DSG, PG, SEED,
    H, N, S, G0, G, scale, keep_scale, inv_two_var, norm, global_programs, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
    sdq_b, sdq_h, sdq_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr,
    HAS_SKEEP: tl.constexpr, HAS_GKEEP: tl.constexpr, KEEP_HASH: tl.constexpr, HAS_VALID: tl.constexpr,
    HAS_GLOBAL: tl.constexpr, OWN_GLOBAL: tl.constexpr, TRUNCATE: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
    GLOBAL_DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, GLOBALS: tl.constexpr,
    KEYS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    if pid < global_programs:  # first, as in the forward
        if GLOBAL_ROWS:
            global_rows_bwd(  # their dQ, and their delta (B*H, G) for the key-major kernel's dK / dV (DQ: the
                pid, Q, K, V, VALID, OUT, DO, GLSE, GDELTA, DQ, DQ, DQ, SEED, H, G, N, scale,  # placeholder of DK
                keep_threshold, keep_scale,  # and DV)
                sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
                sdq_b, sdq_h, sdq_n, sdq_b, sdq_h, sdq_n, sdq_b, sdq_h, sdq_n, D, BLOCK_D, BLOCK_R, BLOCK_N, GLOBALS,
                KEYS, False, GLOBAL_DROPOUT,
            )  # fmt: skip
    else:
        _row_bwd(
            pid - global_programs, Q, K, V, MEAN, ORDER, CROW, SKEEP, GKEEP, VALID, DO, LSE, DQ, DS, PW, DMEAN,
            DSG, PG, H, N, S, G0, G, scale, keep_scale, inv_two_var, norm, keep_threshold,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n, sdq_b, sdq_h, sdq_n,
            D, BLOCK_D, BLOCK_E, BLOCK_G, HAS_SKEEP, HAS_GKEEP, KEEP_HASH, HAS_VALID, HAS_GLOBAL, OWN_GLOBAL, TRUNCATE,
            GLOBAL_ROWS, GLOBALS, KEYS,
        )  # fmt: skip


@triton.jit
def _slots_bwd_global(
    Q, DO, DSG, PG, GPART, H, N, G, BH,
    sq_b, sq_h, sq_n, sdo_b, sdo_h, sdo_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """The global keys' dK and dV over one chunk of one head's queries, written to `GPART` `(chunks, 2, B*H, G, D)`."""
    bh = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1).to(tl.int64)
    first = chunk * CHUNK
    b = bh // H
    h = bh % H
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    for key in range(0, G):
        dk = tl.zeros([BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_D], tl.float32)
        for i0 in range(first, first + CHUNK, BLOCK_Q):
            i = i0 + tl.arange(0, BLOCK_Q)
            ok = i < N
            mask = ok[:, None] & dim_ok[None, :]
            ds = tl.load(DSG + (bh * N + i) * G + key, mask=ok, other=0.0)
            pw = tl.load(PG + (bh * N + i) * G + key, mask=ok, other=0.0)
            dk += tl.sum(ds[:, None] * _gather(Q, sq_b, sq_h, sq_n, b, h, i, dim, mask), 0)
            dv += tl.sum(pw[:, None] * _gather(DO, sdo_b, sdo_h, sdo_n, b, h, i, dim, mask), 0)
        tl.store(GPART + ((chunk * 2 * BH + bh) * G + key) * D + dim, dk, mask=dim_ok)
        tl.store(GPART + (((chunk * 2 + 1) * BH + bh) * G + key) * D + dim, dv, mask=dim_ok)


@triton.jit
def _slots_bwd_keys(
    Q, K, V, DO, QUERY, VALID, DS, PW, DMEAN, GPART, GLSE, GDELTA, DK, DV, SEED, H, N, S, G, R, BH, CHUNKS, scale,
    keep_scale, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n, sdk_b, sdk_h, sdk_n,
    sdv_b, sdv_h, sdv_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, HAS_GLOBAL: tl.constexpr,
    HAS_VALID: tl.constexpr, GLOBAL_ROWS: tl.constexpr, GLOBAL_DROPOUT: tl.constexpr,
):  # fmt: skip
    """dK and dV of a block of keys from their slots (key-major, no atomics), and with GLOBAL_ROWS from the `G`
    global queries' dense rows; zero prediction gradients of the dropped slots and of the global keys' slots."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)  # flat (b*H + h)*N + j
    ok = rows < R
    bh = rows // N
    b = bh // H
    h = bh % H
    j = rows % N
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    dk = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
    for s in range(0, S):
        slot_id = rows * S + s
        i = tl.load(QUERY + slot_id, mask=ok, other=-1)
        live = ok & (i >= 0) & (j >= G)
        ds = tl.load(DS + slot_id, mask=live, other=0.0)
        pw = tl.load(PW + slot_id, mask=live, other=0.0)
        mask = live[:, None] & dim_ok[None, :]
        q_ptr = Q + b[:, None] * sq_b + h[:, None] * sq_h + i[:, None].to(tl.int64) * sq_n + dim[None, :]
        do_ptr = DO + b[:, None] * sdo_b + h[:, None] * sdo_h + i[:, None].to(tl.int64) * sdo_n + dim[None, :]
        dk += ds[:, None] * tl.load(q_ptr, mask=mask, other=0.0).to(tl.float32)
        dv += pw[:, None] * tl.load(do_ptr, mask=mask, other=0.0).to(tl.float32)
        tl.store(DMEAN + slot_id, tl.zeros([BLOCK_K], tl.float32), mask=ok & ~live)
    if HAS_GLOBAL:
        is_global = ok & (j < G)
        mask = is_global[:, None] & dim_ok[None, :]
        part = (bh * G + j)[:, None] * D + dim[None, :]
        for chunk in range(0, CHUNKS):  # the partial sums over each chunk of queries, in order
            dk += tl.load(GPART + (2 * chunk) * BH * G * D + part, mask=mask, other=0.0)
            dv += tl.load(GPART + (2 * chunk + 1) * BH * G * D + part, mask=mask, other=0.0)
    if GLOBAL_ROWS:
        dk, dv = _global_rows_dkv(
            dk, dv, Q, K, V, DO, VALID, GLSE, GDELTA, SEED, ok, bh, b, h, j, dim, dim_ok, N, G, scale, keep_scale,
            keep_threshold, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n, HAS_VALID,
            GLOBAL_DROPOUT,
        )  # fmt: skip
    store = ok[:, None] & dim_ok[None, :]
    dk_ptr = DK + b[:, None] * sdk_b + h[:, None] * sdk_h + j[:, None] * sdk_n + dim[None, :]
    dv_ptr = DV + b[:, None] * sdv_b + h[:, None] * sdv_h + j[:, None] * sdv_n + dim[None, :]
    tl.store(dk_ptr, dk.to(DK.dtype.element_ty), mask=store)
    tl.store(dv_ptr, dv.to(DV.dtype.element_ty), mask=store)


def _empty_heads_like(x: Tensor) -> Tensor:
    """An uninitialised `(B, H, N, d)` tensor laid out as `(B, N, H, d)`: the layout the heads' split gives q, k and
    v, so that merging the heads again (or the projections' backward) needs no copy."""
    B, H, N, d = x.shape
    return x.new_empty(B, N, H, d).transpose(1, 2)


class KeySlotAttentionTriton(torch.autograd.Function):
    """Autograd wrapper of the kernels; see [`key_slot_attention_triton`] for the arguments."""

    @staticmethod
    def forward(ctx, q, k, v, mean, query, order, queries, slot_keep, global_keep, valid, seed, settings):
        B, H, N, D = q.shape
        num_rows = B * H * N
        out = _empty_heads_like(q)
        # Written by the forward kernel: the CSR pointers and the order as int32 (the live slots' entries).
        crow = torch.empty(B * H, N + 1, dtype=torch.int32, device=q.device)
        order32 = torch.empty(order.shape, dtype=torch.int32, device=q.device)
        lse = torch.empty(num_rows, 3, dtype=torch.float32, device=q.device)
        pairs = torch.empty(num_rows, dtype=torch.int32, device=q.device)
        # The global rows' own log-sum-exps (B*H, g): FSAT's three per row are the groups'.
        global_programs = B * H if settings.global_rows else 0
        glse = torch.empty(global_programs, settings.num_global, dtype=torch.float32, device=q.device)
        if num_rows > 0:
            _slots_fwd[(global_programs + num_rows,)](
                q, k, v, mean, order, queries, crow, order32, _or(slot_keep, query), _or(global_keep, query),
                _or(valid, query), out, lse, pairs, glse, _or(seed, query), H, N, query.shape[-1],
                *settings.runtime(), global_programs, settings.keep_threshold, *row_strides(q), *row_strides(k),
                *row_strides(v), *row_strides(out), **settings.meta(D, slot_keep, global_keep, valid, seed),
            )  # fmt: skip
        # The output is read back only for the global rows' delta = rowsum(dO * O).
        rows = (out, glse) if settings.global_rows else (None, None)
        ctx.save_for_backward(q, k, v, mean, query, order32, crow, slot_keep, global_keep, valid, lse, seed, *rows)
        ctx.settings = settings
        ctx.mark_non_differentiable(pairs)
        # No zero-filled gradient for `pairs` (an integer count) on the way back.
        ctx.set_materialize_grads(False)
        return out, pairs

    @staticmethod
    # A hand-written backward: a second derivative through it must fail loudly, not come out wrong or cryptic.
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, _grad_pairs):
        q, k, v, mean, query, order, crow, slot_keep, global_keep, valid, lse, seed, out, glse = ctx.saved_tensors
        if grad_out is None:  # the output reached no loss
            return (None,) * 12
        settings = ctx.settings
        B, H, N, D = q.shape
        S, G = query.shape[-1], settings.num_global
        num_rows = B * H * N
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        dq, dk, dv = _empty_heads_like(q), _empty_heads_like(k), _empty_heads_like(v)
        dmean = torch.empty_like(mean, dtype=torch.float32)
        per_slot = torch.empty(2, *query.shape, dtype=torch.float32, device=q.device)  # dS * scale, p * factor
        per_global = torch.empty(2, num_rows, G, dtype=torch.float32, device=q.device)
        chunks = triton.cdiv(N, GLOBAL_CHUNK)
        parts = torch.empty(chunks, 2, B * H, G, D, dtype=torch.float32, device=q.device) if G else per_global
        meta = settings.meta(D, slot_keep, global_keep, valid, seed)
        global_programs = B * H if settings.global_rows else 0
        gdelta = torch.empty_like(glse) if settings.global_rows else lse  # the global rows' rowsum(dO * O)
        glse, out = _or(glse, lse), _or(out, q)
        if num_rows > 0:
            _slots_bwd_rows[(global_programs + num_rows,)](
                q, k, v, mean, order, crow, _or(slot_keep, query), _or(global_keep, query), _or(valid, query),
                out, grad_out, lse, glse, gdelta, dq, per_slot[0], per_slot[1], dmean, per_global[0],
                per_global[1], _or(seed, query), H, N, S, *settings.runtime(), global_programs,
                settings.keep_threshold,
                *row_strides(q), *row_strides(k), *row_strides(v), *row_strides(out), *row_strides(grad_out),
                *row_strides(dq), TRUNCATE=settings.truncate, **meta,
            )  # fmt: skip
            if G:
                _slots_bwd_global[(B * H, chunks)](
                    q, grad_out, per_global[0], per_global[1], parts, H, N, G, B * H,
                    *row_strides(q), *row_strides(grad_out),
                    D=D, BLOCK_D=meta["BLOCK_D"], BLOCK_Q=BLOCK_Q, CHUNK=GLOBAL_CHUNK, num_warps=NUM_WARPS,
                )  # fmt: skip
            _slots_bwd_keys[(triton.cdiv(num_rows, BLOCK_K),)](
                q, k, v, grad_out, query, _or(valid, query), per_slot[0], per_slot[1], dmean, parts, glse, gdelta,
                dk, dv, _or(seed, query), H, N, S, G, num_rows, B * H, chunks, settings.scale, settings.keep_scale,
                settings.keep_threshold, *row_strides(q), *row_strides(k), *row_strides(v), *row_strides(grad_out),
                *row_strides(dk), *row_strides(dv), D=D, BLOCK_D=meta["BLOCK_D"], BLOCK_K=BLOCK_K,
                HAS_GLOBAL=G > 0, HAS_VALID=valid is not None, GLOBAL_ROWS=settings.global_rows,
                GLOBAL_DROPOUT=meta["GLOBAL_DROPOUT"], num_warps=NUM_WARPS,
            )  # fmt: skip
        return dq, dk, dv, dmean, None, None, None, None, None, None, None, None


class _Settings:
    """The scalars and switches of one call, shared by the forward and backward launches."""

    def __init__(
        self, *, num_graph_slots, num_global, own_global, scale, keep_scale, variance, normalized, truncate,
        global_rows=False, keep_threshold=0, keep_hash=False,
    ):  # fmt: skip
        self.num_graph_slots, self.num_global, self.own_global = num_graph_slots, num_global, own_global
        self.global_rows = global_rows  # the global queries' dense rows computed in the kernels
        self.keep_threshold = keep_threshold  # the hashed masks' dropout (hashing.keep_threshold)
        self.keep_hash = keep_hash  # the slots' and global edges' masks are hashed from a seed given in their place
        self.scale, self.keep_scale, self.truncate = scale, keep_scale, truncate
        self.inv_two_var = 1.0 / (2.0 * variance)
        self.norm = 1.0 / math.sqrt(2.0 * math.pi * variance) if normalized else 1.0

    def runtime(self) -> tuple:
        """`G0, G, scale, keep_scale, inv_two_var, norm` as the kernels take them."""
        return self.num_graph_slots, self.num_global, self.scale, self.keep_scale, self.inv_two_var, self.norm

    def meta(self, head_dim: int, slot_keep, global_keep, valid, seed) -> dict:
        return {
            "D": head_dim,
            "BLOCK_D": block_d(head_dim),
            "BLOCK_E": BLOCK_E,
            "BLOCK_G": min(triton.next_power_of_2(max(self.num_global, 1)), 16),
            "HAS_SKEEP": slot_keep is not None,
            "HAS_GKEEP": global_keep is not None,
            "KEEP_HASH": self.keep_hash,
            "HAS_VALID": valid is not None,
            "HAS_GLOBAL": self.num_global > 0,
            "OWN_GLOBAL": self.own_global,
            "GLOBAL_ROWS": self.global_rows,
            "GLOBAL_DROPOUT": seed is not None,
            # The global rows' programs: up to 16 queries (tl.dot's smallest tile) against key tiles.
            "BLOCK_R": MAX_FUSED_GLOBALS,
            "BLOCK_N": GLOBAL_BLOCK_N,
            "GLOBALS": max(self.num_global, 1),  # the global rows' programs' compile-time count
            "KEYS": 2 if valid is not None else 0,  # the padding mask as uint8 (global_rows.is_real)
            "num_warps": NUM_WARPS,
        }


def query_major_order(query: Tensor) -> tuple[Tensor, Tensor]:
    """Each head's slots in query-major order: their positions `(j, s)` within the head `(B*H, N*S)` int64, sorted by
    query (stable, so a row's slots stay in key-major order; the dropped ones first), and the sorted queries
    `(B*H, N*S)` int32 (the forward kernel finds each row's slots among them). No host sync."""
    B, H, N, S = query.shape
    if N * S >= 2**31:
        raise ValueError(f"key-slot attention indexes a head's N*S = {N * S} slots with int32: at most 2**31 - 1")
    queries, order = torch.sort(query.reshape(B * H, N * S), dim=-1, stable=True)
    return order, queries


def key_slot_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    query: Tensor,
    mean: Tensor,
    *,
    num_graph_slots: int,
    num_global: int,
    global_softmax: str,
    key_valid: Tensor | None,
    variance: float,
    normalized: bool,
    truncate: bool,
    scale: float | None,
    slot_keep: Tensor | None,
    global_keep: Tensor | None,
    dropout_p: float,
    global_rows: bool = False,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Triton implementation of [`attnzoo.kernels.key_slot_attention`] (arguments as there, checked there; explicit
    keep-masks, or the seed of hashed ones that the kernels regenerate, `keep_seed`, or neither). q, k and v share
    one dtype among fp32, bf16 and fp16; the output has it too.

    With `global_rows`, the global queries' dense rows run in the kernels (one extra program per (batch, head),
    started first; their dK and dV join the key-major pass), their dropout mask hashed from `global_seed` (`None`:
    no dropout on them), except beyond 16 global tokens: then [`~attnzoo.kernels.global_rows.replace_global_rows`]
    follows the kernel.

    Returns:
        The output `(B, H, N, d)` and the distinct pair count `(B, H)` float.
    """
    check_dtypes(q, k, v)
    B, H, N, D = q.shape
    order, queries = query_major_order(query)
    scale = D**-0.5 if scale is None else float(scale)
    fused_rows = global_rows and 0 < num_global <= MAX_FUSED_GLOBALS
    settings = _Settings(
        num_graph_slots=num_graph_slots,
        num_global=num_global,
        own_global=global_softmax == "own" and num_global > 0,
        scale=scale,
        keep_scale=0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p),
        variance=variance,
        normalized=normalized,
        truncate=truncate,
        global_rows=fused_rows,
        keep_threshold=keep_threshold(dropout_p),
        keep_hash=keep_seed is not None,
    )
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    slot_keep = keep_argument(slot_keep, keep_seed)  # a seed serves both pointers
    global_keep = keep_argument(global_keep, keep_seed if num_global else None)
    views = [slot_keep, global_keep, None if key_valid is None else key_valid.contiguous().view(torch.uint8)]
    mean = mean.to(torch.float32).contiguous()
    seed = global_seed if fused_rows else None
    out, pairs = KeySlotAttentionTriton.apply(
        q, k, v, mean, query.contiguous(), order, queries, *views, seed, settings
    )
    if global_rows and num_global and not fused_rows:
        out = replace_global_rows(out, q, k, v, key_valid, num_global, **row_settings(scale, dropout_p, global_seed))
    return out, pairs.view(B, H, N).sum(-1, dtype=torch.float32)

"""Triton gathered attention: every query reads its own K slots, each a weighted mix of J key rows.

Slot `s` of query `n` mixes the key rows `idx[n, s, :]` with the weights `weight[n, s, :]`:
`k~_s = sum_j w_sj k[idx_sj]` (likewise `v~_s`), so Smart Bird's sampled keys are `J = 1` and A²-Former's
linear interpolation between `floor(p)` and `floor(p) + 1` is `J = 2` with weights `(1 - frac, frac)`. The logit of a
slot is `bias_s + scale * <q, k~_s>` (the dot product only with `DOT`), the softmax runs over the K slots, dropout
multiplies the probabilities and `out = sum_s p_s keep_s v~_s`.

Forward: one program per block of `BLOCK_M` queries of one (batch, head), an online softmax over the slots
(FlashAttention's running max and sum), fp32 accumulation; it stores the output (token-major in memory, so that the
heads merge as a view) and the row log-sum-exp. Backward recomputes every score from the log-sum-exp and
`rowsum(dO * O)` from the stored output, writes dQ (in q's dtype and layout), the weight and bias gradients directly
and accumulates dK / dV with relaxed fp32 atomic adds into one buffer cast once, so no `(N, K, d)` tensor exists in
either pass. With `global_rows`, `B * H` programs of their own compute the global queries' dense rows
(`global_rows.py`). Each query has its own key rows, so there is
no shared tile for tensor cores: the kernels are bound by the gathers' memory traffic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..global_rows import replace_global_rows, row_settings
from ..hashing import keep_threshold
from .global_rows import MAX_FUSED_GLOBALS, global_rows_bwd, global_rows_fwd, replaced_rows, row_meta
from .global_rows import load_rows as _load_rows
from .global_rows import scatter_rows as _scatter_rows
from .hashing import is_seed, keep_argument, keep_factor
from .launch import check_dtypes, query_tile_meta, row_strides
from .launch import pointer_or as _or


@triton.jit
def _query_block(pid, num_heads, num_queries, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program `pid`'s (batch, head) and block of query rows: `bh, b, h, rows, row_ok, dim, dim_ok`.

    A 1-D grid of `B * H * cdiv(Nq, BLOCK_M)` programs (CUDA's 2**31 - 1 on axis 0; a 2-D grid would cap B * H or
    the blocks at 65,535), the blocks of one (batch, head) consecutive so that they share its keys in L2. `pid`
    is int64 and counts from the first query block (a kernel that starts other programs first subtracts them)."""
    blocks = tl.cdiv(num_queries, BLOCK_M)
    bh = pid // blocks
    rows = (pid % blocks).to(tl.int32) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    dim = tl.arange(0, BLOCK_D)
    return bh, bh // num_heads, bh % num_heads, rows, rows < num_queries, dim, dim < D


@triton.jit
def _slot_entry(IDX, WEIGHT, entry, ok, HAS_WEIGHT: tl.constexpr):
    """Key position and mixing weight of one entry of a slot for every query of the block."""
    key = tl.load(IDX + entry, mask=ok, other=0)
    w = tl.load(WEIGHT + entry, mask=ok, other=0.0).to(tl.float32) if HAS_WEIGHT else tl.where(ok, 1.0, 0.0)
    return key, w


@triton.jit
def _mixed_slot(
    K, V, IDX, WEIGHT, VALID, BIAS, q, slot, row_ok, b, h, dim, dim_ok,
    sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale,
    J: tl.constexpr, DOT: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_VALID: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """Slot `slot` of every query of the block: which queries use it, its logit (-inf where unused) and its mixed
    value `v~ = sum_j w_j v[idx_j]` (BLOCK_M, BLOCK_D)."""
    ok = row_ok
    if HAS_VALID:
        ok = ok & (tl.load(VALID + slot, mask=row_ok, other=0) != 0)
    logit = tl.load(BIAS + slot, mask=ok, other=0.0).to(tl.float32) if HAS_BIAS else tl.where(ok, 0.0, 0.0)
    mask = ok[:, None] & dim_ok[None, :]
    v_mix = tl.zeros(q.shape, tl.float32)
    for j in tl.static_range(J):
        key, w = _slot_entry(IDX, WEIGHT, slot * J + j, ok, HAS_WEIGHT)
        if DOT:
            logit += w * tl.sum(q * _load_rows(K, sk_b, sk_h, sk_n, b, h, key, dim, mask), 1) * scale
        v_mix += w[:, None] * _load_rows(V, sv_b, sv_h, sv_n, b, h, key, dim, mask)
    return ok, tl.where(ok, logit, float("-inf")), v_mix


@triton.jit
def _slots_fwd(
    pid, Q, K, V, IDX, WEIGHT, VALID, BIAS, KEEP, KEY_MASK, OUT, LSE,
    num_heads, num_queries, num_keys, num_slots, scale, keep_scale, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, J: tl.constexpr, DOT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_VALID: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_KEEP: tl.constexpr,
    KEEP_HASH: tl.constexpr, GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
):  # fmt: skip
    """Forward of one block of queries over their slots."""
    bh, b, h, rows, row_ok, dim, dim_ok = _query_block(pid, num_heads, num_queries, D, BLOCK_M, BLOCK_D)
    row_mask = row_ok[:, None] & dim_ok[None, :]
    q = _load_rows(Q, sq_b, sq_h, sq_n, b, h, rows, dim, row_mask)  # (BLOCK_M, BLOCK_D)
    # Slot s of query n is entry (bh * Nq + n) * S + s of the (B, H, Nq, S[, J]) index tensors.
    slot_base = (bh * num_queries + rows) * num_slots  # (BLOCK_M,)
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for s in range(0, num_slots):
        slot = slot_base + s
        ok, logit, v_mix = _mixed_slot(
            K, V, IDX, WEIGHT, VALID, BIAS, q, slot, row_ok, b, h, dim, dim_ok,
            sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, J, DOT, HAS_WEIGHT, HAS_VALID, HAS_BIAS,
        )  # fmt: skip
        m_new = tl.maximum(row_max, logit)
        # A row that has seen only -inf logits keeps a finite shift, so exp(-inf - shift) = 0 and never NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(row_max - shift)
        p = tl.exp(logit - shift)
        row_sum = row_sum * alpha + p
        if HAS_KEEP:  # a hashed mask's position: (b*H + h, query, slot)
            p = p * keep_factor(KEEP, slot, bh, rows, 0 * rows + s, ok, keep_scale, keep_threshold, KEEP_HASH)
        acc = acc * alpha[:, None] + p[:, None] * v_mix
        row_max = m_new
    has_mass = row_sum > 0.0
    out = acc / tl.where(has_mass, row_sum, 1.0)[:, None]
    # A global query's row and log-sum-exp are its global program's.
    kept_rows = row_ok & ~replaced_rows(KEY_MASK, b, num_keys, rows, GLOBALS, KEYS, GLOBAL_ROWS)
    o_ptr = OUT + b * so_b + h * so_h + rows[:, None].to(tl.int64) * so_n + dim[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=kept_rows[:, None] & dim_ok[None, :])
    # Empty rows store lse = 0: their recomputed probabilities exp(-inf - 0) are exact zeros in backward.
    lse = tl.where(has_mass, row_max + tl.log(tl.where(has_mass, row_sum, 1.0)), 0.0)
    tl.store(LSE + bh * num_queries + rows, lse, mask=kept_rows)


@triton.jit
def _gathered_fwd(
    Q, K, V, IDX, WEIGHT, VALID, BIAS, KEEP, KEY_MASK, OUT, LSE, SEED,
    num_heads, num_queries, num_keys, num_slots, scale, keep_scale, keep_threshold, global_programs,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, J: tl.constexpr, DOT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_VALID: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_KEEP: tl.constexpr,
    KEEP_HASH: tl.constexpr, GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
    GLOBAL_DROPOUT: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # With global rows, their `B * H` programs come first, so that their loops over every key start early and
    # overlap the slot programs (kernels/triton/global_rows.py).
    pid = tl.program_id(0).to(tl.int64)
    if GLOBAL_ROWS and pid < global_programs:
        global_rows_fwd(
            pid, Q, K, V, KEY_MASK, OUT, LSE, SEED, num_heads, num_queries, num_keys, scale, keep_threshold,
            keep_scale, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
            D, BLOCK_D, BLOCK_G, BLOCK_N, GLOBALS, KEYS, GLOBAL_DROPOUT,
        )  # fmt: skip
    else:
        _slots_fwd(
            pid - global_programs, Q, K, V, IDX, WEIGHT, VALID, BIAS, KEEP, KEY_MASK, OUT, LSE,
            num_heads, num_queries, num_keys, num_slots, scale, keep_scale, keep_threshold,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
            D, BLOCK_D, BLOCK_M, J, DOT, HAS_WEIGHT, HAS_VALID, HAS_BIAS, HAS_KEEP, KEEP_HASH, GLOBALS, KEYS,
            GLOBAL_ROWS,
        )  # fmt: skip


@triton.jit
def _slots_bwd(
    pid, Q, K, V, IDX, WEIGHT, VALID, BIAS, KEEP, KEY_MASK, OUT, DO, LSE, DQ, DK, DV, DWEIGHT, DBIAS,
    num_heads, num_queries, num_keys, num_slots, scale, keep_scale, keep_threshold,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
    sdk_b, sdk_h, sdk_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, J: tl.constexpr, DOT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_VALID: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_KEEP: tl.constexpr,
    KEEP_HASH: tl.constexpr, NEED_WEIGHT: tl.constexpr, NEED_BIAS: tl.constexpr,
    GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
):  # fmt: skip
    """Backward of one block of queries over their slots."""
    bh, b, h, rows, row_ok, dim, dim_ok = _query_block(pid, num_heads, num_queries, D, BLOCK_M, BLOCK_D)
    row_mask = row_ok[:, None] & dim_ok[None, :]
    # A global query's method row was replaced: it reaches nothing. An infinite log-sum-exp makes its recomputed
    # probabilities, and with them every gradient of its slots, exact zeros (its slots' gradients are still written).
    kept_rows = row_ok & ~replaced_rows(KEY_MASK, b, num_keys, rows, GLOBALS, KEYS, GLOBAL_ROWS)
    q = _load_rows(Q, sq_b, sq_h, sq_n, b, h, rows, dim, row_mask)
    do = _load_rows(DO, sdo_b, sdo_h, sdo_n, b, h, rows, dim, row_mask)  # (BLOCK_M, BLOCK_D)
    lse = tl.where(kept_rows, tl.load(LSE + bh * num_queries + rows, mask=row_ok, other=0.0), float("inf"))
    # rowsum(dO * O), the softmax backward's correction term, from the stored output.
    delta = tl.sum(do * _load_rows(OUT, so_b, so_h, so_n, b, h, rows, dim, row_mask), 1)
    # dK and dV: fp32 buffers of one layout (strides sdk_*), fed by atomics.
    dk = DK + b * sdk_b + h * sdk_h
    dv = DV + b * sdk_b + h * sdk_h
    slot_base = (bh * num_queries + rows) * num_slots
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for s in range(0, num_slots):
        slot = slot_base + s
        ok, logit, v_mix = _mixed_slot(
            K, V, IDX, WEIGHT, VALID, BIAS, q, slot, row_ok, b, h, dim, dim_ok,
            sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, J, DOT, HAS_WEIGHT, HAS_VALID, HAS_BIAS,
        )  # fmt: skip
        mask = ok[:, None] & dim_ok[None, :]
        scatter = (ok & kept_rows)[:, None] & dim_ok[None, :]  # a replaced row adds nothing
        p = tl.exp(logit - lse)  # recomputed softmax probability of the slot
        grad_p = tl.sum(do * v_mix, 1)  # d loss / d p_s = keep factor * <dO, v~_s>
        if HAS_KEEP:
            factor = keep_factor(KEEP, slot, bh, rows, 0 * rows + s, ok, keep_scale, keep_threshold, KEEP_HASH)
            grad_p = grad_p * factor
            kept = p * factor
        else:
            kept = p
        grad_s = tl.where(ok, p * (grad_p - delta), 0.0)  # softmax backward; delta = sum_s p_s grad_p_s
        if NEED_BIAS:
            tl.store(DBIAS + slot, grad_s, mask=row_ok)
        # Second pass over the entries (re-read rows hit the cache): gather dQ, scatter dK / dV, weight gradients.
        for j in tl.static_range(J):
            key, w = _slot_entry(IDX, WEIGHT, slot * J + j, ok, HAS_WEIGHT)
            grad_w = tl.zeros([BLOCK_M], tl.float32)
            if DOT:
                k_rows = _load_rows(K, sk_b, sk_h, sk_n, b, h, key, dim, mask)
                dq += (grad_s * w * scale)[:, None] * k_rows
                _scatter_rows(dk, sdk_n, key, (grad_s * w * scale)[:, None] * q, scatter, dim)
                if NEED_WEIGHT:
                    grad_w += grad_s * scale * tl.sum(q * k_rows, 1)
            _scatter_rows(dv, sdk_n, key, (kept * w)[:, None] * do, scatter, dim)
            if NEED_WEIGHT:
                grad_w += kept * tl.sum(do * _load_rows(V, sv_b, sv_h, sv_n, b, h, key, dim, mask), 1)
                tl.store(DWEIGHT + slot * J + j, tl.where(ok, grad_w, 0.0), mask=row_ok)
    if DOT:  # a global query's dQ is its global program's
        dq_ptr = DQ + b * sq_b + h * sq_h + rows[:, None].to(tl.int64) * sq_n + dim[None, :]
        tl.store(dq_ptr, dq.to(DQ.dtype.element_ty), mask=kept_rows[:, None] & dim_ok[None, :])


@triton.jit
def _gathered_bwd(
    Q, K, V, IDX, WEIGHT, VALID, BIAS, KEEP, KEY_MASK, OUT, DO, LSE, DQ, DK, DV, DWEIGHT, DBIAS, SEED,
    num_heads, num_queries, num_keys, num_slots, scale, keep_scale, keep_threshold, global_programs,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
    sdk_b, sdk_h, sdk_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, J: tl.constexpr, DOT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_VALID: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_KEEP: tl.constexpr,
    KEEP_HASH: tl.constexpr, NEED_WEIGHT: tl.constexpr, NEED_BIAS: tl.constexpr,
    GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr, GLOBAL_DROPOUT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    if GLOBAL_ROWS and pid < global_programs:  # first, as in the forward; dQ shares q's strides
        global_rows_bwd(  # dK / dV by atomics (no DELTA: LSE is its placeholder)
            pid, Q, K, V, KEY_MASK, OUT, DO, LSE, LSE, DQ, DK, DV, SEED, num_heads, num_queries, num_keys, scale,
            keep_threshold, keep_scale,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
            sq_b, sq_h, sq_n, sdk_b, sdk_h, sdk_n, sdk_b, sdk_h, sdk_n, D, BLOCK_D, BLOCK_G, BLOCK_N, GLOBALS,
            KEYS, True, GLOBAL_DROPOUT,
        )  # fmt: skip
    else:
        _slots_bwd(
            pid - global_programs, Q, K, V, IDX, WEIGHT, VALID, BIAS, KEEP, KEY_MASK, OUT, DO, LSE, DQ, DK, DV,
            DWEIGHT, DBIAS, num_heads, num_queries, num_keys, num_slots, scale, keep_scale, keep_threshold,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
            sdk_b, sdk_h, sdk_n, D, BLOCK_D, BLOCK_M, J, DOT, HAS_WEIGHT, HAS_VALID, HAS_BIAS, HAS_KEEP,
            KEEP_HASH, NEED_WEIGHT, NEED_BIAS, GLOBALS, KEYS, GLOBAL_ROWS,
        )  # fmt: skip


class GatheredAttentionTriton(torch.autograd.Function):
    """Autograd wrapper of the two kernels; see [`gathered_attention_triton`] for the arguments."""

    @staticmethod
    def forward(
        ctx, q, k, v, weight, bias, idx, valid, keep, keep_scale, scale, dot_product, key_mask, global_rows,
        global_seed, threshold,
    ):  # fmt: skip
        B, H, Nq, D = q.shape
        num_slots = idx.shape[3]
        entries = idx.shape[4]
        # (B, Nq, H, d) in memory, as the heads are merged next: the merge is then a view, not a copy.
        out = torch.empty(B, Nq, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)
        lse = torch.empty(B * H * Nq, dtype=torch.float32, device=q.device)
        hashed = is_seed(keep)
        meta = _meta(D, entries, dot_product, weight, valid, bias, keep, key_mask, global_rows, global_seed, hashed)
        global_programs = B * H if global_rows else 0
        grid = (global_programs + triton.cdiv(Nq, meta["BLOCK_M"]) * B * H,)
        if Nq > 0 and B * H > 0:
            _gathered_fwd[grid](
                q, k, v, idx, _or(weight, idx), _or(valid, idx), _or(bias, idx), _or(keep, idx), _or(key_mask, idx),
                out, lse, _or(global_seed, idx), H, Nq, k.shape[2], num_slots, scale, keep_scale, threshold,
                global_programs, *row_strides(q), *row_strides(k), *row_strides(v), *row_strides(out), **meta,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, weight, bias, idx, valid, keep, key_mask, out, lse, global_seed)
        ctx.keep_scale, ctx.scale, ctx.dot_product, ctx.global_rows = keep_scale, scale, dot_product, global_rows
        ctx.threshold = threshold
        return out

    @staticmethod
    # A hand-written backward: a second derivative through it must fail loudly, not come out wrong or cryptic.
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, weight, bias, idx, valid, keep, key_mask, out, lse, global_seed = ctx.saved_tensors
        B, H, Nq, D = q.shape
        Nk = k.shape[2]
        num_slots, entries = idx.shape[3], idx.shape[4]
        dot = ctx.dot_product
        need_weight = weight is not None and ctx.needs_input_grad[3]
        need_bias = bias is not None and ctx.needs_input_grad[4]
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        # dQ written once per row in q's dtype and layout; one zero-filled fp32 buffer for the atomics of dK (with
        # the dot product) and dV, cast once at the end, (B, Nk, H, d) in memory like the projections' outputs, so
        # that their backward merges heads without a copy. Every weight and bias gradient is written.
        dq = torch.empty_like(q) if dot else None
        dkv = torch.zeros(2 if dot else 1, B, Nk, H, D, dtype=torch.float32, device=q.device)
        dweight = torch.empty(idx.shape, dtype=torch.float32, device=q.device) if need_weight else None
        dbias = torch.empty(idx.shape[:4], dtype=torch.float32, device=q.device) if need_bias else None
        hashed = is_seed(keep)
        meta = _meta(D, entries, dot, weight, valid, bias, keep, key_mask, ctx.global_rows, global_seed, hashed)
        global_programs = B * H if ctx.global_rows else 0
        grid = (global_programs + triton.cdiv(Nq, meta["BLOCK_M"]) * B * H,)
        if Nq > 0 and B * H > 0:
            _gathered_bwd[grid](
                q, k, v, idx, _or(weight, idx), _or(valid, idx), _or(bias, idx), _or(keep, idx), _or(key_mask, idx),
                out, grad_out, lse, _or(dq, q), dkv[0], dkv[-1], _or(dweight, lse), _or(dbias, lse),
                _or(global_seed, idx), H, Nq, Nk, num_slots, ctx.scale, ctx.keep_scale, ctx.threshold, global_programs,
                *row_strides(q), *row_strides(k), *row_strides(v), *row_strides(out), *row_strides(grad_out),
                *row_strides(dkv[0].transpose(1, 2)),
                NEED_WEIGHT=need_weight, NEED_BIAS=need_bias, **meta,
            )  # fmt: skip
        if dkv.dtype != k.dtype:
            dkv = dkv.to(k.dtype)
        dkv = dkv.transpose(2, 3)  # (2 or 1, B, H, Nk, d)
        none = (None,) * 10
        return dq, dkv[0] if dot else None, dkv[-1], dweight, dbias, *none


def _meta(
    head_dim: int, entries: int, dot_product: bool, weight, valid, bias, keep, key_mask, global_rows: int,
    global_seed: Tensor | None, keep_hash: bool,
) -> dict:  # fmt: skip
    return {
        **query_tile_meta(head_dim),
        "J": entries,
        "DOT": dot_product,
        "HAS_WEIGHT": weight is not None,
        "HAS_VALID": valid is not None,
        "HAS_BIAS": bias is not None,
        "HAS_KEEP": keep is not None,
        "KEEP_HASH": keep_hash,  # `keep` is the seed of the hashed mask (`hashing.grid_keep`), not a mask
        **row_meta(global_rows, key_mask, global_seed),
    }


def gathered_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    valid: Tensor | None = None,
    *,
    weight: Tensor | None = None,
    logit_bias: Tensor | None = None,
    dot_product: bool = True,
    scale: float | None = None,
    keep: Tensor | None = None,
    dropout_p: float = 0.0,
    global_rows: int = 0,
    key_valid: Tensor | None = None,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
) -> Tensor:
    """Triton implementation of [`attnzoo.kernels.gathered_attention`] with an explicit dropout keep-mask `keep`
    (B, H, Nq, K), or the seed of a hashed one that the kernels regenerate (`keep_seed`), or neither; arguments as
    there (and checked there). q, k and v share one dtype among fp32, bf16 and fp16; the result has it too.
    `global_rows` and `key_valid`: the global queries' dense rows, computed in the kernels (up to
    `MAX_FUSED_GLOBALS` of them, with the dot product; otherwise replaced after the kernel), with the dropout mask
    hashed from `global_seed` (`None`: no dropout on them)."""
    check_dtypes(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if idx.dim() == 4:
        idx = idx[..., None]
        weight = None if weight is None else weight[..., None]
    if valid is not None:
        # Invalid slots may hold padding such as -1: the kernel masks their loads, the index only has to exist.
        valid = valid.contiguous().view(torch.uint8)
    keep_scale = 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)
    keep = keep_argument(keep, keep_seed)
    if weight is not None:
        weight = weight.contiguous()
    if logit_bias is not None:
        logit_bias = logit_bias.expand(idx.shape[:4]).contiguous()
    fused = global_rows if dot_product and global_rows <= MAX_FUSED_GLOBALS else 0
    key_mask = key_valid.contiguous().view(torch.uint8) if fused and key_valid is not None else None
    out = GatheredAttentionTriton.apply(
        q, k, v, weight, logit_bias, idx.contiguous(), valid, keep, keep_scale, scale, dot_product, key_mask, fused,
        global_seed if fused else None, keep_threshold(dropout_p),
    )  # fmt: skip
    if global_rows and not fused:
        out = replace_global_rows(out, q, k, v, key_valid, global_rows, **row_settings(scale, dropout_p, global_seed))
    return out

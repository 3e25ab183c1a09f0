"""Triton CSR edge attention: segment softmax fused with the SpMM, one pass over each row's edges.

Edges are sorted by query row and described by CSR row pointers. For edge `e = (r, c)`:
`s_e = scale * <q_r, k_c> + bias_e`, `p` = softmax of `s` over the edges of row `r`, and
`out_r = sum_e p_e keep_e weight_e v_c` (dropout keep factor and edge weight after the softmax, without
renormalisation, as FSAT's confidences require).

Forward: one program per query row walks its edges in chunks of `BLOCK_E` with an online softmax (running max and
sum, FlashAttention style) and fp32 accumulation, then stores the row and its log-sum-exp. Backward: one program per
row recomputes the scores from the log-sum-exp, writes dQ and the bias / weight gradients of its edges and adds dK /
dV into fp32 buffers with atomics; nothing of size `E x d` is ever stored. Empty rows give zeros; duplicate edges
count separately (nothing coalesces them), exactly like the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..csr import row_pointers
from ..edgelist import sort_edges
from ..global_rows import replace_global_rows, row_settings
from ..hashing import keep_threshold
from .global_rows import MAX_FUSED_GLOBALS, global_rows_bwd, global_rows_fwd, replaced_rows, row_meta
from .hashing import is_seed, keep_argument, keep_factor
from .launch import block_d, check_dtypes, dense
from .launch import pointer_or as _or

# Edges per chunk: 16 with 4 warps compiled without register spills for d = 64 and 128 (sm_90, bf16, every option
# on); 32 spilled in backward at d = 128 with fewer warps.
BLOCK_E = 16
NUM_WARPS = 4
TAIL_BLOCK = 1024  # padding edges per program of `_zero_padding_edges`


@triton.jit
def _row_offset(row, per_head, H, s_b, s_h, s_n):
    """Offset (int64) of the flat head-major row `row = (b H + h) per_head + i` in a `(B, H, per_head, d)` tensor with
    these strides (a `(rows, d)` tensor is `per_head = rows`, `H = 1`). The divisions run in `row`'s own dtype: int32
    for int32 edge lists, where integer division is several times cheaper than in int64."""
    bh = row // per_head
    i = row - bh * per_head
    b = bh // H
    h = bh - b * H
    return b.to(tl.int64) * s_b + h.to(tl.int64) * s_h + i.to(tl.int64) * s_n


@triton.jit
def _query_row(row, Q, CROW, n, H, sq_b, sq_h, sq_n, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """Query row `row` (int64): `offset` (of the row in q, the output and dq, which share strides), `start, end`
    (its edges), `dim, dim_ok` and the query (BLOCK_D,) in fp32."""
    offset = _row_offset(row, n, H, sq_b, sq_h, sq_n)
    dim = tl.arange(0, BLOCK_D)
    q = tl.load(Q + offset + dim, mask=dim < D, other=0.0).to(tl.float32)
    return offset, tl.load(CROW + row), tl.load(CROW + row + 1), dim, dim < D, q


@triton.jit
def _replaced(row, KEY_MASK, n, m, H, GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr):
    """Whether head-split row `row` is a real global query, whose output the global-row programs write, as a (1,)
    block (all False without them)."""
    bh = row // n
    i = row - bh * n + tl.arange(0, 1)
    return replaced_rows(KEY_MASK, bh // H, m, i, GLOBALS, KEYS, GLOBAL_ROWS)


@triton.jit
def _edge_chunk(
    K, V, COLS, BIAS, q, e0, end, dim, dim_ok, m, H, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale,
    BLOCK_E: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """Edges `e0 .. e0 + BLOCK_E` of the row (those below `end`): edge ids, validity, load mask, the offsets of their
    key and value rows (which dK and dV share), the gathered key and value rows (BLOCK_E, BLOCK_D) and the logits
    (-inf on lanes past the row's end)."""
    edge = e0 + tl.arange(0, BLOCK_E)
    ok = edge < end
    mask = ok[:, None] & dim_ok[None, :]
    col = tl.load(COLS + edge, mask=ok, other=0)  # int32 or int64, as the edge list
    k_off = _row_offset(col, m, H, sk_b, sk_h, sk_n)
    v_off = _row_offset(col, m, H, sv_b, sv_h, sv_n)
    k_rows = tl.load(K + k_off[:, None] + dim[None, :], mask=mask, other=0.0).to(tl.float32)
    v_rows = tl.load(V + v_off[:, None] + dim[None, :], mask=mask, other=0.0).to(tl.float32)
    score = tl.sum(k_rows * q[None, :], 1) * scale  # (BLOCK_E,)
    if HAS_BIAS:
        score += tl.load(BIAS + edge, mask=ok, other=0.0).to(tl.float32)
    return edge, ok, mask, k_off, v_off, k_rows, v_rows, tl.where(ok, score, float("-inf"))


@triton.jit
def _edge_fwd_row(
    row, Q, K, V, CROW, COLS, BIAS, WEIGHT, KEEP, KEY_MASK, OUT, LSE, scale, keep_scale, keep_threshold,
    n, m, H, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_KEEP: tl.constexpr, KEEP_HASH: tl.constexpr,
    GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
):  # fmt: skip
    """Forward of one query row over its edges."""
    q_off, start, end, dim, dim_ok, q = _query_row(row, Q, CROW, n, H, sq_b, sq_h, sq_n, D, BLOCK_D)
    row_max = tl.full([1], float("-inf"), tl.float32)
    row_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for e0 in range(start, end, BLOCK_E):
        edge, ok, _, _, _, _, v_rows, score = _edge_chunk(
            K, V, COLS, BIAS, q, e0, end, dim, dim_ok, m, H, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, BLOCK_E,
            HAS_BIAS,
        )  # fmt: skip
        m_new = tl.maximum(row_max, tl.max(score, 0))
        # Only -inf so far (masked edges): a finite shift keeps exp(-inf - shift) = 0 instead of NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(row_max - shift)
        p = tl.exp(score - shift)
        row_sum = row_sum * alpha + tl.sum(p, 0)
        if HAS_KEEP:
            p = p * keep_factor(KEEP, edge, 0 * edge, 0 * edge, edge, ok, keep_scale, keep_threshold, KEEP_HASH)
        if HAS_WEIGHT:
            p = p * tl.load(WEIGHT + edge, mask=ok, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v_rows, 0)
        row_max = m_new
    has_mass = row_sum > 0.0
    out = acc / tl.where(has_mass, row_sum, 1.0)
    # A global query's row and log-sum-exp are its global program's.
    kept = ~_replaced(row, KEY_MASK, n, m, H, GLOBALS, KEYS, GLOBAL_ROWS)
    tl.store(OUT + q_off + dim, out.to(OUT.dtype.element_ty), mask=dim_ok & kept)
    # Empty rows store lse = 0, so backward recomputes exact-zero probabilities for them.
    lse = tl.where(has_mass, row_max + tl.log(tl.where(has_mass, row_sum, 1.0)), 0.0)
    tl.store(LSE + row + tl.arange(0, 1), lse, mask=kept)


@triton.jit
def _edge_fwd(
    Q, K, V, CROW, COLS, BIAS, WEIGHT, KEEP, KEY_MASK, OUT, LSE, SEED, scale, keep_scale, keep_threshold,
    global_programs, n, m, H, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_KEEP: tl.constexpr, KEEP_HASH: tl.constexpr,
    GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr, GLOBAL_DROPOUT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # With global rows, their `B * H` programs come first, so that their loops over every key start early and
    # overlap the row programs (kernels/triton/global_rows.py); the output shares q's strides.
    pid = tl.program_id(0).to(tl.int64)
    if GLOBAL_ROWS and pid < global_programs:
        global_rows_fwd(
            pid, Q, K, V, KEY_MASK, OUT, LSE, SEED, H, n, m, scale, keep_threshold, keep_scale,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sq_b, sq_h, sq_n,
            D, BLOCK_D, BLOCK_G, BLOCK_N, GLOBALS, KEYS, GLOBAL_DROPOUT,
        )  # fmt: skip
    else:
        _edge_fwd_row(
            pid - global_programs, Q, K, V, CROW, COLS, BIAS, WEIGHT, KEEP, KEY_MASK, OUT, LSE, scale, keep_scale,
            keep_threshold, n, m, H, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
            D, BLOCK_D, BLOCK_E, HAS_BIAS, HAS_WEIGHT, HAS_KEEP, KEEP_HASH, GLOBALS, KEYS, GLOBAL_ROWS,
        )  # fmt: skip


@triton.jit
def _edge_bwd_row(
    row, Q, K, V, CROW, COLS, BIAS, WEIGHT, KEEP, KEY_MASK, DO, OUT, LSE, DQ, DK, DV, DBIAS, DWEIGHT, scale,
    keep_scale, keep_threshold, n, m, H, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_KEEP: tl.constexpr, KEEP_HASH: tl.constexpr,
    NEED_BIAS: tl.constexpr, NEED_WEIGHT: tl.constexpr,
    GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr,
):  # fmt: skip
    """Backward of one query row over its edges."""
    q_off, start, end, dim, dim_ok, q = _query_row(row, Q, CROW, n, H, sq_b, sq_h, sq_n, D, BLOCK_D)
    do = tl.load(DO + _row_offset(row, n, H, sdo_b, sdo_h, sdo_n) + dim, mask=dim_ok, other=0.0).to(tl.float32)
    kept = ~_replaced(row, KEY_MASK, n, m, H, GLOBALS, KEYS, GLOBAL_ROWS)  # (1,)
    # A global query's method row was replaced: it reaches nothing. An infinite log-sum-exp makes its recomputed
    # probabilities, and with them every gradient of its edges, exact zeros (its edges' gradients are still written).
    lse = tl.where(kept, tl.load(LSE + row + tl.arange(0, 1)), float("inf"))  # (1,)
    out = tl.load(OUT + q_off + dim, mask=dim_ok, other=0.0).to(tl.float32)
    delta = tl.sum(do * out, 0)  # rowsum(dO * O), of the output as written
    dq = tl.zeros([BLOCK_D], tl.float32)
    for e0 in range(start, end, BLOCK_E):
        edge, ok, mask, k_off, v_off, k_rows, v_rows, score = _edge_chunk(
            K, V, COLS, BIAS, q, e0, end, dim, dim_ok, m, H, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, scale, BLOCK_E,
            HAS_BIAS,
        )  # fmt: skip
        p = tl.exp(score - lse)  # recomputed probabilities, (BLOCK_E,)
        grad_final = tl.sum(v_rows * do[None, :], 1)  # d loss / d (p * keep * weight)
        factor = tl.where(ok, 1.0, 0.0)
        if HAS_KEEP:
            # the hashed mask's position: head 0, row 0, column the edge (`hashing.position_keep`)
            zero = 0 * edge
            factor = factor * keep_factor(KEEP, edge, zero, zero, edge, ok, keep_scale, keep_threshold, KEEP_HASH)
        if NEED_WEIGHT:
            tl.store(DWEIGHT + edge, p * factor * grad_final, mask=ok)
        if HAS_WEIGHT:
            factor = factor * tl.load(WEIGHT + edge, mask=ok, other=0.0).to(tl.float32)
        grad_s = tl.where(ok, p * (grad_final * factor - delta), 0.0)  # delta = sum_e p_e grad_final_e factor_e
        if NEED_BIAS:
            tl.store(DBIAS + edge, grad_s, mask=ok)
        dq += tl.sum(grad_s[:, None] * k_rows, 0) * scale
        # dK / dV are fp32 buffers with k's and v's strides, shared by every row: atomic adds.
        mask = mask & kept[:, None]
        tl.atomic_add(DK + k_off[:, None] + dim[None, :], (grad_s * scale)[:, None] * q[None, :], mask=mask)
        tl.atomic_add(DV + v_off[:, None] + dim[None, :], (p * factor)[:, None] * do[None, :], mask=mask)
    tl.store(DQ + q_off + dim, dq.to(DQ.dtype.element_ty), mask=dim_ok & kept)  # a global query's: its program's


@triton.jit
def _edge_bwd(
    Q, K, V, CROW, COLS, BIAS, WEIGHT, KEEP, KEY_MASK, DO, OUT, LSE, DQ, DK, DV, DBIAS, DWEIGHT, SEED, scale,
    keep_scale, keep_threshold, global_programs, n, m, H, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
    sdo_b, sdo_h, sdo_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_KEEP: tl.constexpr, KEEP_HASH: tl.constexpr,
    NEED_BIAS: tl.constexpr, NEED_WEIGHT: tl.constexpr,
    GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr, GLOBAL_DROPOUT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    if GLOBAL_ROWS and pid < global_programs:  # first, as in the forward; dQ, the output shares q's strides, dK
        global_rows_bwd(  # and dV k's and v's (by atomics: LSE is DELTA's placeholder)
            pid, Q, K, V, KEY_MASK, OUT, DO, LSE, LSE, DQ, DK, DV, SEED, H, n, m, scale, keep_threshold, keep_scale,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sq_b, sq_h, sq_n, sdo_b, sdo_h, sdo_n,
            sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, D, BLOCK_D, BLOCK_G, BLOCK_N, GLOBALS, KEYS, True,
            GLOBAL_DROPOUT,
        )  # fmt: skip
    else:
        _edge_bwd_row(
            pid - global_programs, Q, K, V, CROW, COLS, BIAS, WEIGHT, KEEP, KEY_MASK, DO, OUT, LSE, DQ, DK, DV, DBIAS,
            DWEIGHT, scale, keep_scale, keep_threshold, n, m, H, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
            sdo_b, sdo_h, sdo_n, D, BLOCK_D, BLOCK_E, HAS_BIAS, HAS_WEIGHT, HAS_KEEP, KEEP_HASH, NEED_BIAS,
            NEED_WEIGHT, GLOBALS, KEYS, GLOBAL_ROWS,
        )  # fmt: skip


def _rows(t: Tensor) -> tuple[int, int, int, int, int]:
    """`(rows per head, heads, batch stride, head stride, row stride)` of a `(rows, d)` or `(B, H, rows, d)` tensor."""
    if t.dim() == 2:
        return t.shape[0], 1, 0, 0, t.stride(0)
    return t.shape[2], t.shape[1], *t.stride()[:3]


@triton.jit
def _zero_padding_edges(CROW, DBIAS, DWEIGHT, num_rows, num_edges, BLOCK: tl.constexpr, NEED_BIAS: tl.constexpr,
                        NEED_WEIGHT: tl.constexpr):  # fmt: skip
    """Zero gradients of the padding edges (past `crow[num_rows]`), which no row's program visits."""
    edge = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tail = (edge >= tl.load(CROW + num_rows)) & (edge < num_edges)
    if NEED_BIAS:
        tl.store(DBIAS + edge, tl.zeros([BLOCK], tl.float32), mask=tail)
    if NEED_WEIGHT:
        tl.store(DWEIGHT + edge, tl.zeros([BLOCK], tl.float32), mask=tail)


class EdgeAttentionTriton(torch.autograd.Function):
    """Autograd wrapper of the two kernels; see [`edge_attention_triton`] for the arguments. q, k and v are dense
    (`launch.dense`); the output and dq are made like q, the fp32 dK and dV buffers like k and v."""

    @staticmethod
    def forward(
        ctx, q, k, v, bias, weight, crow, cols, keep, keep_scale, scale, key_mask, global_rows, global_seed, threshold
    ):
        n, H, *q_strides = _rows(q)
        m, _, *k_strides = _rows(k)
        _, _, *v_strides = _rows(v)
        num_rows = crow.shape[0] - 1
        out = torch.empty_like(q)
        lse = torch.empty(num_rows, dtype=torch.float32, device=q.device)
        meta = _meta(q.shape[-1], bias, weight, keep, key_mask, global_rows, global_seed, is_seed(keep))
        global_programs = num_rows // n if global_rows else 0  # one per (batch, head)
        if num_rows > 0:
            _edge_fwd[(global_programs + num_rows,)](
                q, k, v, crow, cols, _or(bias, q), _or(weight, q), _or(keep, cols), _or(key_mask, crow), out, lse,
                _or(global_seed, crow), scale, keep_scale, threshold, global_programs, n, m, H, *q_strides,
                *k_strides, *v_strides, **meta,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, bias, weight, crow, cols, keep, key_mask, out, lse, global_seed)
        ctx.keep_scale, ctx.scale, ctx.global_rows, ctx.threshold = keep_scale, scale, global_rows, threshold
        return out

    @staticmethod
    # A hand-written backward: a second derivative through it must fail loudly, not come out wrong or cryptic.
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, bias, weight, crow, cols, keep, key_mask, out, lse, global_seed = ctx.saved_tensors
        n, H, *q_strides = _rows(q)
        m, _, *k_strides = _rows(k)
        _, _, *v_strides = _rows(v)
        num_rows = crow.shape[0] - 1
        need_bias = bias is not None and ctx.needs_input_grad[3]
        need_weight = weight is not None and ctx.needs_input_grad[4]
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        # Each row's program writes its dq and its edges' gradients once (the padding edges' are zeroed apart); the
        # keys' and values' gradients are atomic fp32 sums, from zero, in one buffer, cast once at the end.
        dq = torch.empty_like(q)
        dkv = torch.zeros(k.numel() + v.numel(), dtype=torch.float32, device=q.device)
        dk, dv = _like_kv(dkv, k, v)
        dbias = torch.empty(cols.shape, dtype=torch.float32, device=q.device) if need_bias else None
        dweight = torch.empty(cols.shape, dtype=torch.float32, device=q.device) if need_weight else None
        if (need_bias or need_weight) and cols.numel() > 0:
            _zero_padding_edges[(triton.cdiv(cols.numel(), TAIL_BLOCK),)](
                crow, _or(dbias, dk), _or(dweight, dk), num_rows, cols.numel(), BLOCK=TAIL_BLOCK,
                NEED_BIAS=need_bias, NEED_WEIGHT=need_weight,
            )  # fmt: skip
        global_programs = num_rows // n if ctx.global_rows else 0
        if num_rows > 0:
            _edge_bwd[(global_programs + num_rows,)](
                q, k, v, crow, cols, _or(bias, q), _or(weight, q), _or(keep, cols), _or(key_mask, crow), grad_out,
                out, lse, dq, dk, dv, _or(dbias, dk), _or(dweight, dk), _or(global_seed, crow), ctx.scale,
                ctx.keep_scale, ctx.threshold, global_programs, n, m, H, *q_strides, *k_strides,
                *v_strides, *_rows(grad_out)[2:], NEED_BIAS=need_bias, NEED_WEIGHT=need_weight,
                **_meta(q.shape[-1], bias, weight, keep, key_mask, ctx.global_rows, global_seed, is_seed(keep)),
            )  # fmt: skip
        if dkv.dtype != k.dtype:
            dk, dv = _like_kv(dkv.to(k.dtype), k, v)
        return dq, dk, dv, dbias, dweight, None, None, None, None, None, None, None, None, None


def _like_kv(flat: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Views of a flat buffer of `k.numel() + v.numel()` elements with k's and v's shapes and strides (both dense)."""
    first, second = flat.split((k.numel(), v.numel()))
    return first.as_strided(k.shape, k.stride()), second.as_strided(v.shape, v.stride())


def _meta(
    head_dim: int, bias, weight, keep, key_mask, global_rows: int, global_seed: Tensor | None, keep_hash: bool
) -> dict:
    return {
        "D": head_dim,
        "BLOCK_D": block_d(head_dim),
        "BLOCK_E": BLOCK_E,
        "num_warps": NUM_WARPS,
        "HAS_BIAS": bias is not None,
        "HAS_WEIGHT": weight is not None,
        "HAS_KEEP": keep is not None,
        "KEEP_HASH": keep_hash,  # `keep` is the seed of the hashed mask (`hashing.position_keep`), not a mask
        **row_meta(global_rows, key_mask, global_seed),
    }


def edge_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    cols: Tensor,
    *,
    logit_bias: Tensor | None,
    edge_weight: Tensor | None,
    scale: float | None,
    keep: Tensor | None,
    dropout_p: float,
    sorted_rows: bool,
    crow: Tensor | None = None,
    global_rows: int = 0,
    key_valid: Tensor | None = None,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
) -> Tensor:
    """Triton implementation of [`attnzoo.kernels.edge_attention`] with an explicit dropout keep-mask `keep` (E,)
    in the caller's edge order, or the seed of a hashed one (`keep_seed`, with `sorted_rows`: the kernels regenerate
    each edge's decision from its position), or neither; arguments as there (and checked there): q, k, v flat
    `(rows, d)` or head-split `(B, H, rows, d)` (read in place, any dense layout), the result shaped and laid out as
    q. q, k and v share one dtype among fp32, bf16 and fp16; the result has it too. `crow`: the row pointers of
    sorted rows, if the caller has them. `global_rows` and `key_valid`: the global queries' dense rows, computed in
    the kernels (up to `MAX_FUSED_GLOBALS` of them; more are replaced after the kernel), with the dropout mask
    hashed from `global_seed` (`None`: no dropout on them)."""
    check_dtypes(q, k, v)
    num_rows = q.shape[:-1].numel()
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if not sorted_rows:
        rows, cols, (logit_bias, edge_weight, keep) = sort_edges(rows, cols, num_rows, logit_bias, edge_weight, keep)
    if crow is None:
        crow = row_pointers(rows, num_rows)
    q, k, v = (dense(t) for t in (q, k, v))
    keep_scale = 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)
    if keep_seed is not None and not sorted_rows:
        raise ValueError("keep_seed hashes the edges' positions: it needs edges the caller sorted (sorted_rows=True)")
    keep = keep_argument(keep, keep_seed)
    bias = None if logit_bias is None else logit_bias.contiguous()
    weight = None if edge_weight is None else edge_weight.contiguous()
    fused = global_rows if global_rows <= MAX_FUSED_GLOBALS else 0
    key_mask = key_valid.contiguous().view(torch.uint8) if fused and key_valid is not None else None
    cols = cols.contiguous()
    seed = global_seed if fused else None
    out = EdgeAttentionTriton.apply(
        q, k, v, bias, weight, crow, cols, keep, keep_scale, scale, key_mask, fused, seed, keep_threshold(dropout_p)
    )
    if global_rows and not fused:
        out = replace_global_rows(out, q, k, v, key_valid, global_rows, **row_settings(scale, dropout_p, global_seed))
    return out

"""Triton pieces shared by the kernels that compute the global queries' dense rows themselves.

A family with global tokens replaces the output rows of its first `g` (real) queries by dense softmax attention over
every real key ([`attnzoo.core.global_tokens`]). A kernel that takes this over runs `B * H` extra programs first (one
per (batch, head): their loops over every key start early and overlap the method's many short programs), each
computing the `g <= 16` rows with an online softmax over key tiles; in backward the same programs write those rows'
dQ and either add their dK / dV into the fp32 buffers the method's atomics fill (`SCATTER`), or store their
`rowsum(dO * O)` for a key-major pass of the method's own that adds them per key (FSAT's, which has no atomics). The
method's own programs skip the replaced rows' outputs and take no gradient from them.

The real keys (`KEYS`, a compile-time switch): 0 every key is real; 1 `BEFORE` is the `(B, Nk)` int32 table of the
nearest real key at or before every position ([`key_tables`], which A²-Former's interpolation needs anyway): key `j`
is real when its entry is `j`; 2 `BEFORE` is the `(B, Nk)` padding mask itself, as uint8 (no table to build).

Attention dropout (`DROPOUT`): the rows' keep mask is the counter hash of the call's seed (`SEED`, a `()` int64
tensor) and of (batch * heads + head, query, key) (`hashing.keep_at`), regenerated in backward: no mask is stored,
and the torch rows (`attnzoo.kernels.dense.global_rows_keep`) draw the same one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .hashing import keep_at

# Global queries per (batch, head) program: tl.dot's smallest tile; more fall back to the torch rows.
MAX_FUSED_GLOBALS = 16
BLOCK_N = 64  # keys per tile of the global rows' loops


@triton.jit
def load_rows(X, s_b, s_h, s_n, b, h, positions, dim, mask):
    """Rows `positions` (BLOCK_M,) of head (b, h) of a `(B, H, N, d)` tensor with the given strides, in fp32."""
    ptr = X + b * s_b + h * s_h + positions[:, None].to(tl.int64) * s_n + dim[None, :]
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_M, BLOCK_D)


@triton.jit
def _cummax(a, b):
    return tl.maximum(a, b)


@triton.jit
def _cummin(a, b):
    return tl.minimum(a, b)


@triton.jit
def _real_neighbours(VALID, BEFORE, AFTER, REAL, num_keys, BLOCK: tl.constexpr):
    """One program per sample: the nearest real key at or before / at or after every position (-1 / `Nk` where
    there is none) and the number of real keys (at least 1: the density's denominator)."""
    b = tl.program_id(0).to(tl.int64)
    base = b * num_keys
    lanes = tl.arange(0, BLOCK)
    last_seen = tl.full([], -1, tl.int32)
    count = tl.zeros([], tl.int32)
    for start in range(0, num_keys, BLOCK):
        index = start + lanes
        ok = index < num_keys
        real = tl.load(VALID + base + index, mask=ok, other=0) != 0
        run = tl.maximum(tl.associative_scan(tl.where(real, index, -1), 0, _cummax), last_seen)
        tl.store(BEFORE + base + index, run, mask=ok)
        last_seen = tl.max(run, 0)
        count += tl.sum(real.to(tl.int32), 0)
    next_seen = tl.full([], 0, tl.int32) + num_keys
    for start in range(0, num_keys, BLOCK):
        index = num_keys - 1 - start - lanes  # walking down from the end
        ok = index >= 0
        real = tl.load(VALID + base + index, mask=ok, other=0) != 0
        run = tl.minimum(tl.associative_scan(tl.where(real, index, num_keys), 0, _cummin), next_seen)
        tl.store(AFTER + base + index, run, mask=ok)
        next_seen = tl.min(run, 0)
    tl.store(REAL + b, tl.maximum(count, 1))


@triton.jit
def is_real(BEFORE, b, num_keys, keys, KEYS: tl.constexpr):
    """Whether each of the keys (an int32 vector: a scalar would meet an interpreter bug in `&`) is real: with the
    table (`KEYS` 1, or True), its nearest real key at or before it is itself; with the mask (`KEYS` 2), its entry."""
    if KEYS == 2:
        return tl.load(BEFORE + b * num_keys + keys) != 0
    if KEYS:
        return tl.load(BEFORE + b * num_keys + keys) == keys
    return keys >= 0


@triton.jit
def replaced_rows(BEFORE, b, num_keys, rows, GLOBALS: tl.constexpr, KEYS: tl.constexpr, GLOBAL_ROWS: tl.constexpr):
    """Which rows are real global queries whose output the global-row programs compute (none without them)."""
    if GLOBAL_ROWS:
        return (rows < GLOBALS) & is_real(BEFORE, b, num_keys, tl.minimum(rows, GLOBALS - 1), KEYS)
    return rows < 0


@triton.jit
def _key_tile(
    K, V, BEFORE, q, b, h, keys, dim, dim_ok, num_keys, scale, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
    KEYS: tl.constexpr,
):  # fmt: skip
    """One tile of keys for the global queries' dense rows (forward and backward): `keys, key_ok, tile_mask`, the
    key and value rows `(BLOCK_N, BLOCK_D)` (zero where not a real key) and the scaled scores `(BLOCK_G, BLOCK_N)`."""
    key_ok = (keys < num_keys) & is_real(BEFORE, b, num_keys, tl.minimum(keys, num_keys - 1), KEYS)
    tile_mask = key_ok[:, None] & dim_ok[None, :]
    k_tile = load_rows(K, sk_b, sk_h, sk_n, b, h, keys, dim, tile_mask)  # (BLOCK_N, BLOCK_D)
    v_tile = load_rows(V, sv_b, sv_h, sv_n, b, h, keys, dim, tile_mask)
    scores = tl.dot(q, tl.trans(k_tile), input_precision="ieee") * scale  # (BLOCK_G, BLOCK_N)
    return keys, key_ok, tile_mask, k_tile, v_tile, scores


@triton.jit
def dropout_factor(SEED, bh, row, key, keep_threshold, keep_scale):
    """The inverted-dropout factor of the global query `row` against `key` of flat head `bh` (broadcast together):
    `keep_scale` where the hash keeps the entry, else 0 (`attnzoo.kernels.dense.global_rows_keep`'s mask)."""
    return tl.where(keep_at(tl.load(SEED), bh, row, key, keep_threshold), keep_scale, 0.0)


@triton.jit
def global_rows_fwd(
    bh, Q, K, V, BEFORE, OUT, LSE, SEED, num_heads, lse_rows, num_keys, scale, keep_threshold, keep_scale,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, GLOBALS: tl.constexpr,
    KEYS: tl.constexpr, DROPOUT: tl.constexpr,
):  # fmt: skip
    """The global queries of one (batch, head): dense softmax attention over every real key (online softmax over
    key tiles), replacing the method's rows for the real ones; their log-sum-exps go to `LSE`, `lse_rows` per
    (batch, head) (the method's own rows' buffer, or one of the global rows' own)."""
    b, h = bh // num_heads, bh % num_heads
    rows = tl.arange(0, BLOCK_G)
    real = replaced_rows(BEFORE, b, num_keys, rows, GLOBALS, KEYS, True)
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    q = load_rows(Q, sq_b, sq_h, sq_n, b, h, rows, dim, real[:, None] & dim_ok[None, :])  # (BLOCK_G, BLOCK_D)
    row_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    lanes = tl.arange(0, BLOCK_N)
    for start in range(0, num_keys, BLOCK_N):
        keys, key_ok, tile_mask, k_tile, v_tile, scores = _key_tile(
            K, V, BEFORE, q, b, h, start + lanes, dim, dim_ok, num_keys, scale,
            sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, KEYS,
        )  # fmt: skip
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(row_max, tl.max(scores, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(row_max - shift)
        p = tl.exp(scores - shift[:, None])
        row_sum = row_sum * alpha + tl.sum(p, 1)  # the softmax's sum, before dropout
        if DROPOUT:
            p = p * dropout_factor(SEED, bh, rows[:, None], keys[None, :], keep_threshold, keep_scale)
        acc = acc * alpha[:, None] + tl.dot(p, v_tile, input_precision="ieee")
        row_max = m_new
    has_mass = row_sum > 0.0
    out = acc / tl.where(has_mass, row_sum, 1.0)[:, None]
    o_ptr = OUT + b * so_b + h * so_h + rows[:, None].to(tl.int64) * so_n + dim[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=real[:, None] & dim_ok[None, :])
    lse = tl.where(has_mass, row_max + tl.log(tl.where(has_mass, row_sum, 1.0)), 0.0)
    tl.store(LSE + bh * lse_rows + rows, lse, mask=real)


@triton.jit
def scatter_rows(DX, stride, keys, grad, mask, dim):
    """`DX[keys] += grad` into the rows (`stride` apart) of one (batch, head) of an fp32 buffer, by relaxed atomics:
    the additions are independent, so no ordering between them is needed."""
    tl.atomic_add(DX + keys[:, None].to(tl.int64) * stride + dim[None, :], grad, mask=mask, sem="relaxed")


@triton.jit
def global_rows_bwd(
    bh, Q, K, V, BEFORE, OUT, DO, LSE, DELTA, DQ, DK, DV, SEED, num_heads, lse_rows, num_keys, scale, keep_threshold,
    keep_scale,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n, sdo_b, sdo_h, sdo_n,
    sdq_b, sdq_h, sdq_n, sdk_b, sdk_h, sdk_n, sdv_b, sdv_h, sdv_n,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, GLOBALS: tl.constexpr,
    KEYS: tl.constexpr, SCATTER: tl.constexpr, DROPOUT: tl.constexpr,
):  # fmt: skip
    """Backward of the global queries' dense rows of one (batch, head): dQ of those rows, and with `SCATTER` their
    dK / dV of every key (fp32 atomics), else their `rowsum(dO * O)` into `DELTA` (laid out as `LSE`) for the
    method's key-major pass (which regenerates their dropout mask with [`dropout_factor`])."""
    b, h = bh // num_heads, bh % num_heads
    rows = tl.arange(0, BLOCK_G)
    real = replaced_rows(BEFORE, b, num_keys, rows, GLOBALS, KEYS, True)
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    row_mask = real[:, None] & dim_ok[None, :]
    q = load_rows(Q, sq_b, sq_h, sq_n, b, h, rows, dim, row_mask)  # (BLOCK_G, BLOCK_D)
    do = load_rows(DO, sdo_b, sdo_h, sdo_n, b, h, rows, dim, row_mask)
    delta = tl.sum(do * load_rows(OUT, so_b, so_h, so_n, b, h, rows, dim, row_mask), 1)
    lse = tl.load(LSE + bh * lse_rows + rows, mask=real, other=0.0)
    if not SCATTER:
        tl.store(DELTA + bh * lse_rows + rows, delta, mask=real)
    dk = DK + b * sdk_b + h * sdk_h
    dv = DV + b * sdv_b + h * sdv_h
    dq = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    lanes = tl.arange(0, BLOCK_N)
    for start in range(0, num_keys, BLOCK_N):
        keys, key_ok, tile_mask, k_tile, v_tile, scores = _key_tile(
            K, V, BEFORE, q, b, h, start + lanes, dim, dim_ok, num_keys, scale,
            sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, KEYS,
        )  # fmt: skip
        p = tl.where(real[:, None] & key_ok[None, :], tl.exp(scores - lse[:, None]), 0.0)
        grad_p = tl.dot(do, tl.trans(v_tile), input_precision="ieee")
        kept = p
        if DROPOUT:  # out = sum_j p_j f_j v_j: the gradient of p_j is f_j <dO, v_j>
            factor = dropout_factor(SEED, bh, rows[:, None], keys[None, :], keep_threshold, keep_scale)
            grad_p = grad_p * factor
            kept = p * factor
        grad_s = p * (grad_p - delta[:, None]) * scale
        dq += tl.dot(grad_s, k_tile, input_precision="ieee")
        if SCATTER:
            scatter_rows(dk, sdk_n, keys, tl.dot(tl.trans(grad_s), q, input_precision="ieee"), tile_mask, dim)
            scatter_rows(dv, sdv_n, keys, tl.dot(tl.trans(kept), do, input_precision="ieee"), tile_mask, dim)
    dq_ptr = DQ + b * sdq_b + h * sdq_h + rows[:, None].to(tl.int64) * sdq_n + dim[None, :]
    tl.store(dq_ptr, dq.to(DQ.dtype.element_ty), mask=row_mask)


def row_meta(global_rows: int, key_mask, global_seed) -> dict:
    """The compile-time switches of the global rows in a kernel that reads the padding mask as uint8 (`KEYS` 2):
    the edge and gathered kernels'; `global_rows` fused rows (0: none), their hashed dropout with a seed."""
    return {
        "GLOBALS": max(global_rows, 1),
        "KEYS": 0 if key_mask is None else 2,  # the padding mask as uint8 (is_real)
        "GLOBAL_ROWS": global_rows > 0,
        "GLOBAL_DROPOUT": global_seed is not None,
        "BLOCK_G": MAX_FUSED_GLOBALS,
        "BLOCK_N": BLOCK_N,
    }


def key_tables(key_valid: Tensor, block: int = 1024) -> tuple[Tensor, Tensor, Tensor]:
    """The nearest real key at or before / at or after every position `(B, Nk)` int32 (-1 / `Nk` where there is
    none) and the number of real keys per sample `(B,)` int32 (at least 1), in one launch that scans the keys in
    chunks of `block` (a power of two)."""
    B, Nk = key_valid.shape
    before = torch.empty(B, Nk, dtype=torch.int32, device=key_valid.device)
    after = torch.empty(B, Nk, dtype=torch.int32, device=key_valid.device)
    real = torch.empty(B, dtype=torch.int32, device=key_valid.device)
    if B > 0 and Nk > 0:
        valid = key_valid if key_valid.is_contiguous() else key_valid.contiguous()
        _real_neighbours[(B,)](valid.view(torch.uint8), before, after, real, Nk, BLOCK=block)
    return before, after, real

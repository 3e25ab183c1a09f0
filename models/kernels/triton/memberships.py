"""Triton kernels of SBM's membership network (CUDA's path): the memberships `σ(MLP(x) Cᵀ + bias)` of the queries or
keys in one launch, and their backward in two.

The torch code they replace (`SBMAttention.selection`, which stays the reference and the CPU path) runs the two-layer
ReLU MLP, casts its output to fp32, multiplies it by the fp32 cluster embeddings, adds the bias, applies the sigmoid
and zeroes the padded rows: about ten ops forward. Its backward, which fastRG's estimator runs after recomputing the
forward, is about thirty: every GEMM and elementwise step of the chain, a cast per parameter and the sums of the bias
gradients. Here:

- [`_memberships_fwd`]: a program takes a tile of rows of one head, runs the MLP on them (values of the parameters'
  dtype multiplied in IEEE fp32, where their products are exact, and summed in fp32, as the zoo's other kernels do;
  each layer's output rounded to the parameters' dtype as torch's linear layers round it), then the cluster logits
  in fp32 (the features and the embeddings are both values of the parameters' dtype, as in the reference's fp32
  GEMM) and the memberships;
- [`_memberships_bwd`]: a program takes every S-th tile of one head, recomputes the tile's forward, writes the
  gradient of its input rows and accumulates the gradients of the five parameters over its tiles in registers (the
  gradients between the layers rounded to the parameters' dtype as the reference's autograd rounds them), then
  writes them as one row of partial sums (no atomics);
- [`_sum_partials`]: sums the partial rows of each parameter (over the programs of a head; also over the heads for
  the MLP shared by the heads) in order and writes the gradients in the parameters' dtype, in one flat buffer whose
  slices are the five gradients.

A call takes the queries and the keys together (their inputs and masks apart: one launch each), so the parameters'
gradients of both are summed by the one reduction.

The rates of the fastRG draws from the memberships, `(Q̂ Ŝ) z` and their row sums, are one launch as well
([`fastrg_weights_triton`]; no backward: the graph is sampled without autograd).

The block matrix `Ŝ = softmax(C Cᵀ)` (over all `K²` entries of a head) is one launch ([`_block_matrix_fwd`], a
program per head) in place of a cast, a GEMM and a softmax, and its backward one more ([`_block_matrix_bwd`], which
recomputes `Ŝ` from `C` rather than keeping it) in place of the softmax's backward, two GEMMs, an add, a cast and the
copies between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch import block_d, dense, row_strides
from .launch import pointer_or as _or

BLOCK_R = 32  # rows per tile
FWD_WARPS, BWD_WARPS = 4, 8
#: Largest head size and number of clusters of one tile (the backward keeps the clusters' gradient, `K x d` fp32,
#: in registers); larger ones run the torch code.
MAX_HEAD_DIM = MAX_CLUSTERS = 128
#: Tiles per program of the backward, at least: the partial sums, `(H x programs)` rows of `2 d² + 2 d + K d` fp32,
#: then stay below the layer's FFN activation at any length.
TILES_PER_PROGRAM = 16
MAX_PROGRAMS_PER_HEAD = 64
SUM_BLOCK = 1024


def _block_warps(num_clusters: int) -> int:
    """Warps of a block-matrix program, which holds a few `K x K` fp32 tiles of its head in registers."""
    return 4 if num_clusters <= 32 else 8 if num_clusters <= 64 else 16


@triton.jit
def _features(
    X, W1, B1, W2, B2, row_off, row_ok, h, D, sw_h, sw_i, sw_o, sb_h,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The MLP of a tile of rows: `(x, hidden, features)`, `(BLOCK_R, BLOCK_D)` each, values of the parameters' dtype
    held in fp32 (the hidden layer after the ReLU)."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    pdt = W1.dtype.element_ty
    x = tl.load(X + row_off[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    x = x.to(pdt).to(tl.float32)
    w_off = h * sw_h + d[:, None] * sw_i + d[None, :] * sw_o  # (in, out)
    w_ok = d_ok[:, None] & d_ok[None, :]
    w1 = tl.load(W1 + w_off, mask=w_ok, other=0.0).to(tl.float32)
    b1 = tl.load(B1 + h * sb_h + d, mask=d_ok, other=0.0).to(tl.float32)
    pre = (tl.dot(x, w1, input_precision="ieee") + b1[None, :]).to(pdt).to(tl.float32)
    hidden = tl.where(pre > 0, pre, 0.0)
    w2 = tl.load(W2 + w_off, mask=w_ok, other=0.0).to(tl.float32)
    b2 = tl.load(B2 + h * sb_h + d, mask=d_ok, other=0.0).to(tl.float32)
    features = (tl.dot(hidden, w2, input_precision="ieee") + b2[None, :]).to(pdt).to(tl.float32)
    return x, hidden, features


@triton.jit
def _memberships_fwd(
    X, VALID, W1, B1, W2, B2, C, OUT,
    n, H, D, K, sx_g, sx_h, sx_n, sv_g, sw_h, sw_i, sw_o, sb_h, logit_bias,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, HAS_VALID: tl.constexpr,
):  # fmt: skip
    # The (example, head) pairs on the grid's first axis: CUDA caps the second at 65,535.
    gh = tl.program_id(0).to(tl.int64)  # g * H + h
    i = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)  # positions
    g = gh // H
    h = gh % H
    row_ok = i < n
    row_off = g * sx_g + h * sx_h + i.to(tl.int64) * sx_n
    _, _, features = _features(X, W1, B1, W2, B2, row_off, row_ok, h, D, sw_h, sw_i, sw_o, sb_h, BLOCK_D)
    d = tl.arange(0, BLOCK_D)
    c = tl.arange(0, BLOCK_K)
    c_ok = c < K
    clusters_t = tl.load(C + h * K * D + c[None, :] * D + d[:, None], mask=c_ok[None, :] & (d < D)[:, None], other=0.0)
    # Both factors are values of the parameters' dtype: their products are exact in fp32, as in the reference's GEMM.
    logits = tl.dot(features, clusters_t.to(tl.float32), input_precision="ieee")  # (BLOCK_R, BLOCK_K)
    memb = tl.sigmoid(logits + logit_bias)
    if HAS_VALID:
        real = tl.load(VALID + g * sv_g + i, mask=row_ok, other=0) != 0
        memb = tl.where(real[:, None], memb, 0.0)
    tl.store(OUT + (gh * n + i)[:, None] * K + c[None, :], memb, mask=row_ok[:, None] & c_ok[None, :])


@triton.jit
def _memberships_bwd(
    X, VALID, W1, B1, W2, B2, C, GRAD, DX, PART,
    n, H, D, K, num_tiles, tiles_n, part_row, part_cols, sx_g, sx_h, sx_n, sv_g, sw_h, sw_i, sw_o, sb_h, logit_bias,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, HAS_VALID: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    programs = tl.num_programs(0)
    h = tl.program_id(1).to(tl.int64)
    pdt = W1.dtype.element_ty
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    c = tl.arange(0, BLOCK_K)
    c_ok = c < K
    w_off = h * sw_h + d[:, None] * sw_i + d[None, :] * sw_o  # (in, out)
    w_ok = d_ok[:, None] & d_ok[None, :]
    w1 = tl.load(W1 + w_off, mask=w_ok, other=0.0).to(tl.float32)
    w2 = tl.load(W2 + w_off, mask=w_ok, other=0.0).to(tl.float32)
    clusters = tl.load(C + h * K * D + c[:, None] * D + d[None, :], mask=c_ok[:, None] & d_ok[None, :], other=0.0)
    clusters = clusters.to(tl.float32)  # (BLOCK_K, BLOCK_D)
    grad_w1 = tl.zeros([BLOCK_D, BLOCK_D], tl.float32)  # (in, out)
    grad_w2 = tl.zeros([BLOCK_D, BLOCK_D], tl.float32)
    grad_b1 = tl.zeros([BLOCK_D], tl.float32)
    grad_b2 = tl.zeros([BLOCK_D], tl.float32)
    grad_c = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
    for t in range(s, num_tiles, programs):
        g = (t // tiles_n).to(tl.int64)
        i = (t % tiles_n) * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = i < n
        row_off = g * sx_g + h * sx_h + i.to(tl.int64) * sx_n
        x, hidden, features = _features(X, W1, B1, W2, B2, row_off, row_ok, h, D, sw_h, sw_i, sw_o, sb_h, BLOCK_D)
        logits = tl.dot(features, tl.trans(clusters), input_precision="ieee")  # (BLOCK_R, BLOCK_K)
        sig = tl.sigmoid(logits + logit_bias)
        flat = (g * H + h) * n + i  # the row in the memberships
        ok = row_ok[:, None] & c_ok[None, :]
        if HAS_VALID:
            ok = ok & (tl.load(VALID + g * sv_g + i, mask=row_ok, other=0) != 0)[:, None]
        grad = tl.load(GRAD + flat[:, None] * K + c[None, :], mask=ok, other=0.0)
        grad_logits = grad * sig * (1.0 - sig)  # 0 on padded rows and past the tile
        grad_c += tl.dot(tl.trans(grad_logits), features, input_precision="ieee")
        # The features' gradient in the parameters' dtype, as the reference's cast back from fp32 writes it.
        grad_f = tl.dot(grad_logits, clusters, input_precision="ieee").to(pdt).to(tl.float32)  # (BLOCK_R, BLOCK_D)
        grad_w2 += tl.dot(tl.trans(hidden), grad_f, input_precision="ieee")
        grad_b2 += tl.sum(grad_f, 0)
        grad_hidden = tl.dot(grad_f, tl.trans(w2), input_precision="ieee").to(pdt).to(tl.float32)
        grad_pre = tl.where(hidden > 0, grad_hidden, 0.0)
        grad_w1 += tl.dot(tl.trans(x), grad_pre, input_precision="ieee")
        grad_b1 += tl.sum(grad_pre, 0)
        grad_x = tl.dot(grad_pre, tl.trans(w1), input_precision="ieee")
        # dx is made like x (`launch.dense`): the same offsets
        dx_mask = row_ok[:, None] & d_ok[None, :]
        tl.store(DX + row_off[:, None] + d[None, :], grad_x.to(DX.dtype.element_ty), mask=dx_mask)
    # This program's partial sums, each parameter in its own layout (what the reduction writes out as it is).
    base = PART + (h * part_row + s) * part_cols
    w_within = d[:, None] * sw_i + d[None, :] * sw_o
    tl.store(base + w_within, grad_w1, mask=w_ok)
    tl.store(base + D * D + d, grad_b1, mask=d_ok)
    tl.store(base + D * D + D + w_within, grad_w2, mask=w_ok)
    tl.store(base + 2 * D * D + D + d, grad_b2, mask=d_ok)
    tl.store(base + 2 * D * D + 2 * D + c[:, None] * D + d[None, :], grad_c, mask=c_ok[:, None] & d_ok[None, :])


@triton.jit
def _sum_partials(
    PART, EXTRA, OUT, mlp_heads, H, D, K, rows_per_head, part_cols, total, max_count,
    BLOCK: tl.constexpr, HAS_EXTRA: tl.constexpr,
):  # fmt: skip
    """`OUT` = `[dW1 | db1 | dW2 | db2 | dC]`, each of every head it has, flat, in the parameters' dtype: the sum
    of the partial rows of its head (of all heads for an MLP shared by the heads), and for dC the block matrix's
    gradient `EXTRA` `(H, K, d)` fp32 (one rounding to the parameters' dtype for both)."""
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = q < total
    dd = D * D
    e1 = mlp_heads * dd
    e2 = e1 + mlp_heads * D
    e3 = e2 + mlp_heads * dd
    e4 = e3 + mlp_heads * D
    # (start in OUT, first column): dW1 (0, 0), db1 (e1, dd), dW2 (e2, dd + D), db2 (e3, 2 dd + D), dC (e4, 2 dd + 2 D)
    start = tl.where(q < e1, 0, tl.where(q < e2, e1, tl.where(q < e3, e2, tl.where(q < e4, e3, e4))))
    column = tl.where(q < e1, 0, tl.where(q < e2, dd, tl.where(q < e3, dd + D, 2 * dd + D)))
    column = tl.where(q < e4, column, 2 * dd + 2 * D)
    size = tl.where((q < e1) | ((q >= e2) & (q < e3)), dd, tl.where(q < e4, D, K * D))
    head = (q - start) // size
    column += (q - start) % size
    # An MLP shared by the heads sums the partial rows of all heads; the clusters are per head.
    shared = (q < e4) & (mlp_heads == 1)
    first = tl.where(shared, 0, head * rows_per_head)
    count = tl.where(shared, H * rows_per_head, rows_per_head)
    acc = tl.zeros([BLOCK], tl.float32)
    for r in range(0, max_count):
        acc += tl.load(PART + (first + r) * part_cols + column, mask=ok & (r < count), other=0.0)
    if HAS_EXTRA:
        acc += tl.load(EXTRA + (q - e4), mask=ok & (q >= e4), other=0.0)
    tl.store(OUT + q, acc.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _block_softmax(C, h, K, D, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """`(C_h in fp32 (BLOCK_K, BLOCK_D), Ŝ_h (BLOCK_K, BLOCK_K), the mask of its K x K entries)`."""
    u = tl.arange(0, BLOCK_K)
    d = tl.arange(0, BLOCK_D)
    u_ok = u < K
    clusters = tl.load(C + h * K * D + u[:, None] * D + d[None, :], mask=u_ok[:, None] & (d < D)[None, :], other=0.0)
    clusters = clusters.to(tl.float32)
    ok = u_ok[:, None] & u_ok[None, :]
    logits = tl.where(ok, tl.dot(clusters, tl.trans(clusters), input_precision="ieee"), float("-inf"))
    shifted = tl.exp(logits - tl.max(tl.max(logits, 1), 0))  # 0 off the K x K entries
    return clusters, shifted / tl.sum(tl.sum(shifted, 1), 0), ok


@triton.jit
def _block_matrix_fwd(C, S, K, D, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0).to(tl.int64)
    _, blocks, ok = _block_softmax(C, h, K, D, BLOCK_K, BLOCK_D)
    u = tl.arange(0, BLOCK_K)
    tl.store(S + h * K * K + u[:, None] * K + u[None, :], blocks, mask=ok)


@triton.jit
def _block_matrix_bwd(C, GRAD, DC, K, D, sg_h, sg_u, sg_v, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0).to(tl.int64)
    clusters, blocks, ok = _block_softmax(C, h, K, D, BLOCK_K, BLOCK_D)
    u = tl.arange(0, BLOCK_K)
    d = tl.arange(0, BLOCK_D)
    grad = tl.load(GRAD + h * sg_h + u[:, None] * sg_u + u[None, :] * sg_v, mask=ok, other=0.0).to(tl.float32)
    # The softmax over all K² entries, then the logits C Cᵀ: dC = (dL + dLᵀ) C.
    grad_logits = blocks * (grad - tl.sum(tl.sum(grad * blocks, 1), 0))
    grad_c = tl.dot(grad_logits + tl.trans(grad_logits), clusters, input_precision="ieee")  # (BLOCK_K, BLOCK_D)
    c_mask = (u < K)[:, None] & (d < D)[None, :]
    tl.store(DC + h * K * D + u[:, None] * D + d[None, :], grad_c.to(DC.dtype.element_ty), mask=c_mask)


def _block_meta(num_clusters: int, head_dim: int) -> dict:
    return {"BLOCK_K": block_d(num_clusters), "BLOCK_D": block_d(head_dim), "num_warps": _block_warps(num_clusters)}


class _BlockMatrix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, clusters: Tensor) -> Tensor:
        H, K, D = clusters.shape
        blocks = torch.empty(H, K, K, dtype=torch.float32, device=clusters.device)
        if blocks.numel():
            _block_matrix_fwd[(H,)](clusters, blocks, K, D, **_block_meta(K, D))
        ctx.save_for_backward(clusters)
        return blocks

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (clusters,) = ctx.saved_tensors
        H, K, D = clusters.shape
        grad_clusters = torch.empty_like(clusters, memory_format=torch.contiguous_format)
        if grad_clusters.numel():
            # Read in its own layout (autograd hands the transposed gradient of a product over)
            _block_matrix_bwd[(H,)](clusters, grad, grad_clusters, K, D, *grad.stride(), **_block_meta(K, D))
        return grad_clusters


@torch.compiler.disable  # eager under torch.compile (a graph break), as the families' other Triton Functions
def block_matrix_triton(clusters: Tensor) -> Tensor:
    """SBM's block matrices `Ŝ = softmax(C Cᵀ)`, a softmax over all `K²` entries of each head, differentiable.

    Args:
        clusters (`torch.Tensor` of shape `(H, K, d)`): the cluster embeddings, in any of the kernels' dtypes (their
            products are taken in fp32).

    Returns:
        `torch.Tensor` of shape `(H, K, K)`, fp32.
    """
    H, K, D = clusters.shape
    if not membership_kernels_support(D, K):
        raise ValueError(f"head size {D} and {K} clusters: the kernels take at most {MAX_HEAD_DIM} and {MAX_CLUSTERS}")
    return _BlockMatrix.apply(clusters if clusters.is_contiguous() else clusters.contiguous())


@triton.jit
def _fastrg_weights(
    QM, BLOCKS, TOTALS, W, ROW_RATES, n, H, K,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0).to(tl.int64)  # (example, head) pairs first: CUDA caps the grid's second axis at 65,535
    i = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    h = bh % H
    u = tl.arange(0, BLOCK_K)
    u_ok = u < K
    row_ok = i < n
    rows = bh * n + i
    memb = tl.load(QM + rows[:, None] * K + u[None, :], mask=row_ok[:, None] & u_ok[None, :], other=0.0)
    blocks = tl.load(BLOCKS + h * K * K + u[:, None] * K + u[None, :], mask=u_ok[:, None] & u_ok[None, :], other=0.0)
    totals = tl.load(TOTALS + bh * K + u, mask=u_ok, other=0.0)
    weights = tl.dot(memb, blocks, input_precision="ieee") * totals[None, :]  # (BLOCK_R, BLOCK_K)
    tl.store(W + rows[:, None] * K + u[None, :], weights, mask=row_ok[:, None] & u_ok[None, :])
    tl.store(ROW_RATES + rows, tl.sum(weights, 1), mask=row_ok)


@torch.compiler.disable  # eager under torch.compile (a graph break), as the families' other Triton Functions
def fastrg_weights_triton(q_memb: Tensor, blocks: Tensor, cluster_totals: Tensor) -> tuple[Tensor, Tensor]:
    """The rates of SBM's fastRG draws (`attnzoo.sbm.fastrg.sampler_inputs`, whose torch code is the reference):
    `weights = (Q̂ Ŝ) z` and their sums over the clusters, in one launch instead of a GEMM, a product and a sum.

    Args:
        q_memb (`torch.Tensor` of shape `(B, H, n, K)`): query memberships, fp32.
        blocks (`torch.Tensor` of shape `(H, K, K)`): block matrices, fp32.
        cluster_totals (`torch.Tensor` of shape `(B, H, K)`): `z`, the key memberships' sums, fp32.

    Returns:
        `(weights, row_rates)`: `(B, H, n, K)` and `(B, H, n)`, fp32.
    """
    B, H, n, K = q_memb.shape
    if not membership_kernels_support(1, K):
        raise ValueError(f"{K} clusters: the kernels take at most {MAX_CLUSTERS}")
    q_memb, blocks, cluster_totals = (t.to(torch.float32).contiguous() for t in (q_memb, blocks, cluster_totals))
    weights = torch.empty_like(q_memb)
    row_rates = torch.empty(B, H, n, dtype=torch.float32, device=q_memb.device)
    if weights.numel():
        _fastrg_weights[(B * H, triton.cdiv(n, BLOCK_R))](
            q_memb, blocks, cluster_totals, weights, row_rates, n, H, K,
            BLOCK_R=BLOCK_R, BLOCK_K=block_d(K), num_warps=FWD_WARPS,
        )  # fmt: skip
    return weights, row_rates


@dataclass(frozen=True)
class MembershipSettings:
    """What one call fixes besides its tensors: the logit bias, whether the MLP is shared by the heads, and the
    masks of the padded rows of each input (`(G, n)` uint8 or None), which get no gradient."""

    logit_bias: float
    shared: bool
    valids: tuple[Tensor | None, ...]


def _mlp_strides(weight: Tensor, shared: bool) -> tuple[int, int, int, int]:
    """`(head, in, out)` strides of an MLP weight and the head stride of its bias: `nn.Linear`'s `(out, in)` weight
    shared by the heads, or `HeadwiseMLP`'s `(H, in, out)`."""
    D = weight.shape[-1]
    if shared:
        return 0, 1, D, 0
    return D * D, D, 1, D


class _Memberships(torch.autograd.Function):
    @staticmethod
    def forward(ctx, settings: MembershipSettings, weight1, bias1, weight2, bias2, clusters, *xs):
        H, K, D = clusters.shape
        sw_h, sw_i, sw_o, sb_h = _mlp_strides(weight1, settings.shared)
        outs = []
        for x, valid in zip(xs, settings.valids, strict=True):
            G, _, n, _ = x.shape
            out = torch.empty(G, H, n, K, dtype=torch.float32, device=x.device)
            if out.numel():
                _memberships_fwd[(G * H, triton.cdiv(n, BLOCK_R))](
                    x, _or(valid, out), weight1, bias1, weight2, bias2, clusters, out,
                    n, H, D, K, *row_strides(x), 0 if valid is None else valid.stride(0), sw_h, sw_i, sw_o, sb_h,
                    settings.logit_bias,
                    BLOCK_R=BLOCK_R, BLOCK_D=block_d(D), BLOCK_K=block_d(K), HAS_VALID=valid is not None,
                    num_warps=FWD_WARPS,
                )  # fmt: skip
            outs.append(out)
        blocks = torch.empty(H, K, K, dtype=torch.float32, device=clusters.device)
        _block_matrix_fwd[(H,)](clusters, blocks, K, D, **_block_meta(K, D))
        ctx.settings = settings
        ctx.save_for_backward(weight1, bias1, weight2, bias2, clusters, *xs)
        return (*outs, blocks)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        weight1, bias1, weight2, bias2, clusters, *xs = ctx.saved_tensors
        settings = ctx.settings
        *grads, grad_blocks = grads
        H, K, D = clusters.shape
        sw_h, sw_i, sw_o, sb_h = _mlp_strides(weight1, settings.shared)
        # Each input with a gradient: its programs per head (enough tiles each that the partial sums stay small).
        launches = []
        for j, (x, grad) in enumerate(zip(xs, grads, strict=True)):
            G, _, n, _ = x.shape
            tiles_n = triton.cdiv(n, BLOCK_R)
            if grad is None or G * tiles_n == 0:
                continue
            programs = max(1, min(MAX_PROGRAMS_PER_HEAD, G * tiles_n // TILES_PER_PROGRAM))
            launches.append((j, tiles_n, programs))
        part_row = sum(launch[-1] for launch in launches)  # partial rows per head
        part_cols = 2 * D * D + 2 * D + K * D
        mlp_heads = 1 if settings.shared else H
        total = mlp_heads * (2 * D * D + 2 * D) + H * K * D
        flat = torch.empty(total, dtype=weight1.dtype, device=weight1.device)
        grad_xs = [None if grad is None else torch.empty_like(x) for x, grad in zip(xs, grads, strict=True)]
        # The block matrix's part of dC, in fp32: the reduction adds it before rounding.
        extra = None
        if grad_blocks is not None:
            extra = torch.empty(H, K, D, dtype=torch.float32, device=clusters.device)
            _block_matrix_bwd[(H,)](clusters, grad_blocks, extra, K, D, *grad_blocks.stride(), **_block_meta(K, D))
        part = flat  # a placeholder pointer when no input has a gradient (the reduction then reads no row)
        if part_row:
            part = torch.empty(H, part_row, part_cols, dtype=torch.float32, device=weight1.device)
            row0 = 0
            for j, tiles_n, programs in launches:
                x, valid, grad = xs[j], settings.valids[j], grads[j].to(torch.float32).contiguous()
                G, _, n, _ = x.shape
                _memberships_bwd[(programs, H)](
                    x, _or(valid, x), weight1, bias1, weight2, bias2, clusters, grad, grad_xs[j],
                    part[:, row0:],
                    n, H, D, K, G * tiles_n, tiles_n, part_row, part_cols, *row_strides(x),
                    0 if valid is None else valid.stride(0), sw_h, sw_i, sw_o, sb_h, settings.logit_bias,
                    BLOCK_R=BLOCK_R, BLOCK_D=block_d(D), BLOCK_K=block_d(K), HAS_VALID=valid is not None,
                    num_warps=BWD_WARPS,
                )  # fmt: skip
                row0 += programs
        _sum_partials[(triton.cdiv(total, SUM_BLOCK),)](
            part, _or(extra, part), flat, mlp_heads, H, D, K, part_row, part_cols, total,
            H * part_row if settings.shared else part_row, BLOCK=SUM_BLOCK, HAS_EXTRA=extra is not None,
        )  # fmt: skip
        sizes = [weight1.numel(), bias1.numel(), weight2.numel(), bias2.numel(), clusters.numel()]
        params = (weight1, bias1, weight2, bias2, clusters)
        grads_params = [part.view(p.shape) for part, p in zip(flat.split(sizes), params, strict=True)]
        return None, *grads_params, *grad_xs


def membership_kernels_support(head_dim: int, num_clusters: int) -> bool:
    """Whether [`memberships_triton`] takes this head size and number of clusters (one tile each)."""
    return head_dim <= MAX_HEAD_DIM and num_clusters <= MAX_CLUSTERS


@torch.compiler.disable  # eager under torch.compile (a graph break), as the families' other Triton Functions
def memberships_triton(
    inputs: tuple[tuple[Tensor, Tensor | None], ...],
    weight1: Tensor,
    bias1: Tensor,
    weight2: Tensor,
    bias2: Tensor,
    clusters: Tensor,
    *,
    logit_bias: float,
    shared: bool,
) -> tuple[Tensor, ...]:
    """SBM's memberships `σ(MLP(x) Cᵀ + logit_bias)` of each input and the block matrices, differentiable in the inputs
    and the parameters.

    Args:
        inputs (`tuple` of `(x, valid)`): `x` `(G, H, n, d)` (the last axis contiguous), the queries or keys before the
            network, in any of the kernels' dtypes (cast to the parameters'); `valid` `(G, n)` bool marks the real
            rows (`None`: all real): a padded row's memberships are 0.
        weight1, bias1, weight2, bias2: the two-layer ReLU MLP: `nn.Linear`'s `(d, d)` weights and `(d,)` biases
            when `shared` (one MLP for all heads), else `(H, d, d)` `(in, out)` weights and `(H, d)` biases.
        clusters (`torch.Tensor` of shape `(H, K, d)`): the cluster embeddings `C`, in the MLP's dtype.
        logit_bias (`float`): added to every logit before the sigmoid.
        shared (`bool`): one MLP for all heads.

    Returns:
        `tuple` of `torch.Tensor`: the memberships of each input, `(G, H, n, K)` fp32, then the block matrices
        `Ŝ = softmax(C Cᵀ)` `(H, K, K)` fp32 (as [`block_matrix_triton`]; in this call, the two parts of the cluster
        embeddings' gradient are summed in fp32 and rounded once).
    """
    H, K, D = clusters.shape
    params = (weight1, bias1, weight2, bias2, clusters)
    if len({p.dtype for p in params}) != 1:
        raise ValueError(f"the membership network's parameters must share one dtype, got {[p.dtype for p in params]}")
    if not membership_kernels_support(D, K):
        raise ValueError(f"head size {D} and {K} clusters: the kernels take at most {MAX_HEAD_DIM} and {MAX_CLUSTERS}")
    params = tuple(p if p.is_contiguous() else p.contiguous() for p in params)
    xs, valids = [], []
    for x, valid in inputs:
        if x.dim() != 4 or x.shape[1] != H or x.shape[3] != D:
            raise ValueError(f"inputs must be (G, {H}, n, {D}), got {tuple(x.shape)}")
        xs.append(dense(x))  # its input gradient is made like it, and written at the same offsets
        if valid is not None:
            valid = valid.contiguous().view(torch.uint8)
        valids.append(valid)
    settings = MembershipSettings(logit_bias=float(logit_bias), shared=shared, valids=tuple(valids))
    return _Memberships.apply(settings, *params, *xs)

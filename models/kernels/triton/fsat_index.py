"""Triton kernels of FSAT's index prediction and slot selection (CUDA's path): one launch from the pooled cross to the
slots, one back to the predictor's input.

The torch code they replace (`FSATAttention.predict_indices` and `select_slots`, which stay the reference and the CPU
path) casts the cross, the weight and the bias to fp32, runs the linear, adds the key-position prior, applies the
sigmoid and the scale, then floors the predictions, drops those out of range and appends the exploration slots (about
ten ops forward, fifteen in training). [`fsat_index_slots_triton`] computes the same in one kernel:

- the logits `cross W^T + b (+ prior)` in fp32: the tiles of the cross and of the weight are converted to fp32 in
  registers and multiplied in IEEE fp32 (no TF32), so the products of bf16 inputs are exact and the sums fp32, as in
  the cast-then-fp32 GEMM (up to the order of the sums);
- `mean = sigmoid(logits) * scale` for every slot of every head (an exploration slot `M + r` takes prediction
  `r mod M`, computed from the same weight row), and the slots' query positions: `floor(mean)` where below N, else -1,
  for the predicted slots; for the exploration slots `floor(u * L)` (clamped to N - 1) of the draws `u` (drawn by
  torch, as the reference draws them), mapped to the example's r-th real position under padding; under padding the
  slots of padded keys and those naming padded queries dropped (-1).

The backward ([`_IndexSlots`]) sums each prediction's gradient over its slots (and over the heads when the predictor
is shared), multiplies by `scale * s (1 - s)` with `s = mean / scale`, and writes `dlogits` and `d cross =
dlogits W` (fp32 products again); a second kernel reduces `dW = dlogits^T cross` and `db = sum(dlogits)` over the
rows, in order (no atomics), in fp32, and writes them in the parameters' dtypes. No torch op either way but the
exploration draws. The Function saves nothing the attention does not keep anyway: the cross (the keys' and values'
projections save it), the weight and the slots' predictions (the key-slot attention saves them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..key_slots import real_positions_first
from .launch import pointer_or as _or

BLOCK_R = 32  # (example, key) rows per program
BLOCK_K = 32  # channels per step of the products
NUM_WARPS = 4
# The predictor's gradient: a tile of outputs and channels per program, over every row.
DW_BLOCK_R, DW_BLOCK_K, DW_BLOCK_O = 64, 32, 16


@triton.jit
def _index_fwd(
    X, W, BIAS, PRIOR, SCALE, LENGTHS, U, VALID, REAL, MEAN, QUERY,
    rows_total, N, D, H, M, S, R, sx_r, sw_o, prior_b, scale_value, length_value,
    HEADS_PER_PROGRAM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_PRIOR: tl.constexpr, SCALE_PER_EXAMPLE: tl.constexpr, HAS_VALID: tl.constexpr, HAS_RANDOM: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # flat b * N + j
    hp = tl.program_id(1)  # the predictor's head
    row_ok = rows < rows_total
    b = rows // N
    j = rows % N
    c = tl.arange(0, BLOCK_S)  # slot
    c_ok = c < S
    w_rows = hp * M + c % M  # slot c's prediction is row hp * M + (c mod M) of the predictor
    acc = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    for k0 in range(0, D, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < D
        x = tl.load(X + rows[:, None] * sx_r + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + w_rows[None, :] * sw_o + k[:, None], mask=c_ok[None, :] & k_ok[:, None], other=0.0)
        acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
    logits = acc + tl.load(BIAS + w_rows, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_PRIOR:
        logits = logits + tl.load(PRIOR + b * prior_b + j, mask=row_ok, other=0.0)[:, None]
    scale = scale_value
    if SCALE_PER_EXAMPLE:
        scale = tl.load(SCALE + b, mask=row_ok, other=1.0)[:, None]
    mean = tl.sigmoid(logits) * scale
    # -1 (dropped) out of range, and for NaN, which fails the comparison; >= 0 otherwise, so the cast is the floor.
    query = tl.where(mean < N, mean, -1.0).to(tl.int32)
    store = row_ok[:, None] & c_ok[None, :]
    if HAS_VALID:
        key_real = tl.load(VALID + b * N + j, mask=row_ok, other=0) != 0
    if HAS_RANDOM:
        explore = (c >= M)[None, :]
        length = length_value
        if HAS_VALID:
            length = tl.load(LENGTHS + b, mask=row_ok, other=1.0)[:, None]
    for step in range(HEADS_PER_PROGRAM):
        h = hp * HEADS_PER_PROGRAM + step  # the shared predictor serves every head
        slot = ((b * H + h) * N + j)[:, None] * S + c[None, :]  # flat (b, h, j, s)
        q = query
        if HAS_RANDOM:
            draw = ((b * H + h) * N + j)[:, None] * R + (c - M)[None, :]
            u = tl.load(U + draw, mask=store & explore, other=0.0)
            rank = tl.minimum((u * length).to(tl.int32), N - 1)
            if HAS_VALID:  # the rank-th real position of the example
                rank = tl.load(REAL + b[:, None] * N + rank, mask=store & explore, other=0).to(tl.int32)
            q = tl.where(explore, rank, q)
        if HAS_VALID:
            query_real = tl.load(VALID + b[:, None] * N + tl.maximum(q, 0), mask=store, other=0) != 0
            q = tl.where(query_real & key_real[:, None], q, -1)
        tl.store(QUERY + slot, q, mask=store)
        tl.store(MEAN + slot, mean, mask=store)


@triton.jit
def _index_bwd(
    GRAD, MEAN, SCALE, W, DLOGITS, DX,
    rows_total, N, D, H, M, S, num_out, sw_o, scale_value, head_steps,
    SHARED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_O: tl.constexpr,
    SCALE_PER_EXAMPLE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # flat b * N + j
    row_ok = rows < rows_total
    b = rows // N
    j = rows % N
    o = tl.arange(0, BLOCK_O)  # the predictor's output (head hp, prediction m)
    o_ok = o < num_out
    m = o % M
    ok = row_ok[:, None] & o_ok[None, :]
    total = tl.zeros([BLOCK_R, BLOCK_O], tl.float32)
    # Each prediction's gradient: the sum over its slots (m, m + M, ...) and, for a shared predictor, over the heads.
    for step in range(head_steps):
        h = o // M
        if SHARED:
            h = tl.zeros([BLOCK_O], tl.int64) + step
        base = ((b[:, None] * H + h[None, :]) * N + j[:, None]) * S
        for s0 in range(0, S, M):
            s = s0 + m
            total += tl.load(GRAD + base + s[None, :], mask=ok & (s < S)[None, :], other=0.0)
    head = tl.zeros([BLOCK_O], tl.int64) if SHARED else o // M
    mean = tl.load(MEAN + ((b[:, None] * H + head[None, :]) * N + j[:, None]) * S + m[None, :], mask=ok, other=0.0)
    scale = scale_value
    if SCALE_PER_EXAMPLE:
        scale = tl.load(SCALE + b, mask=row_ok, other=1.0)[:, None]
    s = tl.where(scale != 0.0, mean / scale, 0.0)  # the sigmoid (an example without tokens has no gradient)
    dlogits = tl.where(ok, total * scale * (s * (1.0 - s)), 0.0)
    tl.store(DLOGITS + rows[:, None] * num_out + o[None, :], dlogits, mask=ok)
    for k0 in range(0, D, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < D
        w = tl.load(W + o[:, None] * sw_o + k[None, :], mask=o_ok[:, None] & k_ok[None, :], other=0.0)
        dx = tl.dot(dlogits, w.to(tl.float32), input_precision="ieee")
        tl.store(DX + rows[:, None] * D + k[None, :], dx.to(DX.dtype.element_ty), mask=row_ok[:, None] & k_ok[None, :])


@triton.jit
def _index_dweight(
    DLOGITS, X, DW, DB, rows_total, D, num_out, sx_r,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    """`dW = dlogits^T x` and `db = sum(dlogits)` for a tile of the predictor's outputs and channels, over every row
    in order (fp32 products and sums, no atomics), written in the parameters' dtypes."""
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    k_ok = k < D
    o_ok = o < num_out
    dw = tl.zeros([BLOCK_O, BLOCK_K], tl.float32)
    db = tl.zeros([BLOCK_O], tl.float32)
    for r0 in range(0, rows_total, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        row_ok = rows < rows_total
        dl = tl.load(
            DLOGITS + rows[None, :].to(tl.int64) * num_out + o[:, None],
            mask=o_ok[:, None] & row_ok[None, :],
            other=0.0,
        )  # (BLOCK_O, BLOCK_R)
        x = tl.load(
            X + rows[:, None].to(tl.int64) * sx_r + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        dw += tl.dot(dl, x.to(tl.float32), input_precision="ieee")
        db += tl.sum(dl, 1)
    tl.store(DW + o[:, None] * D + k[None, :], dw.to(DW.dtype.element_ty), mask=o_ok[:, None] & k_ok[None, :])
    if tl.program_id(0) == 0:
        tl.store(DB + o, db.to(DB.dtype.element_ty), mask=o_ok)


@dataclass(frozen=True)
class IndexSettings:
    """The shapes and switches of one call: heads `H`, the predictor's heads (`H` or 1), predictions `M` and
    exploration slots `R` per key, the scale when it is one number (else None: per example), and the range of the
    random ranks when it is one number."""

    num_heads: int
    predictor_heads: int
    num_predicted: int
    num_random: int
    scale: float | None
    length: int


class _IndexSlots(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cross, weight, bias, prior, scale, lengths, u, valid, real_positions, settings: IndexSettings):
        B, N, D = cross.shape
        H, M, R = settings.num_heads, settings.num_predicted, settings.num_random
        S = M + R
        x = cross.reshape(B * N, D)
        if x.stride(-1) != 1:
            x = x.contiguous()
        query = torch.empty(B, H, N, S, dtype=torch.int32, device=cross.device)
        mean = torch.empty(B, H, N, S, dtype=torch.float32, device=cross.device)
        heads_per_program = H // settings.predictor_heads
        if query.numel():
            placeholder = mean
            _index_fwd[(triton.cdiv(B * N, BLOCK_R), settings.predictor_heads)](
                x, weight, bias, _or(prior, placeholder), _or(scale, placeholder), _or(lengths, placeholder),
                _or(u, placeholder), _or(valid, placeholder), _or(real_positions, placeholder), mean, query,
                B * N, N, D, H, M, S, R, x.stride(0), weight.stride(0),
                0 if prior is None or prior.shape[0] == 1 else N, 1.0 if settings.scale is None else settings.scale,
                settings.length,
                HEADS_PER_PROGRAM=heads_per_program, BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K,
                BLOCK_S=max(16, triton.next_power_of_2(S)), HAS_PRIOR=prior is not None,
                SCALE_PER_EXAMPLE=settings.scale is None, HAS_VALID=valid is not None, HAS_RANDOM=R > 0,
                num_warps=NUM_WARPS,
            )  # fmt: skip
        ctx.mark_non_differentiable(query)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for the (integer) slots on the way back
        ctx.settings = settings
        ctx.save_for_backward(x, weight, mean, scale)
        ctx.bias_dtype = bias.dtype
        return query, mean

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, _grad_query, grad_mean):
        x, weight, mean, scale = ctx.saved_tensors
        settings = ctx.settings
        B, H, N, S = mean.shape
        D, num_out = x.shape[1], weight.shape[0]
        if grad_mean is None:
            return (None,) * 10
        grad_mean = grad_mean.to(torch.float32).contiguous()
        dlogits = torch.empty(B * N, num_out, dtype=torch.float32, device=x.device)
        dx = torch.empty(B * N, D, dtype=x.dtype, device=x.device)
        shared = settings.predictor_heads == 1 and H > 1
        if dlogits.numel():
            _index_bwd[(triton.cdiv(B * N, BLOCK_R),)](
                grad_mean, mean, _or(scale, mean), weight, dlogits, dx,
                B * N, N, D, H, settings.num_predicted, S, num_out, weight.stride(0),
                1.0 if settings.scale is None else settings.scale, H if shared else 1,
                SHARED=shared, BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K,
                BLOCK_O=max(16, triton.next_power_of_2(num_out)), SCALE_PER_EXAMPLE=settings.scale is None,
                num_warps=NUM_WARPS,
            )  # fmt: skip
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_weight = torch.empty(num_out, D, dtype=weight.dtype, device=x.device)
        grad_bias = torch.empty(num_out, dtype=ctx.bias_dtype, device=x.device)
        if (need_weight or need_bias) and grad_weight.numel():
            _index_dweight[(triton.cdiv(D, DW_BLOCK_K), triton.cdiv(num_out, DW_BLOCK_O))](
                dlogits, x, grad_weight, grad_bias, B * N, D, num_out, x.stride(0),
                BLOCK_R=DW_BLOCK_R, BLOCK_K=DW_BLOCK_K, BLOCK_O=DW_BLOCK_O, num_warps=NUM_WARPS,
            )  # fmt: skip
        return (
            dx.view(B, N, D) if need_x else None,
            grad_weight if need_weight else None,
            grad_bias if need_bias else None,
            *(None,) * 7,
        )


def fsat_index_slots_triton(
    cross: Tensor,
    weight: Tensor,
    bias: Tensor,
    prior: Tensor | None,
    scale: float | Tensor,
    valid: Tensor | None,
    num_heads: int,
    num_predicted: int,
    num_random: int,
) -> tuple[Tensor, Tensor]:
    """The slots `(query, mean)` `(B, H, N, M + R)` (int32, fp32) of `FSATAttention.select_slots(predict_indices())`.

    Args:
        cross (`torch.Tensor` of shape `(B, N, D)`): the pooled cross.
        weight, bias: the index predictor's, `(H' M, D)` and `(H' M,)` with `H'` = H or 1 (shared).
        prior (`torch.Tensor` of shape `(1 or B, 1, N, 1)`, *optional*): fp32 logit added to every prediction of key
            `j` (the `"key_position"` prior).
        scale (`float` or `torch.Tensor` of shape `(B, 1, 1, 1)`): the predictions' range (fp32 per example).
        valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real tokens (`None`: all real).
        num_heads, num_predicted, num_random: `H`, `M` and `R` (`R` = 0 outside training or without exploration).
            The exploration draws are `torch.rand(B, H, N, R)` from the global generator, as in the reference.
    """
    B, N, _ = cross.shape
    predictor_heads = weight.shape[0] // num_predicted
    if predictor_heads not in (1, num_heads) or weight.shape[0] != predictor_heads * num_predicted:
        raise ValueError(f"the index predictor must have {num_predicted} or {num_heads * num_predicted} outputs, got "
                         f"{weight.shape[0]}")  # fmt: skip
    u = lengths = real_positions = None
    if num_random:
        u = torch.rand(B, num_heads, N, num_random, device=cross.device)
        if valid is not None:
            lengths = valid.sum(-1, dtype=torch.float32)  # (B,)
            real_positions = real_positions_first(valid)  # (B, N), as the reference draws them
    per_example = isinstance(scale, Tensor)
    settings = IndexSettings(
        num_heads=num_heads,
        predictor_heads=predictor_heads,
        num_predicted=num_predicted,
        num_random=num_random,
        scale=None if per_example else float(scale),
        length=N,
    )
    scale_tensor = scale.reshape(B).to(torch.float32).contiguous() if per_example else None
    valid_bytes = None if valid is None else valid.contiguous().view(torch.uint8)
    prior = None if prior is None else prior.to(torch.float32).contiguous()
    return _IndexSlots.apply(
        cross, weight, bias, prior, scale_tensor, lengths, u, valid_bytes, real_positions, settings
    )

"""Gated softmax attention: softmax attention over the pairs a 0/1 gate opens, differentiable in the gate itself.

SBM's straight-through estimator needs, for every `(query, key)` pair, a gradient for a multiplicative gate on that
pair's softmax weight, also where the gate is closed (the pair was not sampled):

    o_i = Σ_j g_ij e^{s_ij} ρ_ij v_j / Σ_j g_ij e^{s_ij}
    ∂L/∂g_ij = (e^{s_ij} / Z_i) (ρ_ij ∂L/∂o_i · v_j - ∂L/∂o_i · o_i)

with `s` the scaled logits, `Z_i = Σ_j g_ij e^{s_ij}` and `ρ` the dropout multiplier (0 or 1/(1-p)). On a closed
pair that derivative (taken at `g_ij = 0`) carries the weight `e^{s_ij} / Z_i`, which has no bound: a key that scores
above the row's open keys gets a weight of many times 1. `closed_gradient="opening"` gives a closed pair instead the
first-order change of the loss when the pair opens: opening it moves `o_i` to
`o_i + w'_ij (ρ_ij v_j - o_i)` with `w'_ij = e^{s_ij} / (Z_i + e^{s_ij})`, the weight the key would get, so

    Δ_ij L ≈ w'_ij (ρ_ij ∂L/∂o_i · v_j - ∂L/∂o_i · o_i)

(exact for a loss linear in `o`), bounded like an attention weight. Open pairs keep the derivative in both modes.

An additive mask plus a second pass (recomputing `QKᵀ`, the log-sum-exp and `∂L/∂o vᵀ`) gives the same numbers; here
the forward keeps `e^{s_ij} / Z_i` of every pair, so the backward needs one `∂L/∂o vᵀ` product for the gate, the
logits' and the values' gradients together. [`gated_attention_reference`] is the same function written plainly for
autograd.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .dispatch import resolve_backend

#: what a closed pair's gate gradient is: the derivative at `g_ij = 0`, or the first-order change of opening the pair
CLOSED_GRADIENTS = ("derivative", "opening")

#: bound on `s_ij - max_l s_il` (max over open pairs) before the exponential: a closed pair's weight `e^{s_ij} / Z_i`
#: may exceed 1 (it is not in `Z_i`) and must stay finite, since the forward multiplies it by its zero gate
_MAX_LOG_WEIGHT = 30.0


def max_log_weight(dtype: torch.dtype) -> float:
    """[`_MAX_LOG_WEIGHT`], lowered for a dtype whose range it exceeds: fp16 overflows at e^11.1, and the gate's
    gradient multiplies the weight by another factor, so half of the exponent range is kept for it."""
    return min(_MAX_LOG_WEIGHT, 0.5 * math.log(torch.finfo(dtype).max))


class _GatedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, gate: Tensor, keep: Tensor | None, scale: float, opening: bool
    ) -> Tensor:
        # q: (B, H, n, d); k, v: (B, H, m, d); gate, keep: (B, H, n, m)
        weights = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)  # (B, H, n, m) logits s
        # Max over the open pairs: s where open, the dtype's minimum where closed, in float ops (on CPU a bool mask
        # and `masked_fill` take twice as long as these passes).
        lowest = torch.finfo(weights.dtype).min
        top = gate.sub(1.0).mul_(-lowest).addcmul_(weights, gate).amax(-1, keepdim=True)  # (B, H, n, 1)
        empty = top == lowest  # rows without an open pair
        top.masked_fill_(empty, 0.0)
        weights.sub_(top).clamp_(max=max_log_weight(weights.dtype)).exp_()  # e^{s - max}
        norm = torch.einsum("bhnm,bhnm->bhn", weights, gate).unsqueeze(-1)  # (B, H, n, 1) Z e^{-max}
        weights.div_(norm.masked_fill_(empty, 1.0)).masked_fill_(empty, 0.0)  # e^s / Z
        probs = weights * gate  # (B, H, n, m)
        if keep is not None:
            probs.mul_(keep)  # after dropout
        out = torch.matmul(probs, v)  # (B, H, n, d)
        ctx.save_for_backward(q, k, v, gate, keep, weights, out)
        ctx.scale, ctx.opening = scale, opening
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the in-place backward is not itself differentiable
    def backward(ctx, grad_out: Tensor):
        saved = ctx.saved_tensors  # read once: non-reentrant activation checkpointing refuses a second read
        with torch.autocast(grad_out.device.type, enabled=False):  # in the forward's dtype, as the forward ran
            return _GatedAttention._backward(ctx, saved, grad_out.to(saved[-1].dtype))

    @staticmethod
    def _backward(ctx, saved: tuple[Tensor, ...], grad_out: Tensor):
        q, k, v, gate, keep, weights, out = saved
        # ∂L/∂g = (e^s / Z) (ρ ∂L/∂o · v_j - ∂L/∂o · o), built in place in the one (B, H, n, m) buffer it needs.
        grad_gate = torch.matmul(grad_out, v.transpose(-1, -2))  # (B, H, n, m) ∂L/∂o · v_j
        if keep is not None:
            grad_gate.mul_(keep)
        grad_gate.sub_((grad_out * out).sum(-1, keepdim=True)).mul_(weights)
        if ctx.opening:
            # closed pairs: w / (1 + w) = e^s / (Z + e^s) instead of w; open pairs: divided by 1
            grad_gate.div_(torch.addcmul(torch.ones_like(weights), weights, 1.0 - gate))
        # The logits' gradient is the gate's on the open pairs: ∂L/∂s_ij = p_ij (∂L/∂p_ij - Σ_l p_il ∂L/∂p_il).
        grad_logits = grad_gate * gate
        grad_q = torch.matmul(grad_logits, k).mul_(ctx.scale) if ctx.needs_input_grad[0] else None
        grad_k = torch.matmul(grad_logits.transpose(-1, -2), q).mul_(ctx.scale) if ctx.needs_input_grad[1] else None
        grad_v = None
        if ctx.needs_input_grad[2]:
            probs = grad_logits.copy_(weights).mul_(gate)  # the buffer is free again
            if keep is not None:
                probs.mul_(keep)
            grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)
        return grad_q, grad_k, grad_v, (grad_gate if ctx.needs_input_grad[3] else None), None, None, None


def gated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gate: Tensor,
    *,
    keep: Tensor | None = None,
    scale: float | None = None,
    return_weights: bool = False,
    closed_gradient: str = "derivative",
    backend: str = "fast",
) -> tuple[Tensor, Tensor | None]:
    """Softmax attention over the pairs where `gate` is 1, with a gradient of the gate on every pair.

    Args:
        q (`torch.Tensor` of shape `(B, H, n, d)`): queries (fp32: SBM runs its attention in fp32).
        k, v (`torch.Tensor` of shape `(B, H, m, d)`): keys and values.
        gate (`torch.Tensor` of shape `(B, H, n, m)`): 1.0 on attended pairs, 0.0 elsewhere; its gradient is
            `∂L/∂g_ij` above on every open pair and, on closed pairs, what `closed_gradient` says (the
            straight-through estimator picks the pairs it wants).
        keep (`torch.Tensor` of shape `(B, H, n, m)`, *optional*): dropout multiplier of the softmax weights
            (0 or `1 / (1 - p)`); `None` is no dropout.
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        return_weights (`bool`, *optional*, defaults to `False`): also return the weights after dropout; they are
            part of the autograd graph (as transformers' eager attention's are), so the reference runs.
        closed_gradient (`str`, *optional*, defaults to `"derivative"`): a closed pair's gate gradient,
            `"derivative"` (`∂L/∂g_ij` at `g_ij = 0`) or `"opening"` (the first-order change of the loss when the
            pair opens; see the module docstring).
        backend (`str`, *optional*, defaults to `"fast"`): `"reference"` runs [`gated_attention_reference`];
            `"fast"` and `"triton"` (where it can run: see [`resolve_backend`]) the fused torch function.

    Returns:
        `tuple(torch.Tensor, torch.Tensor | None)`: the output `(B, H, n, d)` (rows without an open pair are zero, as
        is their gate gradient) and, if `return_weights`, the weights `(B, H, n, m)`.
    """
    if closed_gradient not in CLOSED_GRADIENTS:
        raise ValueError(f"`closed_gradient` must be one of {CLOSED_GRADIENTS}, got {closed_gradient!r}.")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if return_weights or resolve_backend(backend, q.device, q.dtype, k.dtype, v.dtype) == "reference":
        out, weights = gated_attention_reference(
            q, k, v, gate, keep=keep, scale=scale, closed_gradient=closed_gradient
        )
        return out, (weights if return_weights else None)
    # In the inputs' dtype: under autocast the matmuls would run in half precision, which this function's bounds and
    # its backward (run without autocast) do not expect.
    with torch.autocast(q.device.type, enabled=False):
        return _GatedAttention.apply(q, k, v, gate, keep, scale, closed_gradient == "opening"), None


def gated_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gate: Tensor,
    *,
    keep: Tensor | None = None,
    scale: float | None = None,
    closed_gradient: str = "derivative",
) -> tuple[Tensor, Tensor]:
    """[`gated_attention`] written plainly: the gate multiplies `e^s` inside the softmax, autograd differentiates.
    With `closed_gradient="opening"` the gate enters through a value equal to it whose gradient is scaled by
    `1 / (1 + e^{s_ij} / Z_i)` on closed pairs (by 1 on open ones).

    Returns the output and the weights after dropout.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, n, m)
    top = logits.masked_fill(gate == 0, float("-inf")).amax(-1, keepdim=True).detach()
    empty = top == float("-inf")
    shifted = (logits - top.masked_fill(empty, 0.0)).clamp(max=max_log_weight(logits.dtype))
    unnormalised = shifted.exp()
    if closed_gradient == "opening":
        with torch.no_grad():
            weight = unnormalised / (gate * unnormalised).sum(-1, keepdim=True).masked_fill(empty, 1.0)  # e^s / Z
            factor = torch.where(gate == 0, 1.0 / (1.0 + weight), torch.ones_like(weight))
        gate = gate.detach() + factor * (gate - gate.detach())  # the same values; the gradient times `factor`
    norm = (gate * unnormalised).sum(-1, keepdim=True)
    weights = (unnormalised / norm.masked_fill(empty, 1.0)).masked_fill(empty, 0.0)
    probs = gate * weights if keep is None else gate * weights * keep
    return torch.matmul(probs, v), probs

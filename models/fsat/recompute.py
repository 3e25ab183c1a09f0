"""A linear layer whose input is recomputed in the backward from a tensor that is saved anyway.

FSAT's layer saves more than a dense layer: its feature maps and index predictor are extra projections. Two of their
inputs are cheap functions of tensors the backward keeps for other reasons: a feature map's outer projection reads
`act(h)`, and the activation saves `h`; the index predictor reads an fp32 copy of the pooled cross, and the keys' and
values' projections save the cross. [`linear_of_recomputed`] saves the source instead of the input and recomputes the
input when the backward asks: the same values, one elementwise pass more.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


class _LinearOfRecomputed(torch.autograd.Function):
    """[`linear_of_recomputed`]; saves `source` and `weight` only."""

    @staticmethod
    def forward(ctx, source, weight, bias, function, compute_dtype):
        device = source.device.type
        # The forward's autocast state, to recompute the input exactly as it was computed.
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        x = function(source)
        if compute_dtype is None:
            out = F.linear(x, weight, bias)  # autocast, if on, casts as for any linear
        else:
            with torch.autocast(device_type=device, enabled=False):
                bias = None if bias is None else bias.to(compute_dtype)
                out = F.linear(x.to(compute_dtype), weight.to(compute_dtype), bias)
        ctx.save_for_backward(source, weight)
        ctx.function, ctx.dtype, ctx.has_bias = function, out.dtype, bias is not None
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        source, weight = ctx.saved_tensors
        need_source, need_weight, need_bias = ctx.needs_input_grad[:3]
        device, enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(device_type=device, dtype=dtype, enabled=enabled):
            leaf = source.detach().requires_grad_(need_source)
            x = ctx.function(leaf)
        grad_source = grad_weight = grad_bias = None
        with torch.autocast(device_type=device, enabled=False):
            grad = grad.to(ctx.dtype)
            flat_grad = grad.reshape(-1, grad.shape[-1])  # (rows, out)
            if need_weight:
                flat_x = x.detach().to(ctx.dtype).reshape(-1, x.shape[-1])  # (rows, in)
                grad_weight = (flat_grad.t() @ flat_x).to(weight.dtype)
            if need_bias and ctx.has_bias:
                grad_bias = flat_grad.sum(0).to(weight.dtype)
            if need_source:
                grad_x = (grad @ weight.to(ctx.dtype)).to(x.dtype)
                (grad_source,) = torch.autograd.grad(x, leaf, grad_x)
        return grad_source, grad_weight, grad_bias, None, None


def linear_of_recomputed(
    source: Tensor,
    function: Callable[[Tensor], Tensor],
    linear: torch.nn.Linear,
    compute_dtype: torch.dtype | None = None,
) -> Tensor:
    """`linear(function(source))`, saving `source` rather than the linear's input for the backward.

    Args:
        source (`torch.Tensor` of shape `(..., in)`): the input's source, which the backward keeps anyway (an
            activation's input, a tensor another layer saves), so that no memory is saved twice.
        function (`Callable`): deterministic and cheap (an activation, a dtype cast); run again in the backward under
            the forward's autocast state.
        linear (`torch.nn.Linear`): the projection.
        compute_dtype (`torch.dtype`, *optional*): compute the projection in this dtype with autocast off (the
            weights and the input cast to it); by default as `linear` would (autocast casts, if on).

    Returns:
        `torch.Tensor` of shape `(..., out)`: equal to `linear(function(source))`, and so are the gradients.
    """
    return _LinearOfRecomputed.apply(source, linear.weight, linear.bias, function, compute_dtype)

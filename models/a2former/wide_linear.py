"""A linear map computed in fp32 (or wider) that keeps its input in the input's own dtype for backward.

A²-Former predicts fractional token positions, which bf16 cannot hold beyond 256, so its offset projection runs in
fp32. Plain autograd through `F.linear(x.float(), ...)` saves the fp32 copy of the hidden states for the weight
gradient (twice the bytes of the bf16 input that the q/k/v projections already save). This Function saves the input
as it came and widens it again in backward: the same arithmetic, gradients equal to plain autograd's, no fp32 copy
of the activations kept between the passes. The output scale is folded into the matrix product.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _WideLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, scale: float) -> Tensor:
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        wide_weight = weight.to(dtype)
        flat = x.reshape(-1, x.shape[-1]).to(dtype)  # (rows, in), freed after the product
        out = torch.addmm(bias.to(dtype), flat, wide_weight.t(), beta=scale, alpha=scale)  # scale * (x W^T + b)
        # The wide weight is small (out x in) and saves a cast in backward; the input stays in its own dtype.
        ctx.save_for_backward(x, wide_weight)
        ctx.scale, ctx.weight_dtype, ctx.bias_dtype = scale, weight.dtype, bias.dtype
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    # A hand-written backward: a second derivative through it must fail loudly, not come out wrong or cryptic.
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        if ctx.scale != 1.0:
            grad = grad * ctx.scale
        flat = grad.reshape(-1, grad.shape[-1]).to(weight.dtype)  # (rows, out)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = (flat @ weight).to(x.dtype).view(x.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = (flat.t() @ x.reshape(-1, x.shape[-1]).to(weight.dtype)).to(ctx.weight_dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = flat.sum(0).to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None


def wide_linear(x: Tensor, weight: Tensor, bias: Tensor, scale: float = 1.0) -> Tensor:
    """`scale * (x @ weight.T + bias)` in fp32 (fp64 for fp64 inputs), saving `x` in its own dtype for backward.

    Args:
        x (`torch.Tensor` of shape `(..., in)`): input (e.g. bf16 hidden states).
        weight (`torch.Tensor` of shape `(out, in)`), bias (`torch.Tensor` of shape `(out,)`): parameters.
        scale (`float`, *optional*, defaults to 1.0): multiplies the output (and the gradients flowing back).

    Returns:
        `torch.Tensor` of shape `(..., out)` in fp32 (fp64 for fp64 inputs).
    """
    with torch.autocast(device_type=x.device.type, enabled=False):
        return _WideLinear.apply(x, weight, bias, float(scale))

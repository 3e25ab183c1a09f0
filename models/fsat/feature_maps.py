"""FSAT's two `"mlp"` feature maps `f1`, `f2` as one autograd Function, stacked `(2, B, N, D)`.

Each map is `W2 act(W1 x + b1) + b2` of the same hidden states. Run apart (two `FeatureMap` modules), they cost two
inner GEMMs, two activations and two outer GEMMs forward, and backward an activation recomputed and nine ops per map,
plus the addition of the two input gradients. [`mlp_feature_maps`] runs them together with their parameters as they
are (no weight is stacked or cached, so nothing can go stale after an optimizer step):

- forward: the two inner GEMMs write one `(2, rows, D)` buffer, the activation runs once on it, and the two outer
  GEMMs write the `(2, B, N, D)` output (which [`~attnzoo.fsat.pooling.pooled_cross_stacked`] reads as it is);
- backward (the activation's input saved, its output recomputed once): both outer weights' gradients in one batched
  GEMM and both biases' in one sum, the activation's input gradient by two GEMMs into one buffer and one activation
  backward, both inner weights' gradients in one batched GEMM (the input broadcast over the pair, not copied) and
  both biases' in one sum, and the input's gradient by one GEMM and one accumulating GEMM, so that autograd adds
  nothing for the second map.

The saved tensors are the plain path's: the input (which the queries' projection keeps too) and the activations'
inputs. The activation is any elementwise `ACT2FN` one; under autocast, the GEMMs run in the autocast dtype as
`nn.Linear` would, and each parameter's gradient comes back in its own dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype `nn.Linear` computes `x` in: the autocast dtype where autocast is on, else `x`'s own."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class _MLPFeatureMaps(torch.autograd.Function):
    """[`mlp_feature_maps`]; saves the input and the activations' inputs `(2, rows, D)`."""

    @staticmethod
    def forward(ctx, x, inner_1, inner_bias_1, inner_2, inner_bias_2, outer_1, outer_bias_1, outer_2, outer_bias_2,
                act):  # fmt: skip
        device = x.device.type
        # The forward's autocast state, to recompute the activation exactly as it was computed.
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        dtype = _compute_dtype(x)
        flat = x.reshape(-1, x.shape[-1]).to(dtype)  # (rows, D)
        rows = flat.shape[0]
        with torch.autocast(device_type=device, enabled=False):
            hidden = flat.new_empty(2, rows, inner_1.shape[0])
            for i, (weight, bias) in enumerate(((inner_1, inner_bias_1), (inner_2, inner_bias_2))):
                torch.addmm(bias.to(dtype), flat, weight.to(dtype).t(), out=hidden[i])
        with torch.autocast(device_type=device, dtype=ctx.autocast[2], enabled=ctx.autocast[1]):
            activated = act(hidden)  # one op for both maps
        with torch.autocast(device_type=device, enabled=False):
            # Allocated in its returned shape: an output that is a view of a tensor written in place is refused.
            out = flat.new_empty(2, *x.shape[:-1], outer_1.shape[0])
            rows_out = out.view(2, rows, -1)
            for i, (weight, bias) in enumerate(((outer_1, outer_bias_1), (outer_2, outer_bias_2))):
                torch.addmm(bias.to(dtype), activated[i].to(dtype), weight.to(dtype).t(), out=rows_out[i])
        ctx.save_for_backward(flat, hidden, inner_1, inner_2, outer_1, outer_2)
        ctx.act, ctx.input_dtype, ctx.input_shape = act, x.dtype, x.shape
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        flat, hidden, inner_1, inner_2, outer_1, outer_2 = ctx.saved_tensors
        device, enabled, autocast_dtype = ctx.autocast
        dtype = flat.dtype
        need = ctx.needs_input_grad
        with torch.enable_grad(), torch.autocast(device_type=device, dtype=autocast_dtype, enabled=enabled):
            leaf = hidden.detach().requires_grad_()
            activated = ctx.act(leaf)  # (2, rows, D), recomputed once for both maps
        grad_x = grad_inner = grad_inner_bias = grad_outer = grad_outer_bias = None
        with torch.autocast(device_type=device, enabled=False):
            grad = grad.reshape(2, flat.shape[0], -1).to(dtype)  # (2, rows, D_out)
            if need[5] or need[7]:
                grad_outer = torch.bmm(grad.transpose(1, 2), activated.detach().to(dtype))  # (2, D_out, D)
            if need[6] or need[8]:
                grad_outer_bias = grad.sum(1)  # (2, D_out)
            if any(need[:5]):
                grad_activated = torch.empty(hidden.shape, dtype=dtype, device=hidden.device)
                for i, weight in enumerate((outer_1, outer_2)):
                    torch.mm(grad[i], weight.to(dtype), out=grad_activated[i])
                (grad_hidden,) = torch.autograd.grad(activated, leaf, grad_activated.to(activated.dtype))
                grad_hidden = grad_hidden.to(dtype)  # (2, rows, D)
                if need[1] or need[3]:
                    # The input broadcast over the pair (batch stride 0): the batched GEMM reads it, nothing copies it.
                    grad_inner = torch.bmm(grad_hidden.transpose(1, 2), flat.expand(2, *flat.shape))  # (2, D, D_in)
                if need[2] or need[4]:
                    grad_inner_bias = grad_hidden.sum(1)  # (2, D)
                if need[0]:
                    # Both maps' input gradients in one buffer: the second GEMM accumulates onto the first.
                    grad_x = torch.mm(grad_hidden[0], inner_1.to(dtype)).addmm_(grad_hidden[1], inner_2.to(dtype))
                    grad_x = grad_x.view(ctx.input_shape).to(ctx.input_dtype)
        return (
            grad_x,
            *_pair(grad_inner, grad_inner_bias, inner_1),
            *_pair(grad_inner, grad_inner_bias, inner_2, 1),
            *_pair(grad_outer, grad_outer_bias, outer_1),
            *_pair(grad_outer, grad_outer_bias, outer_2, 1),
            None,
        )


def _pair(weights: Tensor | None, biases: Tensor | None, parameter: Tensor, index: int = 0) -> tuple:
    """Map `index`'s weight and bias gradients from the stacked ones, in the parameters' dtype (None: not needed)."""
    return tuple(None if g is None else g[index].to(parameter.dtype) for g in (weights, biases))


def mlp_feature_maps(x: Tensor, first: nn.Module, second: nn.Module, act: Callable[[Tensor], Tensor]) -> Tensor:
    """`(f1(x), f2(x))` stacked `(2, B, N, D)` for two `"mlp"` feature maps, by one autograd Function.

    Args:
        x (`torch.Tensor` of shape `(B, N, D)`): the (masked) hidden states.
        first, second (`FeatureMap`): the maps, each with `inner` and `outer` `nn.Linear` layers (with biases).
        act (`Callable`): their elementwise activation.

    Returns:
        `torch.Tensor` of shape `(2, B, N, D_out)`: equal to `torch.stack((first.outer(act(first.inner(x))),
        second.outer(act(second.inner(x)))))`, and so are the gradients.
    """
    return _MLPFeatureMaps.apply(
        x, first.inner.weight, first.inner.bias, second.inner.weight, second.inner.bias,
        first.outer.weight, first.outer.bias, second.outer.weight, second.outer.bias, act,
    )  # fmt: skip

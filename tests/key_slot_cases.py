"""Inputs and one forward+backward of key-slot attention (FSAT's edges in fixed slots per key), shared by its kernel
tests (`tests/kernels/test_key_slot_attention.py`) and its global-rows tests (`tests/fsat/`)."""

from __future__ import annotations

import torch

from attnzoo.kernels import key_slot_attention


def finish_slots(q, k, v, query: torch.Tensor, valid: torch.Tensor | None, generator: torch.Generator):
    """`(q, k, v, query, mean, valid)`: the slots of padded keys and those naming padded queries dropped (-1) as FSAT
    drops them, and predicted positions `mean` near the named queries (a leaf tensor)."""
    if valid is not None:
        B = valid.shape[0]
        named_real = valid.gather(1, query.clamp(min=0).view(B, -1).long()).view(query.shape)
        query = torch.where(valid[:, None, :, None] & named_real & (query >= 0), query, -1)
    mean = (query.float() + torch.rand(query.shape, generator=generator) * 4 - 1.5).requires_grad_()
    return q, k, v, query, mean, valid


def run(backend: str, slots, **kwargs):
    """Output, pair counts and the gradients of q, k, v and `mean` under a fixed probe, the same dropout masks for
    every backend."""
    q, k, v, query, mean, valid = slots
    torch.manual_seed(5)
    out, pairs = key_slot_attention(q, k, v, query, mean, key_valid=valid, backend=backend, **kwargs)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out.float() * probe).sum(), (q, k, v, mean))
    return out.detach(), pairs, grads

"""Smart Bird's sketch attention runs SDPA at a head size its fast CUDA kernels take, with the real size's result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnzoo.smart_bird.sketch import aligned_attention


@pytest.mark.parametrize("head_dim", [4, 6, 8])
@pytest.mark.parametrize("masked", [False, True])
def test_aligned_sketch_attention_equals_sdpa_at_the_real_head_size(head_dim, masked):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 1, 24, head_dim, generator=g, requires_grad=True) for _ in range(3))
    mask = None
    if masked:
        mask = torch.ones(2, 1, 1, 24, dtype=torch.bool)
        mask[1, ..., 17:] = False
    results = []
    for attention in (aligned_attention, lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3])):
        out = attention(q, k, v, mask)
        assert out.shape == (2, 1, 24, head_dim)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append((out, *torch.autograd.grad(out, (q, k, v), grad_out)))
    for aligned, plain in zip(*results, strict=True):
        torch.testing.assert_close(aligned, plain, rtol=1e-6, atol=1e-6)


def test_the_sketch_attention_runs_sdpa_at_a_head_size_its_fast_kernels_take(monkeypatch):
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        seen.append(q.shape[-1])
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 1, 10, 4)
    aligned_attention(q, q, q)
    assert seen == [8]

"""Interpolated attention as gathered slots of two weighted entries: the CSR path (and its gather fallback) vs the
dense interpolation-matrix reference, and the degenerate limits."""

from __future__ import annotations

import pytest
import torch

from attnzoo.a2former.interpolated import interpolated_attention_reference
from attnzoo.kernels import dense_masked_attention, gathered_attention
from attnzoo.kernels.gathered import gathered_attention_with_mask

B, H, NQ, NK, D, K = 2, 3, 6, 9, 8, 4


def interpolated_attention(q, k, v, i0, i1, w1, *, use_sparse=None, keep=None, dropout_p=0.0, **kwargs):
    """The CPU fast path of A²-Former's points: one slot per point, entries (i0, i1) weighted (1 - w1, w1)."""
    neighbours, mix = torch.stack((i0, i1), -1), torch.stack((1.0 - w1, w1), -1)
    return gathered_attention_with_mask(
        q, k, v, neighbours, None, weight=mix, scale=None, keep=keep, dropout_p=dropout_p, use_sparse=use_sparse,
        **kwargs,
    )  # fmt: skip


def _inputs(dtype: torch.dtype, seed: int, *, duplicates: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, NQ, D, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(B, H, NK, D, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, NK, D, generator=g, dtype=dtype, requires_grad=True)
    high = 3 if duplicates else NK - 1
    positions = torch.rand(B, H, NQ, K, generator=g, dtype=dtype) * (high - 1)
    i0 = positions.floor().long()
    i1 = (i0 + 1).clamp(max=NK - 1)
    w1 = (positions - i0).requires_grad_(True)
    bias = torch.randn(B, H, NQ, K, generator=g, dtype=dtype)
    bias[0, 1, 2] = float("-inf")  # a query without any point
    bias.requires_grad_(True)
    keep = torch.rand(B, H, NQ, K, generator=g) > 0.3
    grad_out = torch.randn(B, H, NQ, D, generator=g, dtype=dtype)
    return q, k, v, i0, i1, w1, bias, keep, grad_out


@pytest.mark.parametrize("use_sparse", [True, False], ids=["csr", "fallback"])
@pytest.mark.parametrize("dot_product", [True, False], ids=["dot_product", "linear"])
@pytest.mark.parametrize("duplicates", [False, True], ids=["distinct", "duplicates"])
def test_fast_path_matches_reference_outputs_and_gradients(use_sparse, dot_product, duplicates):
    q, k, v, i0, i1, w1, bias, keep, grad_out = _inputs(torch.float64, 0, duplicates=duplicates)
    kwargs = {"logit_bias": bias, "dot_product": dot_product, "keep": keep, "dropout_p": 0.3}
    inputs = (q, k, v, w1, bias)
    fast = interpolated_attention(q, k, v, i0, i1, w1, use_sparse=use_sparse, **kwargs)
    ref = interpolated_attention_reference(q, k, v, i0, i1, w1, **kwargs)[0]
    torch.testing.assert_close(fast, ref, atol=1e-10, rtol=0)
    assert torch.equal(fast[0, 1, 2], torch.zeros(D, dtype=fast.dtype))
    fast_grads = torch.autograd.grad(fast, inputs, grad_out, allow_unused=True)
    ref_grads = torch.autograd.grad(ref, inputs, grad_out, allow_unused=True)
    for a, b in zip(fast_grads, ref_grads, strict=True):
        if b is None or not b.any():
            assert a is None or not a.any()
        else:
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_integer_positions_equal_plain_gather():
    q, k, v, i0, _, _, _, _, _ = _inputs(torch.float64, 1)
    w1 = torch.zeros(i0.shape, dtype=torch.float64)
    out = interpolated_attention(q, k, v, i0, (i0 + 1).clamp(max=NK - 1), w1)
    torch.testing.assert_close(out, gathered_attention(q, k, v, i0), atol=1e-12, rtol=0)


def test_every_key_once_equals_dense_attention():
    q, k, v, *_ = _inputs(torch.float64, 2)
    i0 = torch.arange(NK).expand(B, H, NQ, NK)
    out = interpolated_attention(q, k, v, i0, (i0 + 1).clamp(max=NK - 1), torch.zeros(i0.shape, dtype=q.dtype))
    torch.testing.assert_close(out, dense_masked_attention(q, k, v)[0], atol=1e-12, rtol=0)


def test_weight_gradient_is_the_neighbour_difference():
    # With one point the output is exactly the interpolated value, so d out / d w1 = v[i1] - v[i0].
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 1, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 1, NK, D, generator=g, dtype=torch.float64) for _ in range(2))
    i0, i1 = torch.tensor([[[[4]]]]), torch.tensor([[[[5]]]])
    w1 = torch.tensor([[[[0.3]]]], dtype=torch.float64, requires_grad=True)
    out = interpolated_attention(q, k, v, i0, i1, w1)
    (grad,) = torch.autograd.grad(out.sum(), w1)
    torch.testing.assert_close(grad.squeeze(), (v[0, 0, 5] - v[0, 0, 4]).sum(), atol=1e-12, rtol=0)

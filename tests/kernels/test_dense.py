from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnzoo.kernels import dense_masked_attention


def _inputs(dtype=torch.float64, B=2, H=3, Nq=6, Nk=7, d=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, n, d, generator=g, dtype=dtype, requires_grad=True) for n in (Nq, Nk, Nk)]


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_matches_sdpa_with_mask(dtype, atol):
    q, k, v = _inputs(dtype)
    mask = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(1)) < 0.5
    mask[..., 0] = True  # SDPA's fully-masked-row behaviour is version dependent: keep every row non-empty
    grad = torch.randn(2, 3, 6, 8, dtype=dtype)
    out, weights = dense_masked_attention(q, k, v, mask, scale=0.3, return_weights=True)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(out, expected, atol=atol, rtol=0)
    assert weights.shape == (2, 3, 6, 7)
    assert torch.all(weights[~mask.expand_as(weights)] == 0)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    for a, b in zip(grads, torch.autograd.grad(expected, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_no_mask_matches_sdpa_and_returns_no_weights():
    q, k, v = _inputs(torch.float32)
    out, weights = dense_masked_attention(q, k, v)
    assert weights is None
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=0)


def test_fully_masked_rows_are_exact_zeros_without_nan():
    q, k, v = _inputs()
    mask = torch.ones(1, 1, 6, 7, dtype=torch.bool)
    mask[..., 2, :] = False
    out, weights = dense_masked_attention(q, k, v, mask, return_weights=True)
    assert torch.all(out[:, :, 2] == 0) and torch.all(weights[:, :, 2] == 0)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[0][:, :, 2] == 0)


def test_half_precision_softmax_in_fp32():
    q, k, v = (t.detach().to(torch.bfloat16) for t in _inputs())
    out, weights = dense_masked_attention(q, k, v, return_weights=True)
    assert out.dtype == weights.dtype == torch.bfloat16
    ref, _ = dense_masked_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=0)


def test_dropout_only_when_training():
    q, k, v = _inputs(torch.float32)
    eval_out, _ = dense_masked_attention(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(eval_out, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=0)
    torch.manual_seed(0)
    _, weights = dense_masked_attention(q, k, v, dropout_p=0.5, training=True, return_weights=True)
    assert (weights == 0).any()


def test_rejects_non_bool_mask():
    q, k, v = _inputs()
    with pytest.raises(TypeError):
        dense_masked_attention(q, k, v, torch.ones(6, 7))

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import dense_masked_attention, gathered_attention, gathered_attention_reference
from attnzoo.kernels.gathered import gathered_attention_reference_with_mask, gathered_attention_with_mask

TOLERANCES = [(torch.float64, 1e-10), (torch.float32, 1e-5)]
B, H, NQ, NK, D, K = 2, 3, 5, 9, 8, 4


def _fast(use_sparse: bool):
    def run(q, k, v, idx, valid, *, keep=None, dropout_p=0.0):
        return gathered_attention_with_mask(
            q, k, v, idx, valid, scale=None, keep=keep, dropout_p=dropout_p, use_sparse=use_sparse
        )

    return run


def _reference(q, k, v, idx, valid, *, keep=None, dropout_p=0.0):
    return gathered_attention_reference_with_mask(q, k, v, idx, valid, scale=None, keep=keep, dropout_p=dropout_p)


def _dense(q, k, v, idx, valid):
    # Only valid for duplicate-free rows: the dense mask cannot count a key twice.
    counts = torch.zeros(B, H, NQ, NK, dtype=torch.int64).scatter_add_(-1, idx.masked_fill(~valid, 0), valid.long())
    mask = counts > 0
    return dense_masked_attention(q, k, v, mask)[0]


FAST = [pytest.param(_fast(True), id="csr"), pytest.param(_fast(False), id="fallback")]


def _inputs(dtype, seed: int, *, duplicates: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, NQ, D, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(B, H, NK, D, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, NK, D, generator=g, dtype=dtype, requires_grad=True)
    if duplicates:
        idx = torch.randint(0, 3, (B, H, NQ, K), generator=g)
    else:
        idx = torch.rand(B, H, NQ, NK, generator=g).argsort(-1)[..., :K]  # distinct keys per row
    valid = torch.rand(B, H, NQ, K, generator=g) < 0.7
    valid[0, 1, 2] = False  # a row with no valid slot
    idx = idx.masked_fill(~valid & (torch.rand(idx.shape, generator=g) < 0.5), -1)  # padding in invalid slots
    grad_out = torch.randn(B, H, NQ, D, generator=g, dtype=dtype)
    return q, k, v, idx, valid, grad_out


def _out_and_grads(fn, q, k, v, idx, valid, grad_out, **kwargs):
    out = fn(q, k, v, idx, valid, **kwargs)
    return [out, *torch.autograd.grad(out, (q, k, v), grad_out)]


def _assert_all_close(actual, expected, atol):
    for a, b in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


@pytest.mark.parametrize("fast", FAST)
@pytest.mark.parametrize("dtype,atol", TOLERANCES)
def test_matches_reference_and_dense(fast, dtype, atol):
    q, k, v, idx, valid, grad_out = _inputs(dtype, 0)
    fast_res = _out_and_grads(fast, q, k, v, idx, valid, grad_out)
    ref_res = _out_and_grads(_reference, q, k, v, idx, valid, grad_out)
    dense_res = _out_and_grads(_dense, q, k, v, idx, valid, grad_out)
    _assert_all_close(fast_res, ref_res, atol)
    _assert_all_close(ref_res, dense_res, atol)
    assert torch.all(fast_res[0][0, 1, 2] == 0) and torch.all(fast_res[1][0, 1, 2] == 0)
    assert all(torch.isfinite(t).all() for t in fast_res)


@pytest.mark.parametrize("fast", FAST)
def test_duplicates_and_no_valid_mask_match_reference(fast):
    q, k, v, idx, _, grad_out = _inputs(torch.float64, 1, duplicates=True)
    idx = idx.clamp_min(0)
    _assert_all_close(
        _out_and_grads(fast, q, k, v, idx, None, grad_out),
        _out_and_grads(_reference, q, k, v, idx, None, grad_out),
        1e-10,
    )


def test_public_api_and_gradcheck():
    q, k, v, idx, valid, _ = _inputs(torch.float64, 2)
    torch.testing.assert_close(
        gathered_attention(q, k, v, idx, valid, scale=0.3),
        gathered_attention_reference(q, k, v, idx, valid, scale=0.3),
        atol=1e-12,
        rtol=0,
    )
    g = torch.Generator().manual_seed(2)
    tiny = [torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64, requires_grad=True) for n in (3, 4, 4)]
    tiny_idx = torch.tensor([[[0, 3], [1, 1], [2, 0]], [[3, 2], [0, 1], [1, 2]]])[None]  # (1, 2, 3, 2)
    # Row (0, 2) has no valid slot; row (0, 1) repeats key 1 with one copy invalid.
    tiny_valid = torch.tensor(
        [[[True, True], [True, False], [False, False]], [[True, False], [True, True], [False, True]]]
    )
    tiny_valid = tiny_valid[None]  # (1, 2, 3, 2)
    assert torch.autograd.gradcheck(lambda q, k, v: gathered_attention(q, k, v, tiny_idx, tiny_valid), tiny)


@pytest.mark.parametrize("fast", FAST)
def test_same_keep_mask_matches_reference(fast):
    q, k, v, idx, valid, grad_out = _inputs(torch.float64, 3)
    keep = torch.rand(idx.shape, generator=torch.Generator().manual_seed(3)) > 0.4
    fast_res = _out_and_grads(fast, q, k, v, idx, valid, grad_out, keep=keep, dropout_p=0.4)
    ref_res = _out_and_grads(_reference, q, k, v, idx, valid, grad_out, keep=keep, dropout_p=0.4)
    _assert_all_close(fast_res, ref_res, 1e-10)


def test_public_dropout_uses_global_rng():
    q, k, v, idx, valid, _ = _inputs(torch.float64, 4)
    torch.manual_seed(0)
    fast = gathered_attention(q, k, v, idx, valid, dropout_p=0.5, training=True)
    torch.manual_seed(0)
    ref = gathered_attention_reference(q, k, v, idx, valid, dropout_p=0.5, training=True)
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=0)
    assert not torch.allclose(fast, gathered_attention(q, k, v, idx, valid))


def test_bfloat16_returns_input_dtype():
    q, k, v, idx, valid, _ = _inputs(torch.float32, 5)
    out = gathered_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), idx, valid)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), gathered_attention(q, k, v, idx, valid), atol=3e-2, rtol=0)


def test_out_of_range_valid_index_raises():
    q, k, v, idx, valid, _ = _inputs(torch.float32, 6)
    idx = idx.masked_fill(valid, NK)
    with pytest.raises(IndexError):
        gathered_attention(q, k, v, idx, valid)


@pytest.mark.parametrize("backend", ["reference", "fast", "triton"])
@pytest.mark.parametrize("mixed", [False, True], ids=["slots", "mixed_slots"])
def test_no_slot_gives_zeros_and_zero_gradients_on_every_backend(backend, mixed):
    if backend == "triton":
        pytest.importorskip("triton")
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, n, D, generator=g, requires_grad=True) for n in (NQ, NK, NK))
    shape = (B, H, NQ, 0, 2) if mixed else (B, H, NQ, 0)
    idx = torch.zeros(shape, dtype=torch.long)
    weight = torch.zeros(shape) if mixed else None
    bias = torch.zeros(B, H, NQ, 0)
    out = gathered_attention(q, k, v, idx, weight=weight, logit_bias=bias, backend=backend)
    assert out.shape == q.shape and not out.any()
    out.sum().backward()
    assert all(t.grad is None or not t.grad.any() for t in (q, k, v))


def test_a_bias_that_only_broadcasts_with_the_slots_is_refused():
    q, k, v, idx, valid, _ = _inputs(torch.float32, 8)
    for shape in ((2 * B, H, NQ, K), (1, B, H, NQ, K)):  # another batch; one more axis
        with pytest.raises(ValueError, match="logit_bias must broadcast to"):
            gathered_attention(q, k, v, idx, valid, logit_bias=torch.zeros(shape))


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_mixed_input_dtypes_are_refused_on_every_backend(backend):
    """q fp32 with k / v bf16 raised on the reference, and the torch path returned k's dtype for q bf16: the result
    depended on the backend, so one dtype is required (as SDPA and the Triton kernels require)."""
    q, k, v, idx, valid, _ = _inputs(torch.float32, 9)
    for args in ((q, k.bfloat16(), v.bfloat16()), (q.bfloat16(), k, v), (q, k, v.double())):
        with pytest.raises(ValueError, match="q, k and v must share one dtype"):
            gathered_attention(*args, idx, valid, backend=backend)


def test_no_key_rows_is_named_not_reported_as_an_index_out_of_range():
    q, k, v, idx, _, _ = _inputs(torch.float32, 10)
    empty = k[:, :, :0]
    for valid in (None, torch.zeros(idx.shape, dtype=torch.bool)):  # even with every slot invalid
        with pytest.raises(ValueError, match=r"no key rows \(Nk = 0\)"):
            gathered_attention(q, empty, empty, idx.clamp(max=0), valid)

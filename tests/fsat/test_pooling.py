"""FSAT's recomputing pieces: the FFT pooled cross Function (one complex FFT, only f1 and f2 saved) against the
plain-autograd FFT, and the linear whose input is recomputed against a plain linear, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnzoo.benchmarking.recorder import OpRecorder
from attnzoo.fsat.pooling import pooled_cross_fused, pooled_cross_plain
from attnzoo.fsat.recompute import linear_of_recomputed

B, D = 2, 3


def feature_maps(length: int, dtype: torch.dtype = torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, length, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(2))


def padding(length: int) -> torch.Tensor:
    valid = torch.ones(B, length, dtype=torch.bool)
    valid[1, length // 2 :] = False  # trailing padding
    valid[0, 1:2] = False  # a hole (none in a one-token sequence)
    return valid


def zero_padding(f: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    # The feature maps are zero at padded positions (FeatureMap does it); the Function relies on it.
    return f if valid is None else (f * valid[..., None]).detach().requires_grad_()


@pytest.mark.parametrize("length", [1, 2, 5, 8])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_fused_pooled_cross_passes_gradcheck_and_equals_the_plain_fft(length, padded):
    valid = padding(length) if padded else None
    f1, f2 = (zero_padding(f, valid) for f in feature_maps(length))
    assert torch.autograd.gradcheck(lambda a, b: pooled_cross_fused(a, b, valid), (f1, f2))
    fused = pooled_cross_fused(f1, f2, valid)
    plain = pooled_cross_plain(f1, f2, valid)
    assert fused.dtype == torch.float64
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)
    probe = torch.randn(fused.shape, dtype=torch.float64)
    grads = torch.autograd.grad((fused * probe).sum(), (f1, f2))
    expected = torch.autograd.grad((plain * probe).sum(), (f1, f2))
    for grad, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_pooled_cross_in_low_precision_stays_close_to_fp64(dtype):
    valid = padding(64)
    f1, f2 = (zero_padding(f, valid) for f in feature_maps(64))
    low = [f.detach().to(dtype).requires_grad_() for f in (f1, f2)]
    fused = pooled_cross_fused(*low, valid)
    assert fused.dtype == torch.float32  # half precision is transformed in fp32
    expected = pooled_cross_plain(*(f.detach().to(dtype).double() for f in low), valid)
    torch.testing.assert_close(fused.double(), expected, rtol=1e-5, atol=1e-5)
    fused.sum().backward()
    assert all(f.grad.dtype == dtype and torch.isfinite(f.grad).all() for f in low)


def saved_storages(function) -> list[int]:
    """Byte sizes of the distinct storages autograd saves while `function` runs."""
    seen: dict[int, int] = {}

    def pack(tensor):
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        function()
    return sorted(seen.values())


def test_fused_pooled_cross_saves_only_the_feature_maps():
    f1, f2 = feature_maps(300, torch.float32)
    size = f1.numel() * f1.element_size()
    assert saved_storages(lambda: pooled_cross_fused(f1, f2, None)) == [size, size]
    # The plain FFT keeps its spectra (each about twice the input, zero-padded to a power of two >= 2N).
    assert sum(saved_storages(lambda: pooled_cross_plain(f1, f2, None))) > 4 * size


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_fused_pooled_cross_rounds_once_to_the_requested_dtype(padded):
    """`out_dtype` is the fp32 result rounded at the end, and its gradient is the fp32 result's with the incoming
    gradient read as it comes."""
    valid = padding(64) if padded else None
    f1, f2 = (zero_padding(f.detach().bfloat16().requires_grad_(), valid) for f in feature_maps(64))
    low = pooled_cross_fused(f1, f2, valid, out_dtype=torch.bfloat16)
    full = pooled_cross_fused(f1, f2, valid)
    assert low.dtype == torch.bfloat16 and torch.equal(low, full.to(torch.bfloat16))
    probe = torch.randn(low.shape).bfloat16()
    grads = torch.autograd.grad((low * probe).sum(), (f1, f2))
    expected = torch.autograd.grad((full * probe.float()).sum(), (f1, f2))
    for grad, want in zip(grads, expected, strict=True):
        assert grad.dtype == torch.bfloat16 and torch.equal(grad, want)


@pytest.mark.parametrize("length", [64, 63])
def test_fused_pooled_cross_writes_nothing_larger_than_the_ffn_activation(length):
    """In bf16, the largest tensor of the forward and backward is the size of a layer's FFN activation `(B, n, 4D)`
    bf16 (`n` = N rounded up to even): the `(B, n, D)` complex spectra. A transform of length 2N writes twice that."""
    f1, f2 = (f.detach().bfloat16().requires_grad_() for f in feature_maps(length))
    recorder = OpRecorder()
    with recorder:
        pooled_cross_fused(f1, f2, None).sum().backward()
    ffn_activation = B * (length + length % 2) * 4 * D * 2
    assert recorder.total().largest_bytes == ffn_activation, recorder.total().largest_op


def test_fused_pooled_cross_rejects_mismatched_feature_maps():
    f1, f2 = feature_maps(4)
    with pytest.raises(ValueError, match="f1 and f2 must share shape and dtype"):
        pooled_cross_fused(f1, f2[:, :3], None)
    with pytest.raises(ValueError, match="f1 and f2 must share shape and dtype"):
        pooled_cross_fused(f1, f2.float(), None)


@pytest.mark.parametrize("compute_dtype", [None, torch.float64], ids=["as-linear", "fp64-compute"])
def test_linear_of_recomputed_equals_the_plain_linear_forward_and_backward(compute_dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(5, 4).double()
    source = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    out = linear_of_recomputed(source, F.gelu, linear, compute_dtype=compute_dtype)
    expected = linear(F.gelu(source))
    torch.testing.assert_close(out, expected)
    probe = torch.randn(out.shape, dtype=torch.float64)
    inputs = (source, linear.weight, linear.bias)
    grads = torch.autograd.grad((out * probe).sum(), inputs)
    for grad, want in zip(grads, torch.autograd.grad((expected * probe).sum(), inputs), strict=True):
        torch.testing.assert_close(grad, want)
    assert torch.autograd.gradcheck(lambda s: linear_of_recomputed(s, F.gelu, linear), (source,))


def test_linear_of_recomputed_saves_the_source_not_the_input():
    linear = torch.nn.Linear(16, 8)
    source = torch.randn(32, 16, requires_grad=True)
    sizes = saved_storages(lambda: linear_of_recomputed(source, F.gelu, linear))
    assert sizes == sorted([source.numel() * 4, linear.weight.numel() * 4])

"""The pooled cross's Triton path (`attnzoo.kernels.triton.fsat_pooling`: the elementwise steps between the transforms
fused) equals its torch path, forward and backward, and the plain fp64 FFT within the low-precision tolerance; it
launches its kernels instead of the torch glue, and writes nothing larger than the torch path does."""

from __future__ import annotations

import pytest
import torch

from attnzoo.benchmarking.recorder import OpRecorder
from attnzoo.fsat.pooling import pooled_cross_fused, pooled_cross_plain

pytest.importorskip("triton")
from triton_devices import TRITON_DEVICES as DEVICES  # noqa: E402

B = 2


def inputs(length: int, width: int, dtype: torch.dtype, padded: bool, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    valid = None
    if padded:
        valid = torch.ones(B, length, dtype=torch.bool)
        valid[1, length // 2 :] = False  # trailing padding
        valid[0, 1:2] = False  # a hole
    f1, f2 = (torch.randn(B, length, width, generator=g) for _ in range(2))
    if valid is not None:  # the feature maps are zero at padded positions (FeatureMap does it)
        f1, f2 = f1 * valid[..., None], f2 * valid[..., None]
    valid = None if valid is None else valid.to(device)
    return f1.to(device, dtype), f2.to(device, dtype), valid


def run(f1, f2, valid, backend, out_dtype, probe):
    a, b = (f.detach().requires_grad_() for f in (f1, f2))
    out = pooled_cross_fused(a, b, valid, out_dtype=out_dtype, backend=backend)
    grads = torch.autograd.grad((out.float() * probe).sum(), (a, b))
    return out, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [1, 2, 5, 8, 15])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_path_equals_the_torch_path_forward_and_backward(device, length, padded, dtype):
    f1, f2, valid = inputs(length, 300, dtype, padded, device)  # 300 channels: two programs, a masked tail
    probe = torch.randn(B, length, 300, generator=torch.Generator().manual_seed(1)).to(device)
    out_dtype = dtype if dtype != torch.float32 else None
    out, grads = run(f1, f2, valid, "triton", out_dtype, probe)
    want, want_grads = run(f1, f2, valid, "fast" if device == "cpu" else "reference", out_dtype, probe)
    assert out.dtype == want.dtype and out.shape == want.shape
    # fp32 round-off of the transforms and complex products (batched differently); bf16: one rounding of that.
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 2e-2}
    torch.testing.assert_close(out, want, **tol)
    for grad, expected in zip(grads, want_grads, strict=True):
        assert grad.dtype == dtype
        torch.testing.assert_close(grad, expected, **tol)
    # And both near the plain fp64 FFT of the same inputs.
    exact = pooled_cross_plain(f1.double(), f2.double(), valid)
    torch.testing.assert_close(out.double(), exact, rtol=1e-5 if dtype == torch.float32 else 1.6e-2, atol=2e-5
                               if dtype == torch.float32 else 2e-2)  # fmt: skip


def test_the_triton_path_replaces_the_glue_by_launches():
    """Forward: the three transforms and three kernels; backward: five transforms and four kernels (the torch path:
    12 ops forward, 16 backward); no tensor larger than a `(B, n, D)` complex one."""
    from attnzoo.benchmarking.recorder import stubbed_triton_launches

    length, width = 64, 8
    f1, f2, valid = inputs(length, width, torch.bfloat16, False, "cpu")
    a, b = (f.detach().requires_grad_() for f in (f1, f2))
    pooled_cross_fused(a, b, valid, backend="triton")  # the cached constants (row mask, shift spectrum) built
    grad = torch.randn(B, length, width).bfloat16()
    recorder = OpRecorder()
    with stubbed_triton_launches(recorder), recorder:
        out = pooled_cross_fused(a, b, valid, out_dtype=torch.bfloat16, backend="triton")
        forward = dict(recorder.total().ops)
        out.backward(grad)
    total = recorder.total()
    assert forward == {"_fft_c2c": 3}
    assert dict(total.ops) == {"_fft_c2c": 8}
    assert dict(total.launches) == {
        "_pack_halves": 2, "_forward_spectrum": 1, "_finish_forward": 1, "_complex_grad": 1, "_backward_products": 1,
        "_finish_backward": 1,
    }  # fmt: skip
    assert total.largest_bytes == B * length * width * 8, total.largest_op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_the_triton_path_of_the_stacked_maps_equals_the_pair(device, padded):
    """`pooled_cross_stacked` on the Triton path: the pair's output, and its two gradients written into one stacked
    `(2, B, N, D)` tensor (`finish_backward(..., out=)`)."""
    from attnzoo.fsat.pooling import pooled_cross_stacked

    f1, f2, valid = inputs(15, 300, torch.bfloat16, padded, device)
    probe = torch.randn(B, 15, 300, generator=torch.Generator().manual_seed(1)).to(device)
    out, grads = run(f1, f2, valid, "triton", torch.bfloat16, probe)
    features = torch.stack((f1, f2)).requires_grad_()
    stacked = pooled_cross_stacked(features, valid, out_dtype=torch.bfloat16, backend="triton")
    (grad,) = torch.autograd.grad((stacked.float() * probe).sum(), features)
    assert torch.equal(stacked, out)
    assert grad.shape == features.shape and grad.is_contiguous() and torch.equal(grad, torch.stack(grads))

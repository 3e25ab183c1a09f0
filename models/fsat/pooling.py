"""FSAT's pooled cross before its LayerNorm: antidiagonal sums of `f1 f2^T` by FFT and the central-token merge.

`merged_t = sum over the real pairs (i, j) with i + j in {2t, 2t+1} and (i, j) != (t, t) of f1_i * f2_j` (per
channel), zero for a row without any real pair. Two implementations:

- [`pooled_cross_plain`]: two zero-padded real FFTs, their product and an inverse, then the merge, in plain autograd
  (the reference; autograd keeps both spectra and the padded copies: about 480 MB per layer at 16K tokens, width 768);
- [`pooled_cross_fused`]: a custom autograd Function that saves only `f1` and `f2` and recomputes in backward.

The fused one packs both real inputs into one complex signal `z = f1 + i f2`. Its square's transform gives the
convolution at once: `z * z = (f1 * f1 - f2 * f2) + 2i (f1 * f2)` (`*` the linear convolution), so
`f1 * f2 = Im(ifft(fft(z)^2)) / 2`; the halving falls into the merge, which averages the two antidiagonals. The
backward is one correlation, `df1_m + i df2_m = sum_k g_k (f2_{k-m} + i f1_{k-m})`, whose transform is
`fft(ifft(g) * fft(z))` read as (imaginary, real) parts (`g_k = dmerged_{k // 2}`, the gradient of antidiagonal
`k`), minus the self pair `(t, t)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def fft_length(length: int) -> int:
    """A power of two >= 2N: no circular wrap-around of the linear convolution, pocketfft's and cuFFT's fast sizes."""
    return 1 << (2 * length - 1).bit_length()


def _at_least_fp32(x: Tensor) -> Tensor:
    """Half precision goes up to fp32 (FFT round-off); fp32 and fp64 stay as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def antidiagonal_sums(f1: Tensor, f2: Tensor) -> Tensor:
    """`C0_k = sum_{i+j=k} f1_i * f2_j` for `k = 0 .. 2N-2` via a zero-padded real FFT (a linear convolution).

    Args:
        f1, f2 (`torch.Tensor` of shape `(B, N, D)`): mapped sequences (zeros at padded positions).

    Returns:
        `torch.Tensor` of shape `(B, 2N-1, D)` in fp32, or fp64 for fp64 inputs (computed with autocast disabled).
    """
    length = f1.shape[1]
    n_fft = fft_length(length)
    with torch.autocast(device_type=f1.device.type, enabled=False):
        f1_hat = torch.fft.rfft(_at_least_fp32(f1), n=n_fft, dim=1)
        f2_hat = torch.fft.rfft(_at_least_fp32(f2), n=n_fft, dim=1)
        return torch.fft.irfft(f1_hat * f2_hat, n=n_fft, dim=1)[:, : 2 * length - 1]


def central_token_merge(c0: Tensor, f1: Tensor, f2: Tensor) -> Tensor:
    """Row `t` = antidiagonals `2t` and `2t+1` minus the self pair `(t, t)` (before the LayerNorm).

    Args:
        c0 (`torch.Tensor` of shape `(B, 2N-1, D)`): antidiagonal sums.
        f1, f2 (`torch.Tensor` of shape `(B, N, D)`): the mapped sequences they were computed from.

    Returns:
        `torch.Tensor` of shape `(B, N, D)`.
    """
    even = c0[:, 0::2]  # (B, N, D): centre on token t
    odd = F.pad(c0[:, 1::2], (0, 0, 0, 1))  # (B, N, D): centre between t and t+1, none after the last token
    return even + odd - _at_least_fp32(f1) * _at_least_fp32(f2)


def rows_with_pairs(valid: Tensor | None, length: int, device: torch.device) -> Tensor:
    """`(B or 1, N, 1)` bool: the rows whose merge holds at least one real pair.

    The others (the last real token: its antidiagonals hold only the self pair; padding) are zero in exact arithmetic
    but FFT round-off, which the LayerNorm would blow up to unit scale and which depends on the padded length. The
    pairs are counted with the same pooling on the mask (no host sync).
    """
    if valid is None:
        return (torch.arange(length, device=device) < length - 1)[None, :, None]
    m = valid[..., None].to(torch.float32)  # (B, N, 1)
    return central_token_merge(antidiagonal_sums(m, m), m, m) > 0.5


def pooled_cross_plain(f1: Tensor, f2: Tensor, valid: Tensor | None) -> Tensor:
    """The merged cross `(B, N, D)` in fp32 (fp64 for fp64 inputs) by plain autograd (see the module docstring).

    Args:
        f1, f2 (`torch.Tensor` of shape `(B, N, D)`): the feature maps (zeros at padded positions).
        valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real tokens (`None`: all real).
    """
    merged = central_token_merge(antidiagonal_sums(f1, f2), f1, f2)
    return merged * rows_with_pairs(valid, f1.shape[1], f1.device)


class _PooledCross(torch.autograd.Function):
    """[`pooled_cross_fused`]; `has_pairs` `(B, N, 1)` bool marks the rows with a real pair, `None` every row but the
    last (no padding)."""

    @staticmethod
    def forward(ctx, f1: Tensor, f2: Tensor, has_pairs: Tensor | None) -> Tensor:
        B, N, D = f1.shape
        n_fft = fft_length(N)
        real = _fft_dtype(f1.dtype)
        # Without padding, row N-1 (no pair) is left out and padded back as zeros; antidiagonal 2N-1 (no pair,
        # round-off only) feeds only that row.
        rows = N if has_pairs is not None else N - 1
        with torch.autocast(device_type=f1.device.type, enabled=False):
            pair, z_hat = _packed_spectrum(f1, f2, real, n_fft)  # (B, N, D, 2) real, (B, n, D) complex
            # Im(z * z) = 2 (f1 * f2): the mean of antidiagonals 2t and 2t+1 is their sum halved away.
            conv2 = torch.view_as_real(torch.fft.ifft(z_hat * z_hat, dim=1))[:, : 2 * N, :, 1]  # (B, 2N, D)
            merged = conv2.reshape(B, N, 2, D)[:, :rows].mean(2)
            # Minus the self pair (t, t).
            merged = torch.addcmul(merged, pair[:, :rows, :, 0], pair[:, :rows, :, 1], value=-1.0)
            merged = F.pad(merged, (0, 0, 0, 1)) if has_pairs is None else merged * has_pairs
        ctx.save_for_backward(f1, f2, has_pairs)
        return merged

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        f1, f2, has_pairs = ctx.saved_tensors
        B, N, D = f1.shape
        n_fft = fft_length(N)
        real = _fft_dtype(f1.dtype)
        rows = N if has_pairs is not None else N - 1
        with torch.autocast(device_type=f1.device.type, enabled=False):
            grad = grad.to(real)[:, :rows] if has_pairs is None else grad.to(real) * has_pairs  # (B, rows, D)
            # Antidiagonals 2t and 2t+1 each receive row t's gradient; those past 2 * rows are zero padding.
            per_antidiagonal = grad[:, :, None, :].expand(B, rows, 2, D).reshape(B, 2 * rows, D)
            pair, z_hat = _packed_spectrum(f1, f2, real, n_fft)
            corr = torch.fft.fft(torch.fft.ifft(per_antidiagonal, n=n_fft, dim=1) * z_hat, dim=1)[:, :N]
            parts = torch.view_as_real(corr)  # (B, N, D, 2): (df2, df1) before the self pair
            # Minus the self pair, in place on the rows that have a gradient.
            parts[:, :rows, :, 1].addcmul_(grad, pair[:, :rows, :, 1], value=-1.0)
            parts[:, :rows, :, 0].addcmul_(grad, pair[:, :rows, :, 0], value=-1.0)
        return parts[..., 1].to(f1.dtype), parts[..., 0].to(f2.dtype), None


def _fft_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64, everything else is transformed in fp32 (a plain branch: `torch.promote_types` is an op)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _packed_spectrum(f1: Tensor, f2: Tensor, real: torch.dtype, n_fft: int) -> tuple[Tensor, Tensor]:
    """`(f1, f2)` stacked in the FFT's dtype `(B, N, D, 2)` and the spectrum of `f1 + i f2` along the sequence,
    zero-padded to `n_fft`: `(B, n_fft, D)` complex."""
    pair = torch.stack((f1, f2), dim=-1).to(real)
    return pair, torch.fft.fft(torch.view_as_complex(pair), n=n_fft, dim=1)


def pooled_cross_fused(f1: Tensor, f2: Tensor, valid: Tensor | None) -> Tensor:
    """[`pooled_cross_plain`] with one complex FFT forward, two backward, and only `f1`, `f2` saved.

    Args:
        f1, f2 (`torch.Tensor` of shape `(B, N, D)`): the feature maps (zeros at padded positions), of one dtype.
        valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real tokens (`None`: all real).

    Returns:
        `torch.Tensor` of shape `(B, N, D)` in fp32, or fp64 for fp64 inputs.
    """
    if f1.shape != f2.shape or f1.dtype != f2.dtype:
        raise ValueError(f"f1 and f2 must share shape and dtype, got {tuple(f1.shape)} {f1.dtype}, "
                         f"{tuple(f2.shape)} {f2.dtype}")  # fmt: skip
    return _PooledCross.apply(f1, f2, None if valid is None else rows_with_pairs(valid, f1.shape[1], f1.device))

"""FSAT's pooled cross before its LayerNorm: antidiagonal sums of `f1 f2^T` by FFT and the central-token merge.

`merged_t = sum over the real pairs (i, j) with i + j in {2t, 2t+1} and (i, j) != (t, t) of f1_i * f2_j` (per
channel), zero for a row without any real pair. Two implementations:

- [`pooled_cross_plain`]: two zero-padded real FFTs, their product and an inverse, then the merge, in plain autograd
  (the reference; autograd keeps both spectra and the padded copies: about 480 MB per layer at 16K tokens, width 768);
- [`pooled_cross_fused`]: a custom autograd Function that saves only `f1` and `f2` and recomputes in backward, with
  no intermediate larger than a `(B, N, D)` complex tensor (the plain one's spectra are `(B, 2N, D)`);
  [`pooled_cross_stacked`] is the same Function on the two maps stacked `(2, B, N, D)` (the layer's feature maps
  write them so), whose gradient comes back stacked.

The fused one splits each sequence into its even and odd tokens, `f = e(x^2) + x o(x^2)` as polynomials. The merge
keeps antidiagonals `2t` and `2t+1` of `f1 f2`, the odd coefficients of `f1 f2 (1 + x)`, which are
`s1 s2 + (y - 1) o1 o2` in `y = x^2` with `s = e + o`: two linear convolutions of half-length sequences, each done
in an FFT of length N (zero-padded from N/2) instead of 2N. Each real pair is packed into one complex signal,
`p = s1 + i s2` and `q = o1 + i o2`: `Im(p * p) = 2 (s1 * s2)` (`*` the linear convolution), so the merge is
`Im(ifft(fft(p)^2 / 2 + w fft(q)^2))` with `w_k = (exp(-2 pi i k / N) - 1) / 2` (the shift by `y`, minus one, halved),
minus the self pair. The backward is two correlations of the row gradient `g`: `corr(g, p)_u = sum_v g_{u+v} p_v` is
`fft(ifft(g) fft(p))` and holds `(ds2, ds1)` as (real, imaginary) parts; the `q` one reads `g_{t+1} - g_t`, whose
`ifft` is `2 w ifft(g)`. Even tokens get `ds`, odd ones `ds + dq`: the transforms of `ifft(g) fft(p)` and
`ifft(g) (fft(p) + 2 w fft(q))`, then minus the self pair.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels.constants import cached_constant
from ..kernels.dispatch import fsat_pooling_kernels


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
        return _rows_below_last(length, device)
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


@cached_constant
def _rows_below_last(length: int, device: torch.device) -> Tensor:
    """`(1, N, 1)` bool: every row but the last (the rows with a pair when nothing is padding)."""
    return (torch.arange(length, device=device) < length - 1)[None, :, None]


@cached_constant
def _shift_minus_one(length: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """`(N, 1)` of complex `dtype`: `w_k = (exp(-2 pi i k / N) - 1) / 2`, the spectrum of a shift by one token minus
    one, halved (built in fp64)."""
    angle = torch.arange(length, device=device, dtype=torch.float64) * (-2.0 * math.pi / length)
    return ((torch.polar(torch.ones_like(angle), angle) - 1.0) / 2.0).to(dtype).view(length, 1)


class _PooledCross(torch.autograd.Function):
    """[`pooled_cross_fused`] (`f1`, `f2`) and [`pooled_cross_stacked`] (`f1` the stacked maps `(2, B, N, D)`, `f2`
    None: then they are saved as one tensor and their gradient comes back stacked too); `has_pairs` `(B or 1, N, 1)`
    bool marks the rows with a real pair; `kernels` is [`attnzoo.kernels.triton.fsat_pooling`] for the Triton path
    (the elementwise steps between the transforms fused), else None."""

    @staticmethod
    def forward(ctx, f1: Tensor, f2: Tensor | None, has_pairs: Tensor, out_dtype: torch.dtype, kernels) -> Tensor:
        features = f1
        if f2 is None:  # both maps stacked `(2, B, N, D)` in `f1`
            f1, f2 = features[0], features[1]
        N = f1.shape[1]
        real = _fft_dtype(f1.dtype)
        with torch.autocast(device_type=f1.device.type, enabled=False):
            if kernels is not None:
                p_hat, q_hat = (torch.fft.fft(x, dim=1) for x in kernels.pack_halves(f1, f2))  # (B, n, D) each
                n = p_hat.shape[1]
                spectrum = kernels.forward_spectrum(p_hat, q_hat, _shift_minus_one(n, p_hat.dtype, p_hat.device))
                out = kernels.finish_forward(torch.fft.ifft(spectrum, dim=1), f1, f2, has_pairs, out_dtype)
            else:
                p_hat, q_hat = _half_spectra(f1, f2, real)  # (B, n, D) complex each
                n = p_hat.shape[1]
                # fft(q)^2 w + fft(p)^2 / 2, in place: no third (B, n, D) complex tensor.
                spectrum = q_hat.mul_(q_hat).mul_(_shift_minus_one(n, q_hat.dtype, q_hat.device))
                spectrum = spectrum.addcmul_(p_hat, p_hat, value=0.5)
                pooled = torch.view_as_real(torch.fft.ifft(spectrum, dim=1))[:, :N, :, 1]  # (B, N, D)
                # Minus the self pair (t, t) (the bf16 products are exact in fp32), then the rows without a pair are
                # zeroed, written in the output dtype by the same op.
                merged = torch.addcmul(pooled, f1, f2, value=-1.0)
                out = torch.mul(merged, has_pairs, out=torch.empty(merged.shape, dtype=out_dtype, device=f1.device))
        ctx.kernels = kernels
        saved = (features,) if features is not f1 else (f1, f2)
        ctx.stacked = features is not f1
        if has_pairs.shape[0] == 1:
            # The cached mask of an unpadded input (`_rows_below_last`) is shared by every layer: not this call's.
            ctx.has_pairs = has_pairs
            ctx.save_for_backward(*saved)
        else:
            ctx.save_for_backward(*saved, has_pairs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        if ctx.stacked:
            features, *padded = ctx.saved_tensors
            f1, f2 = features[0], features[1]
            # The two gradients written into one contiguous `(2, B, N, D)` tensor, the stacked input's.
            stacked_grad = torch.empty(features.shape, dtype=features.dtype, device=features.device)
            grad_f1, grad_f2 = stacked_grad[0], stacked_grad[1]
            grads = (stacked_grad, None)
        else:
            f1, f2, *padded = ctx.saved_tensors
            grad_f1, grad_f2 = torch.empty_like(f1), torch.empty_like(f2)
            grads = (grad_f1, grad_f2)
        has_pairs = padded[0] if padded else ctx.has_pairs
        B, N, D = f1.shape
        real = _fft_dtype(f1.dtype)
        kernels = ctx.kernels
        with torch.autocast(device_type=f1.device.type, enabled=False):
            if kernels is not None:
                if grad.stride(-1) != 1:
                    grad = grad.contiguous()
                p_hat, q_hat = (torch.fft.fft(x, dim=1) for x in kernels.pack_halves(f1, f2))  # (B, n, D) each
                n = p_hat.shape[1]
                grad_hat = torch.fft.ifft(kernels.complex_grad(grad, has_pairs, n), dim=1)  # (B, n, D) complex
                shift = _shift_minus_one(n, p_hat.dtype, p_hat.device)
                even, odd = (torch.fft.fft(x, dim=1) for x in kernels.backward_products(grad_hat, p_hat, q_hat, shift))
                kernels.finish_backward(even, odd, grad, f1, f2, has_pairs, out=(grad_f1, grad_f2))
                return (*grads, None, None, None)
            # The rows without a pair have no gradient. The mask writes the gradient as complex in the same op, so
            # that its inverse FFT is a complex one (that of a real tensor comes out conjugated, and each product
            # with it then copies it first).
            complex_grad = torch.empty(grad.shape, dtype=_complex_dtype(real), device=grad.device)
            complex_grad = torch.mul(grad, has_pairs, out=complex_grad)  # (B, N, D)
            grad = torch.view_as_real(complex_grad)[..., 0]
            p_hat, q_hat = _half_spectra(f1, f2, real)
            n = p_hat.shape[1]
            grad_hat = torch.fft.ifft(complex_grad, n=n, dim=1)  # (B, n, D) complex
            # Even tokens get ds, odd ones ds + 2 dq (the 2 of `ifft(g_{t+1} - g_t) = 2 w ifft(g)`): one transform
            # each, of `ifft(g) fft(p)` and `ifft(g) (fft(p) + 2 w fft(q))`, as (df2, df1) in (real, imaginary) parts.
            odd_hat = torch.addcmul(p_hat, _shift_minus_one(n, p_hat.dtype, p_hat.device), q_hat, value=2.0)
            even = torch.view_as_real(torch.fft.fft(grad_hat * p_hat, dim=1)[:, : n // 2])  # (B, n/2, D, 2)
            odd = torch.view_as_real(torch.fft.fft(odd_hat.mul_(grad_hat), dim=1)[:, : n // 2])
            parts = torch.stack((even, odd), dim=2).view(B, n, D, 2)[:, :N]  # (B, N, D, 2)
            # Minus the self pair, written in the inputs' dtype by the same op: (df1, df2) -= g (f2, f1).
            torch.addcmul(parts[..., 1], grad, f2, value=-1.0, out=grad_f1)
            torch.addcmul(parts[..., 0], grad, f1, value=-1.0, out=grad_f2)
        return (*grads, None, None, None)


def _fft_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64, everything else is transformed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _complex_dtype(real: torch.dtype) -> torch.dtype:
    return torch.complex128 if real == torch.float64 else torch.complex64


def _half_spectra(f1: Tensor, f2: Tensor, real: torch.dtype) -> tuple[Tensor, Tensor]:
    """The length-`n` spectra of `p = s1 + i s2` and `q = o1 + i o2` along the sequence (`n` = N rounded up to even,
    `s` / `o` the sums / odd tokens of each pair of tokens, zero-padded from n/2): `(B, n, D)` complex each."""
    B, N, D = f1.shape
    n = N + N % 2
    # Zero-padded to 2n tokens first, so that the sums and odd tokens of each pair of tokens come out zero-padded
    # to n rows (the transforms' length) by the ops that compute them.
    pair = F.pad(torch.stack((f1, f2), dim=-1), (0, 0, 0, 0, 0, 2 * n - N))  # (B, 2n, D, 2)
    grouped = pair.view(B, n, 2, D, 2)
    p = grouped.sum(2, dtype=real)  # (B, n, D, 2): summed in the FFT's dtype, exact for bf16
    q = grouped[:, :, 1].to(real, memory_format=torch.contiguous_format)
    p_hat = torch.fft.fft(torch.view_as_complex(p), dim=1)
    q_hat = torch.fft.fft(torch.view_as_complex(q), dim=1)
    return p_hat, q_hat


def pooled_cross_fused(
    f1: Tensor, f2: Tensor, valid: Tensor | None, out_dtype: torch.dtype | None = None, backend: str = "fast"
) -> Tensor:
    """[`pooled_cross_plain`] with transforms of length N (three forward, five backward), and only `f1`, `f2` saved.

    Args:
        f1, f2 (`torch.Tensor` of shape `(B, N, D)`): the feature maps (zeros at padded positions), of one dtype.
        valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real tokens (`None`: all real).
        out_dtype (`torch.dtype`, *optional*): the output's dtype (rounded once, at the end); by default the FFT's.
        backend (`str`, *optional*, defaults to `"fast"`): an attention backend; where it resolves to Triton (and the
            feature maps are fp32, bf16 or fp16), the elementwise steps between the transforms run as Triton kernels
            ([`attnzoo.kernels.triton.fsat_pooling`]: the same values with 9 torch ops less forward and 11 backward).

    Returns:
        `torch.Tensor` of shape `(B, N, D)` in `out_dtype`, by default fp32, or fp64 for fp64 inputs.
    """
    if f1.shape != f2.shape or f1.dtype != f2.dtype:
        raise ValueError(f"f1 and f2 must share shape and dtype, got {tuple(f1.shape)} {f1.dtype}, "
                         f"{tuple(f2.shape)} {f2.dtype}")  # fmt: skip
    return _pooled_cross(f1, f2, valid, out_dtype, backend)


def pooled_cross_stacked(
    features: Tensor, valid: Tensor | None, out_dtype: torch.dtype | None = None, backend: str = "fast"
) -> Tensor:
    """[`pooled_cross_fused`] of the feature maps stacked `(2, B, N, D)` (`f1`, `f2` = `features[0]`, `[1]`): the
    same values, one saved tensor, and the gradient stacked as well, as [`~attnzoo.fsat.feature_maps.mlp_feature_maps`]
    writes and reads them (no copy either way).

    Args:
        features (`torch.Tensor` of shape `(2, B, N, D)`): the two feature maps (zeros at padded positions).
        valid, out_dtype, backend: as for [`pooled_cross_fused`].
    """
    if features.dim() != 4 or features.shape[0] != 2:
        raise ValueError(f"the stacked feature maps must be (2, B, N, D), got {tuple(features.shape)}")
    return _pooled_cross(features, None, valid, out_dtype, backend)


def _pooled_cross(
    f1: Tensor, f2: Tensor | None, valid: Tensor | None, out_dtype: torch.dtype | None, backend: str
) -> Tensor:
    """[`_PooledCross`] on the torch path or the Triton one (`f2` None: `f1` holds both maps stacked)."""
    length, device, dtype = f1.shape[-2], f1.device, f1.dtype
    has_pairs = _rows_below_last(length, device) if valid is None else rows_with_pairs(valid, length, device)
    out_dtype = _fft_dtype(dtype) if out_dtype is None else out_dtype
    kernels = fsat_pooling_kernels(backend, device, dtype)
    if kernels is None:
        return _PooledCross.apply(f1, f2, has_pairs, out_dtype, None)
    return _pooled_cross_triton(f1, f2, has_pairs, out_dtype, kernels)


# A compiler boundary, as for FSAT's edge kernels (`FSATAttention.sparse_attend`): the Function launching Triton
# kernels from its forward and backward runs eagerly under `torch.compile` (one graph break), the rest is compiled.
@torch.compiler.disable
def _pooled_cross_triton(f1: Tensor, f2: Tensor | None, has_pairs: Tensor, out_dtype: torch.dtype, kernels) -> Tensor:
    return _PooledCross.apply(f1, f2, has_pairs, out_dtype, kernels)

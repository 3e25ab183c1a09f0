"""Triton kernels of FSAT's fused pooled cross's elementwise steps ([`attnzoo.fsat.pooling`]), CUDA's path.

The transforms stay cuFFT's; the kernels fuse what lies between them, each equal to the torch code it replaces in
`pooling._PooledCross` (the same fp32 operations in the same order):

- [`pack_halves`]: `p = s1 + i s2` and `q = o1 + i o2` of each pair of tokens, zero-padded to `n` rows, as complex
  tensors (the torch code stacks, pads, sums and casts);
- [`forward_spectrum`]: `fft(q)^2 w + fft(p)^2 / 2` (torch: two in-place products and an `addcmul_`);
- [`finish_forward`]: the imaginary part minus the self pair `f1 f2`, the rows without a pair zeroed, rounded to the
  output dtype (torch: `addcmul`, `mul`);
- [`complex_grad`]: the incoming gradient, masked, as the complex input of the backward's inverse transform
  (torch: a `mul` into a complex tensor);
- [`backward_products`]: `ifft(g) fft(p)` and `ifft(g) (fft(p) + 2 w fft(q))` (torch: `addcmul`, `mul`, `mul_`);
- [`finish_backward`]: `(df1, df2) = (corr_im, corr_re) - g (f2, f1)` read token by token from the two transformed
  products, with the rows without a pair masked out of `g` (torch: `stack` and two `addcmul`).

Each transform keeps its own call: one call on both spectra would write a `(B, n, 2, D)` complex tensor, twice a
layer's FFN activation (the largest tensor a dense layer writes).

Imported only where the attention backend resolves to Triton (on CUDA, or on CPU under Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 256  # channels per program
NUM_WARPS = 4


@triton.jit
def _row_block(length, D, BLOCK: tl.constexpr):
    """This program's row `b * length + t` of a `(B, length, D)` tensor (tokens or frequencies), `b`, `t`, and its
    block of channels with their mask."""
    row = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    return row, row // length, row % length, d, d < D


@triton.jit
def _pack_halves(F1, F2, P, Q, N, n, D, sf1_b, sf1_n, sf2_b, sf2_n, BLOCK: tl.constexpr):
    row, b, r, d, ok = _row_block(n, D, BLOCK)
    even = 2 * r
    odd = even + 1
    # The channels of a token past the last one are masked (zero padding).
    has_even = d < tl.where(even < N, D, 0)
    has_odd = d < tl.where(odd < N, D, 0)
    e1 = tl.load(F1 + b * sf1_b + even * sf1_n + d, mask=has_even, other=0.0).to(tl.float32)
    o1 = tl.load(F1 + b * sf1_b + odd * sf1_n + d, mask=has_odd, other=0.0).to(tl.float32)
    e2 = tl.load(F2 + b * sf2_b + even * sf2_n + d, mask=has_even, other=0.0).to(tl.float32)
    o2 = tl.load(F2 + b * sf2_b + odd * sf2_n + d, mask=has_odd, other=0.0).to(tl.float32)
    dst = row * 2 * D + 2 * d  # (b, r, d, re)
    tl.store(P + dst, e1 + o1, mask=ok)
    tl.store(P + dst + 1, e2 + o2, mask=ok)
    tl.store(Q + dst, o1, mask=ok)
    tl.store(Q + dst + 1, o2, mask=ok)


@triton.jit
def _cmul(ar, ai, br, bi):
    return ar * br - ai * bi, ar * bi + ai * br


@triton.jit
def _load_complex(X, b, k, d, ok, s_b, s_k, s_d):
    """Real and imaginary parts of `X[b, k, d]` (a complex tensor read through `view_as_real` strides)."""
    x = X + b * s_b + k * s_k + d * s_d
    return tl.load(x, mask=ok, other=0.0), tl.load(x + 1, mask=ok, other=0.0)


@triton.jit
def _forward_spectrum(P_HAT, Q_HAT, W, OUT, n, D, sp_b, sp_k, sp_d, sq_b, sq_k, sq_d, BLOCK: tl.constexpr):
    row, b, k, d, ok = _row_block(n, D, BLOCK)
    pr, pi = _load_complex(P_HAT, b, k, d, ok, sp_b, sp_k, sp_d)
    qr, qi = _load_complex(Q_HAT, b, k, d, ok, sq_b, sq_k, sq_d)
    wr, wi = _load_complex(W, 0, k, 0, True, 0, 2, 0)  # the twiddle of frequency k
    sr, si = _cmul(qr, qi, qr, qi)
    sr, si = _cmul(sr, si, wr, wi)
    ppr, ppi = _cmul(pr, pi, pr, pi)
    dst = OUT + row * 2 * D + 2 * d
    tl.store(dst, sr + ppr * 0.5, mask=ok)
    tl.store(dst + 1, si + ppi * 0.5, mask=ok)


@triton.jit
def _finish_forward(
    POOLED, F1, F2, PAIRS, OUT, N, D, sp_b, sp_k, sp_d, sf1_b, sf1_n, sf2_b, sf2_n, pairs_b, BLOCK: tl.constexpr
):  # fmt: skip
    row, b, t, d, ok = _row_block(N, D, BLOCK)
    pooled = tl.load(POOLED + b * sp_b + t * sp_k + d * sp_d + 1, mask=ok, other=0.0)  # imaginary part
    a = tl.load(F1 + b * sf1_b + t * sf1_n + d, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(F2 + b * sf2_b + t * sf2_n + d, mask=ok, other=0.0).to(tl.float32)
    keep = tl.load(PAIRS + b * pairs_b + t).to(tl.float32)
    out = (pooled - a * c) * keep
    tl.store(OUT + row * D + d, out.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _complex_grad(GRAD, PAIRS, OUT, N, n, D, sg_b, sg_n, pairs_b, BLOCK: tl.constexpr):
    row, b, t, d, ok = _row_block(n, D, BLOCK)
    real = d < tl.where(t < N, D, 0)  # the rows past the last token are the transform's zero padding
    keep = tl.load(PAIRS + b * pairs_b + tl.minimum(t, N - 1)).to(tl.float32)
    g = tl.load(GRAD + b * sg_b + t * sg_n + d, mask=real, other=0.0).to(tl.float32) * keep
    dst = OUT + row * 2 * D + 2 * d
    tl.store(dst, g, mask=ok)
    tl.store(dst + 1, tl.zeros_like(g), mask=ok)


@triton.jit
def _backward_products(
    GRAD_HAT, P_HAT, Q_HAT, W, EVEN, ODD, n, D, sg_b, sg_k, sg_d, sp_b, sp_k, sp_d, sq_b, sq_k, sq_d,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row, b, k, d, ok = _row_block(n, D, BLOCK)
    pr, pi = _load_complex(P_HAT, b, k, d, ok, sp_b, sp_k, sp_d)
    qr, qi = _load_complex(Q_HAT, b, k, d, ok, sq_b, sq_k, sq_d)
    gr, gi = _load_complex(GRAD_HAT, b, k, d, ok, sg_b, sg_k, sg_d)
    wr, wi = _load_complex(W, 0, k, 0, True, 0, 2, 0)  # the twiddle of frequency k
    er, ei = _cmul(gr, gi, pr, pi)
    xr, xi = _cmul(wr, wi, qr, qi)
    hr, hi = _cmul(pr + xr * 2.0, pi + xi * 2.0, gr, gi)
    dst = row * 2 * D + 2 * d
    tl.store(EVEN + dst, er, mask=ok)
    tl.store(EVEN + dst + 1, ei, mask=ok)
    tl.store(ODD + dst, hr, mask=ok)
    tl.store(ODD + dst + 1, hi, mask=ok)


@triton.jit
def _finish_backward(
    EVEN, ODD, GRAD, F1, F2, PAIRS, DF1, DF2, N, D, se_b, se_k, se_d, so_b, so_k, so_d,
    sg_b, sg_n, sf1_b, sf1_n, sf2_b, sf2_n, pairs_b, BLOCK: tl.constexpr,
):  # fmt: skip
    row, b, t, d, ok = _row_block(N, D, BLOCK)
    # Token t's correlations: row t // 2 of the even tokens' transform or of the odd ones'.
    is_even = d < tl.where(t % 2 == 0, D, 0)
    is_odd = d < tl.where(t % 2 == 1, D, 0)
    e = EVEN + b * se_b + (t // 2) * se_k + d * se_d
    o = ODD + b * so_b + (t // 2) * so_k + d * so_d
    re = tl.load(e, mask=is_even, other=0.0) + tl.load(o, mask=is_odd, other=0.0)
    im = tl.load(e + 1, mask=is_even, other=0.0) + tl.load(o + 1, mask=is_odd, other=0.0)
    keep = tl.load(PAIRS + b * pairs_b + t).to(tl.float32)
    g = tl.load(GRAD + b * sg_b + t * sg_n + d, mask=ok, other=0.0).to(tl.float32) * keep
    a = tl.load(F1 + b * sf1_b + t * sf1_n + d, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(F2 + b * sf2_b + t * sf2_n + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(DF1 + row * D + d, (im - g * c).to(DF1.dtype.element_ty), mask=ok)
    tl.store(DF2 + row * D + d, (re - g * a).to(DF2.dtype.element_ty), mask=ok)


def _rows(x: Tensor) -> tuple[int, int]:
    """Batch and token strides of a `(B, N, D)` tensor whose channels are contiguous."""
    if x.stride(-1) != 1:
        raise ValueError("the channels (last axis) must be contiguous")
    return x.stride(0), x.stride(1)


def _complex_strides(x: Tensor) -> tuple[int, ...]:
    """The strides of a complex tensor in real elements (the transforms choose their outputs' layouts)."""
    return tuple(2 * stride for stride in x.stride())


def _table(shift: Tensor) -> Tensor:
    """`w` `(n, 1)` complex64 as `(n, 2)` contiguous reals."""
    return torch.view_as_real(shift).reshape(-1, 2)


def _grid(rows: int, width: int) -> tuple[int, int]:
    return rows, triton.cdiv(width, BLOCK)


def _pair_mask(has_pairs: Tensor) -> tuple[Tensor, int]:
    """`has_pairs` `(B or 1, N, 1)` bool as bytes, and its batch stride (0 when shared by the batch)."""
    mask = has_pairs.contiguous().view(torch.uint8)
    return mask, 0 if has_pairs.shape[0] == 1 else has_pairs.shape[1]


def _spectra(B: int, n: int, D: int, device: torch.device) -> tuple[Tensor, Tensor]:
    return tuple(torch.empty(B, n, D, dtype=torch.complex64, device=device) for _ in range(2))


def pack_halves(f1: Tensor, f2: Tensor) -> tuple[Tensor, Tensor]:
    """`p = s1 + i s2` and `q = o1 + i o2` `(B, n, D)` complex64 each (`n` = N rounded up to even; rows from N/2 on
    zero)."""
    B, N, D = f1.shape
    n = N + N % 2
    p, q = _spectra(B, n, D, f1.device)
    if p.numel():
        _pack_halves[_grid(B * n, D)](
            f1, f2, torch.view_as_real(p), torch.view_as_real(q), N, n, D, *_rows(f1), *_rows(f2),
            BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    return p, q


def forward_spectrum(p_hat: Tensor, q_hat: Tensor, shift: Tensor) -> Tensor:
    """`fft(q)^2 w + fft(p)^2 / 2` `(B, n, D)` complex64 from the spectra `(B, n, D)` and `w` `(n, 1)`."""
    B, n, D = p_hat.shape
    out = torch.empty(B, n, D, dtype=torch.complex64, device=p_hat.device)
    if out.numel():
        _forward_spectrum[_grid(B * n, D)](
            torch.view_as_real(p_hat), torch.view_as_real(q_hat), _table(shift), torch.view_as_real(out), n, D,
            *_complex_strides(p_hat), *_complex_strides(q_hat), BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    return out


def finish_forward(pooled: Tensor, f1: Tensor, f2: Tensor, has_pairs: Tensor, out_dtype: torch.dtype) -> Tensor:
    """`(Im(pooled)[:, :N] - f1 f2) * has_pairs` `(B, N, D)` in `out_dtype` (`pooled` `(B, n, D)` complex64)."""
    B, N, D = f1.shape
    out = torch.empty(B, N, D, dtype=out_dtype, device=f1.device)
    mask, mask_b = _pair_mask(has_pairs)
    if out.numel():
        _finish_forward[_grid(B * N, D)](
            torch.view_as_real(pooled), f1, f2, mask, out, N, D, *_complex_strides(pooled), *_rows(f1), *_rows(f2),
            mask_b, BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    return out


def complex_grad(grad: Tensor, has_pairs: Tensor, n: int) -> Tensor:
    """The incoming gradient `(B, N, D)` as `(B, n, D)` complex64, zeroed on the rows without a pair and zero-padded
    to `n` rows (torch: a masked multiplication into a complex tensor, padded by the inverse transform)."""
    B, N, D = grad.shape
    out = torch.empty(B, n, D, dtype=torch.complex64, device=grad.device)
    mask, mask_b = _pair_mask(has_pairs)
    if out.numel():
        _complex_grad[_grid(B * n, D)](
            grad, mask, torch.view_as_real(out), N, n, D, *_rows(grad), mask_b, BLOCK=BLOCK, num_warps=NUM_WARPS
        )
    return out


def backward_products(grad_hat: Tensor, p_hat: Tensor, q_hat: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
    """`ifft(g) fft(p)` and `(fft(p) + 2 w fft(q)) ifft(g)`, `(B, n, D)` complex64 each."""
    B, n, D = p_hat.shape
    even, odd = _spectra(B, n, D, p_hat.device)
    if even.numel():
        _backward_products[_grid(B * n, D)](
            torch.view_as_real(grad_hat), torch.view_as_real(p_hat), torch.view_as_real(q_hat), _table(shift),
            torch.view_as_real(even), torch.view_as_real(odd), n, D,
            *_complex_strides(grad_hat), *_complex_strides(p_hat), *_complex_strides(q_hat),
            BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    return even, odd


def finish_backward(
    even: Tensor,
    odd: Tensor,
    grad: Tensor,
    f1: Tensor,
    f2: Tensor,
    has_pairs: Tensor,
    out: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """`(df1, df2)` in the dtype of `f1`: token `t` reads row `t // 2` of the even tokens' transformed product
    `even` or of the odd ones' `odd` (`(B, n, D)` complex64), minus the self pair `g (f2, f1)` with `g` the incoming
    gradient zeroed on the rows without a pair. `out`: two contiguous `(B, N, D)` tensors to write them into (the
    halves of a stacked gradient), else new ones."""
    B, N, D = f1.shape
    if out is None:
        out = tuple(torch.empty(B, N, D, dtype=f.dtype, device=f.device) for f in (f1, f2))
    grad_f1, grad_f2 = out
    if not (grad_f1.is_contiguous() and grad_f2.is_contiguous()):
        raise ValueError("the gradients are written as contiguous (B, N, D) tensors")
    mask, mask_b = _pair_mask(has_pairs)
    if grad_f1.numel():
        _finish_backward[_grid(B * N, D)](
            torch.view_as_real(even), torch.view_as_real(odd), grad, f1, f2, mask, grad_f1, grad_f2, N, D,
            *_complex_strides(even), *_complex_strides(odd), *_rows(grad), *_rows(f1), *_rows(f2), mask_b,
            BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    return grad_f1, grad_f2

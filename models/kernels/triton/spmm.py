"""Triton CSR products over row-sorted edges: SDDMM and the two SpMMs (`G @ X` and `Gᵀ @ Y`) in one pass.

One program per row reads only the edges between its row pointers, so a fixed-size edge list whose tail is padding
(edges past `crow[-1]`, see [`attnzoo.kernels.CSRPattern`]) needs no compaction and no host sync. Values and
outputs are fp32 (inputs of any float dtype are loaded and accumulated in fp32); `Gᵀ @ Y` adds each row's
contribution into the output with atomics, like the edge kernel's dK / dV.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch import block_d

#: edges per chunk (as the edge kernel)
BLOCK_E = 16


@triton.jit
def _csr_sddmm(CROW, COLS, A, B, OUT, alpha, sa, sb, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    a = tl.load(A + row * sa + dim, mask=dim_ok, other=0.0).to(tl.float32)
    start, end = tl.load(CROW + row), tl.load(CROW + row + 1)
    for e0 in range(start, end, BLOCK_E):
        edge = e0 + tl.arange(0, BLOCK_E)
        ok = edge < end
        col = tl.load(COLS + edge, mask=ok, other=0).to(tl.int64)
        b = tl.load(B + col[:, None] * sb + dim[None, :], mask=ok[:, None] & dim_ok[None, :], other=0.0)
        tl.store(OUT + edge, tl.sum(b.to(tl.float32) * a[None, :], 1) * alpha, mask=ok)


@triton.jit
def _csr_spmm_pair(
    CROW, COLS, VALUES, MASK, X, Y, OUT_X, OUT_Y, sx, sy, clip,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, NEED_X: tl.constexpr, NEED_Y: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_CLIP: tl.constexpr,
):  # fmt: skip
    # OUT_X[row] = Σ_e values_e X[col_e] (row-local); OUT_Y[col_e] += values_e Y[row] (atomics, fp32 (C, D) buffer),
    # with values_e = clamp(values_e * mask_e, -clip, clip) when given
    row = tl.program_id(0).to(tl.int64)
    dim = tl.arange(0, BLOCK_D)
    dim_ok = dim < D
    start, end = tl.load(CROW + row), tl.load(CROW + row + 1)
    y = tl.zeros([BLOCK_D], tl.float32)
    if NEED_Y:
        y = tl.load(Y + row * sy + dim, mask=dim_ok, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for e0 in range(start, end, BLOCK_E):
        edge = e0 + tl.arange(0, BLOCK_E)
        ok = edge < end
        mask = ok[:, None] & dim_ok[None, :]
        col = tl.load(COLS + edge, mask=ok, other=0).to(tl.int64)
        value = tl.load(VALUES + edge, mask=ok, other=0.0).to(tl.float32)
        if HAS_MASK:
            value = tl.where(tl.load(MASK + edge, mask=ok, other=0) != 0, value, 0.0)
        if HAS_CLIP:
            value = tl.minimum(tl.maximum(value, -clip), clip)
        if NEED_X:
            x = tl.load(X + col[:, None] * sx + dim[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += tl.sum(value[:, None] * x, 0)
        if NEED_Y:
            tl.atomic_add(OUT_Y + col[:, None] * D + dim[None, :], value[:, None] * y[None, :], mask=mask)
    if NEED_X:
        tl.store(OUT_X + row * D + dim, acc, mask=dim_ok)


def _rows(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def csr_sddmm_triton(crow: Tensor, cols: Tensor, a: Tensor, b: Tensor, alpha: float) -> Tensor:
    """`alpha * <a[r], b[cols_e]>` for every edge `e` of row `r` (fp32, `(E,)`); padding edges give 0.

    Args:
        crow (`torch.LongTensor` of shape `(R + 1,)`): row pointers.
        cols (`torch.LongTensor` of shape `(E,)`): column of each edge (rows sorted; padding past `crow[-1]`).
        a (`torch.Tensor` of shape `(R, D)`), b (`torch.Tensor` of shape `(C, D)`): the two factors.
        alpha (`float`): scale.
    """
    a, b = _rows(a), _rows(b)
    out = torch.zeros(cols.shape, dtype=torch.float32, device=cols.device)
    num_rows, width = a.shape
    if num_rows > 0:
        _csr_sddmm[(num_rows,)](
            crow, cols, a, b, out, float(alpha), a.stride(0), b.stride(0),
            D=width, BLOCK_D=block_d(width), BLOCK_E=BLOCK_E,
        )  # fmt: skip
    return out


def csr_spmm_pair_triton(
    crow: Tensor,
    cols: Tensor,
    values: Tensor,
    x: Tensor | None,
    y: Tensor | None,
    num_cols: int,
    mask: Tensor | None = None,
    clip: float | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """`G @ x` and `Gᵀ @ y` for the sparse `(R, C)` matrix `G` with `values` on the edges, in one pass (fp32); with
    `mask` and `clip` its entries are `clamp(values * mask, -clip, clip)`, made as the kernel loads them.

    Args:
        crow (`torch.LongTensor` of shape `(R + 1,)`): row pointers.
        cols (`torch.LongTensor` of shape `(E,)`): column of each edge (rows sorted; padding past `crow[-1]`).
        values (`torch.Tensor` of shape `(E,)`): the entries of `G`.
        x (`torch.Tensor` of shape `(C, D)`, *optional*): right factor of `G @ x` (skipped when `None`).
        y (`torch.Tensor` of shape `(R, D)`, *optional*): right factor of `Gᵀ @ y` (skipped when `None`).
        num_cols (`int`): `C`.
        mask (`torch.BoolTensor` of shape `(E,)`, *optional*): edges whose value counts (the others are 0).
        clip (`float`, *optional*): bound of the entries' magnitude.

    Returns:
        `(G @ x, Gᵀ @ y)`, `(R, D)` and `(C, D)` in fp32 (`None` for a skipped product).
    """
    if x is None and y is None:
        return None, None
    x, y = (None if t is None else _rows(t) for t in (x, y))
    num_rows = crow.shape[0] - 1
    width = (x if x is not None else y).shape[1]
    out_x = None if x is None else torch.empty(num_rows, width, dtype=torch.float32, device=cols.device)
    out_y = None if y is None else torch.zeros(num_cols, width, dtype=torch.float32, device=cols.device)
    if num_rows > 0:
        # absent operands still need a pointer argument; NEED_X / NEED_Y keep the kernel from touching it
        placeholder = values
        _csr_spmm_pair[(num_rows,)](
            crow, cols, values.contiguous(), cols if mask is None else mask.view(torch.uint8),
            placeholder if x is None else x, placeholder if y is None else y,
            placeholder if out_x is None else out_x, placeholder if out_y is None else out_y,
            0 if x is None else x.stride(0), 0 if y is None else y.stride(0), 0.0 if clip is None else float(clip),
            D=width, BLOCK_D=block_d(width), BLOCK_E=BLOCK_E, NEED_X=x is not None, NEED_Y=y is not None,
            HAS_MASK=mask is not None, HAS_CLIP=clip is not None,
        )  # fmt: skip
    return out_x, out_y

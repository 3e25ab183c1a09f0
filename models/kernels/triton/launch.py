"""Launch helpers shared by the Triton kernels: dtypes they accept, head-size blocks, strides."""

from __future__ import annotations

import torch
import triton
from torch import Tensor

#: dtypes the kernels load (and accumulate in fp32); fp64 stays on the torch paths.
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_dtypes(*tensors: Tensor) -> None:
    """Raise `ValueError` unless every tensor has one dtype the kernels take."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or next(iter(dtypes)) not in TRITON_DTYPES:
        raise ValueError(
            f"The Triton kernels take q, k and v of one dtype among {TRITON_DTYPES}, got {sorted(map(str, dtypes))}."
        )


def block_d(head_dim: int) -> int:
    """Power-of-two tile width covering the head size (tl.arange needs a power of two); extra lanes are masked."""
    return max(16, triton.next_power_of_2(head_dim))


def row_strides(x: Tensor) -> tuple[int, ...]:
    """Strides of every axis but the last of a `(..., N, d)` tensor whose last axis is contiguous (any stride when
    d = 1: `.contiguous()` keeps such a view as it is, and the kernels read only offset 0 of it)."""
    if x.stride(-1) != 1 and x.shape[-1] != 1:
        raise ValueError("the last axis must be contiguous")
    return tuple(x.stride()[:-1])


def dense(t: Tensor) -> Tensor:
    """`t`, or a contiguous copy unless it is dense with a contiguous last axis: tensors made like it (`empty_like`:
    outputs, gradient buffers) then share its strides, so that one set of offsets addresses them all. The stride of an
    axis of size 1 is never used (its index is 0), so it may differ."""
    like = torch.empty_like(t, device="meta")
    used = [size > 1 for size in t.shape]
    if (t.stride(-1) == 1 or not used[-1]) and all(
        a == b for a, b, axis_used in zip(t.stride(), like.stride(), used, strict=True) if axis_used
    ):
        return t
    return t.contiguous()


def query_tile_meta(head_dim: int) -> dict:
    """The launch parameters of the kernels that give each program a block of queries and the full head size
    (gathered and interpolated attention): `D`, `BLOCK_D`, `BLOCK_M` (queries per program) and `num_warps`."""
    width = block_d(head_dim)
    return {
        "D": head_dim,
        "BLOCK_D": width,
        # About 1K (query, dimension) lanes per tile: ptxas (sm_90, bf16, J = 2, every option on) compiled
        # d = 32 / 64 / 128 without register spills at 16 / 16 / 8 queries and 4 / 8 / 8 warps; twice the queries
        # spilled.
        "BLOCK_M": min(16, max(4, 1024 // width)),
        "num_warps": 4 if width <= 32 else 8,
    }


def pointer_or(tensor: Tensor | None, placeholder: Tensor) -> Tensor:
    """`tensor`, or `placeholder` for an absent optional input: a kernel still takes a pointer argument for it, and
    a constexpr flag keeps the kernel from reading it."""
    return placeholder if tensor is None else tensor

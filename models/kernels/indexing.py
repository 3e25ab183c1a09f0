"""Reshaping helpers that turn per-(batch, head) tensors and indices into the flat row space of the edge kernels."""

from __future__ import annotations

import torch
from torch import Tensor


def flatten_heads(x: Tensor) -> Tensor:
    """Merge the batch, head and sequence axes into one row axis.

    Args:
        x (`torch.Tensor` of shape `(B, H, N, d)`):
            Per-head queries, keys or values.

    Returns:
        `torch.Tensor` of shape `(B * H * N, d)`: a view when `x` is contiguous, a copy otherwise.
    """
    return x.reshape(-1, x.shape[-1])


def unflatten_heads(x: Tensor, B: int, H: int, N: int) -> Tensor:
    """Inverse of [`flatten_heads`].

    Args:
        x (`torch.Tensor` of shape `(B * H * N, d)`):
            Flat rows.
        B (`int`): batch size.
        H (`int`): number of heads.
        N (`int`): sequence length.

    Returns:
        `torch.Tensor` of shape `(B, H, N, d)`.
    """
    return x.reshape(B, H, N, x.shape[-1])


def batch_head_offsets(B: int, H: int, N: int, device: torch.device | str | None = None) -> Tensor:
    """Row offset of every (batch, head) block in the flattened `(B * H * N, d)` layout.

    Adding it to per-(b, h) local indices in `[0, N)` gives flat row indices, e.g.
    `cols = idx + batch_head_offsets(B, H, Nk, idx.device)[..., None]` for `idx` of shape `(B, H, Nq, K)`.

    Args:
        B (`int`): batch size.
        H (`int`): number of heads.
        N (`int`): sequence length of the indexed tensor.
        device (`torch.device`, *optional*): device of the result.

    Returns:
        `torch.LongTensor` of shape `(B, H, 1)` holding `(b * H + h) * N`.
    """
    return (torch.arange(B * H, device=device, dtype=torch.int64) * N).view(B, H, 1)

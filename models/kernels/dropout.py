"""Attention-dropout masks shared by the reference and fast kernels, so both can be driven by the same mask."""

from __future__ import annotations

import torch
from torch import Tensor


def sample_keep_mask(
    shape: tuple[int, ...], dropout_p: float, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """Draw a boolean keep-mask where each entry is kept with probability `1 - dropout_p`."""
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")
    return torch.rand(shape, device=device, generator=generator) >= dropout_p


def keep_multiplier(keep: Tensor, dropout_p: float, dtype: torch.dtype) -> Tensor:
    """Inverted-dropout factor per entry: `keep / (1 - p)`, all zeros when `p == 1` (like `F.dropout`)."""
    scale = 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)
    return keep.to(dtype) * scale

"""Attention-dropout masks shared by the reference and fast kernels, so that every implementation drops the same
entries.

In training a primitive's mask is the counter hash of a seed drawn once per call (`kernels.hashing`): the Triton
kernels regenerate each decision from the position they read (as FlashAttention regenerates its Philox dropout), so
no mask is built or stored for backward; the torch implementations materialise the same mask from the same seed.
A caller may also hand a primitive an explicit mask (`keep`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .hashing import draw_seeds, seed_or_draw


def call_dropout(
    keep: Tensor | None,
    keep_seed: Tensor | None,
    global_seed: Tensor | None,
    *,
    global_rows: int,
    dropout_p: float,
    training: bool,
    fused: bool,
    materialise: Callable[[Tensor], Tensor],
    device: torch.device,
    generator: torch.Generator | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The dropout of one primitive call, for the implementation that runs: `(keep, keep_seed, rows_seed)`.

    Args:
        keep (`torch.BoolTensor`, *optional*): an explicit mask from the caller: used as given.
        keep_seed (`torch.LongTensor` of shape `()`, *optional*): the seed of the hashed mask (drawn from `generator`
            or the default one when `None`, in training with dropout).
        global_seed (`torch.LongTensor` of shape `()`, *optional*): the seed of the global queries' rows' mask
            (`kernels.global_rows`; drawn likewise when `None`).
        global_rows (`int`): how many global rows the primitive computes (0: none, no seed for them).
        fused (`bool`): the implementation regenerates the hashed mask itself (the Triton kernels): it gets the seed;
            the others get the mask, from `materialise(seed)`.

    Returns:
        `(keep, None)`, `(None, keep_seed)` or `(None, None)` (no dropout), then the rows' seed (`None` without rows
        or without dropout). When both seeds are drawn, they come from one draw: a kernel launch less per layer.
    """
    if keep is not None and keep_seed is not None:
        raise ValueError("a dropout mask comes as keep or as keep_seed, not both")
    if not (training and dropout_p > 0.0):
        return keep, None, None
    if global_rows and keep is None and keep_seed is None and global_seed is None:
        keep_seed, global_seed = draw_seeds(2, device, generator)
    rows_seed = seed_or_draw(global_seed, "global_seed", device, generator) if global_rows else None
    if keep is not None:
        return keep, None, rows_seed
    seed = seed_or_draw(keep_seed, "keep_seed", device, generator)
    return (None, seed, rows_seed) if fused else (materialise(seed), None, rows_seed)


def keep_multiplier(keep: Tensor, dropout_p: float, dtype: torch.dtype) -> Tensor:
    """Inverted-dropout factor per entry: `keep / (1 - p)`, all zeros when `p == 1` (like `F.dropout`)."""
    scale = 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)
    return keep.to(dtype) * scale

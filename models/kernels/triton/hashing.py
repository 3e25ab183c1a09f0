"""The counter hash of `attnzoo.kernels.hashing` as Triton device code: the same bits from the same int64
arithmetic (products wrap, logical shifts as masked arithmetic ones), so that a kernel regenerates a random number
(a fastRG draw, an attention-dropout decision) that the torch code computes alike, and no mask is stored."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# Must equal `attnzoo.kernels.hashing` (`_MIX1`, `_MIX2`, `_GOLDEN`); a test compares them.
MIX1 = -0x40A7B892E31B1A47
MIX2 = -0x6B2FB644ECCEEE15
GOLDEN = -0x61C8864680B583EB
_MIX1, _MIX2, _GOLDEN = tl.constexpr(MIX1), tl.constexpr(MIX2), tl.constexpr(GOLDEN)
_LOW24 = tl.constexpr((1 << 24) - 1)
_LOW32 = tl.constexpr((1 << 32) - 1)
_LOW33 = tl.constexpr((1 << 33) - 1)
_LOW35 = tl.constexpr((1 << 35) - 1)


@triton.jit
def mix(x):
    """The splitmix-style finaliser of `attnzoo.kernels.hashing.mix_bits_` on int64."""
    x ^= (x >> 31) & _LOW33
    x *= _MIX1
    x ^= (x >> 29) & _LOW35
    x *= _MIX2
    x ^= (x >> 32) & _LOW32
    return x


@triton.jit
def keep_at(seed, head, row, col, threshold):
    """Attention-dropout decisions of `attnzoo.kernels.hashing.hashed_keep` at flat head `head`, query `row` and key
    `col` (broadcast together; any integer dtypes): an entry is kept when its 24-bit counter uniform is at least
    `threshold` (`keep_threshold(p)`)."""
    x = seed + (head.to(tl.int64) + 1) * _GOLDEN + row.to(tl.int64) * _MIX1 + col.to(tl.int64) * _MIX2
    return ((mix(x) >> 40) & _LOW24) >= threshold


@triton.jit
def keep_factor(KEEP, offset, head, row, col, ok, keep_scale, keep_threshold, KEEP_HASH: tl.constexpr):
    """Inverted-dropout factors of entries (`keep_scale` where kept, 0 where dropped or not `ok`): read from a stored
    uint8 mask at `KEEP + offset`, or with `KEEP_HASH` regenerated as [`keep_at`] of the seed `KEEP` (a `()` int64
    tensor) at `(head, row, col)` (tensors, broadcast together)."""
    if KEEP_HASH:
        kept = keep_at(tl.load(KEEP), head, row, col, keep_threshold)
    else:
        kept = tl.load(KEEP + offset, mask=ok, other=0) != 0
    return tl.where(ok & kept, keep_scale, 0.0)


def keep_argument(keep: Tensor | None, keep_seed: Tensor | None) -> Tensor | None:
    """What a kernel's `KEEP` pointer reads: a stored keep mask as uint8, or the `()` int64 seed of a hashed one
    (then the kernel's `KEEP_HASH`, [`is_seed`]), or nothing."""
    if keep_seed is None:
        return None if keep is None else keep.contiguous().view(torch.uint8)
    if keep is not None:
        raise ValueError("a dropout mask comes as keep or as keep_seed, not both")
    return keep_seed


def is_seed(keep: Tensor | None) -> bool:
    """Whether a [`keep_argument`] is the seed of a hashed mask (`KEEP_HASH`) rather than a stored one."""
    return keep is not None and keep.dtype == torch.int64

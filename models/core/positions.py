"""The encoder's alternatives to BERT's learned position table: fixed sinusoidal vectors and rotary positions.

`ZooConfig.position_embedding_type="sinusoidal"` adds fixed sine/cosine vectors (Vaswani et al., 2017) instead of the
learned table. A fixed table has no parameter per position: a position that few training inputs reach (rows past
1,024 of a 4,096-byte model trained on reviews of median 962 bytes) is as well defined as position 0, and `PE(p + k)`
is a fixed rotation of `PE(p)` for every `p`, so an offset between two tokens means the same thing everywhere.

`"rotary"` adds nothing to the embeddings: every encoder self-attention rotates its queries and keys by their
positions (RoPE, Su et al., 2021), so a query-key logit depends on the two tokens and their offset only, in every
layer. With an added table (learned or fixed) the projections must first learn to read offsets out of the sum; on a
masked-LM task that needs a token's neighbour, dense attention with an added table had not learned it after 600
steps, and with rotary positions it had (`scripts/experiments/neighbour-probe/results/`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .configuration import ZooConfig

POSITION_EMBEDDING_TYPES = ("absolute", "sinusoidal", "rotary")

#: wavelength base of the rotary frequencies (RoFormer's and Llama's 10,000)
ROTARY_BASE = 10000.0


def sinusoidal_table(num_positions: int, dim: int, scale: float, base: float = 10000.0) -> torch.Tensor:
    """`(num_positions, dim)` fp32 table: `scale * sin(p / base^(2i/dim))` in column `2i`, the cosine in `2i + 1`.

    Args:
        num_positions: rows (positions `0 .. num_positions - 1`).
        dim: columns; must be even, so that every frequency has its sine and cosine.
        scale: multiplier of every entry. The encoder passes `initializer_range * sqrt(2)`, which gives the table the
            root-mean-square of a freshly initialised embedding row (sin and cos have RMS `1/sqrt(2)` together), so
            that token and position weigh the same before the embedding LayerNorm, as learned positions do at
            initialisation; unscaled entries (RMS 0.7 against 0.02) would drown the token embeddings.
        base: wavelength base of the slowest pair.
    """
    if dim % 2:
        raise ValueError(f"Sinusoidal positions need an even width (a sine and a cosine per frequency), got {dim}.")
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    frequencies = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(base) / dim))  # (dim/2,)
    angles = positions * frequencies  # (P, dim/2)
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)  # (P, dim): sin, cos interleaved
    return (scale * table).float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position vectors, called like the `nn.Embedding` they replace: ids `(...)` -> `(..., dim)`.

    The table is a non-persistent buffer, so a checkpoint holds nothing for it; `from_pretrained` builds models on
    the meta device, so the models' `_init_weights` fills it again from [`build`].
    """

    def __init__(self, num_positions: int, dim: int, scale: float):
        super().__init__()
        self.num_positions, self.dim, self.scale = num_positions, dim, scale
        self.register_buffer("table", self.build(), persistent=False)

    def build(self) -> torch.Tensor:
        """The `(num_positions, dim)` fp32 table this module holds."""
        return sinusoidal_table(self.num_positions, self.dim, self.scale)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]

    def extra_repr(self) -> str:
        return f"{self.num_positions}, {self.dim}, scale={self.scale:.4g}"


def build_position_embeddings(config: ZooConfig, dim: int) -> nn.Module | None:
    """The position module of width `dim` that `config.position_embedding_type` asks for.

    `"absolute"`: a learned `nn.Embedding` (BERT's table). `"sinusoidal"`: [`SinusoidalPositions`] scaled by
    `initializer_range * sqrt(2)`, the root-mean-square of a freshly initialised embedding row. `"rotary"`: `None`
    (nothing is added to the embeddings; the attention rotates its queries and keys, [`apply_rotary`]).
    """
    if config.position_embedding_type == "rotary":
        return None
    if config.position_embedding_type == "sinusoidal":
        return SinusoidalPositions(config.max_position_embeddings, dim, config.initializer_range * 2**0.5)
    return nn.Embedding(config.max_position_embeddings, dim)


def rotary_angles(
    length: int, dim: int, device: torch.device, base: float = ROTARY_BASE, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """`(length, dim // 2)` angles `p * base^(-2i / dim)` of positions `p = 0 .. length - 1`, in `dtype`."""
    frequencies = base ** (-torch.arange(0, dim, 2, dtype=dtype, device=device) / dim)  # (dim/2,)
    return torch.arange(length, dtype=dtype, device=device)[:, None] * frequencies  # (N, dim/2)


def apply_rotary(x: torch.Tensor, *, inverse: bool = False, base: float = ROTARY_BASE) -> torch.Tensor:
    """Rotate each head vector of `x` `(B, H, N, d)` by its position `0 .. N - 1` (RoPE, half-split layout).

    Coordinates `i` and `i + d/2` form a pair, turned by the angle `p * base^(-2i/d)` (the GPT-NeoX / Llama layout).
    The product of a rotated query at `p` and a rotated key at `p'` then depends on `p' - p` only. Computed in (at
    least) fp32 and returned in `x`'s dtype: a bf16 angle near position 4,096 would be off by up to 16 radians.
    `inverse=True` turns the other way, undoing the rotation.
    """
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"Rotary positions need an even head size, got {d}.")
    dtype = torch.promote_types(x.dtype, torch.float32)
    angles = rotary_angles(x.shape[-2], d, x.device, base, dtype)  # (N, d/2)
    cos, sin = angles.cos(), angles.sin()
    if inverse:
        sin = -sin
    first, second = x.to(dtype).chunk(2, dim=-1)  # (B, H, N, d/2) each
    rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.to(x.dtype)

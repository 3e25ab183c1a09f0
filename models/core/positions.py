"""Fixed sinusoidal position vectors (Vaswani et al., 2017), the encoder's alternative to learned positions.

`ZooConfig.position_embedding_type="sinusoidal"` adds these instead of BERT's learned table. A fixed table has no
parameter per position: a position that few training inputs reach (rows past 1,024 of a 4,096-byte model trained on
reviews of median 962 bytes) is as well defined as position 0, and `PE(p + k)` is a fixed rotation of `PE(p)` for
every `p`, so an offset between two tokens means the same thing everywhere in the sequence.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .configuration import ZooConfig

POSITION_EMBEDDING_TYPES = ("absolute", "sinusoidal")


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


def build_position_embeddings(config: ZooConfig, dim: int) -> nn.Module:
    """The position module of width `dim` that `config.position_embedding_type` asks for.

    `"absolute"`: a learned `nn.Embedding` (BERT's table). `"sinusoidal"`: [`SinusoidalPositions`] scaled by
    `initializer_range * sqrt(2)`, the root-mean-square of a freshly initialised embedding row.
    """
    if config.position_embedding_type == "sinusoidal":
        return SinusoidalPositions(config.max_position_embeddings, dim, config.initializer_range * 2**0.5)
    return nn.Embedding(config.max_position_embeddings, dim)

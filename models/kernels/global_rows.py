"""The global queries' dense rows as part of a sparse primitive (`global_rows=`).

A family with global tokens replaces the output rows of its first `g` queries that are real tokens by dense softmax
attention over every real key (`ZooAttention.with_global_rows`, [`attnzoo.core.global_tokens`]). A primitive that
takes `global_rows` does this itself, so that its Triton kernels can compute the rows in programs of their own
(`kernels/triton/global_rows.py`) with no op around them; the torch implementations replace the rows after the
method's output with the functions here.

In training with attention dropout the rows' mask is the counter hash of a seed per call and of the row's position
(`kernels.dropout.call_dropout`, `dense.global_rows_keep`): the kernels regenerate it in forward and backward instead
of storing it, and the torch rows draw the same one from the same seed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .dense import global_query_rows, splice_rows


def check_global_rows(q: Tensor, k: Tensor, global_rows: int, key_valid: Tensor | None) -> None:
    """Raise `ValueError` unless a primitive's `global_rows` and `key_valid` fit q and k (no sync)."""
    if global_rows < 0:
        raise ValueError(f"global_rows must be >= 0, got {global_rows}")
    if global_rows == 0:
        return
    # The global queries are the first tokens of an encoder self-attention: query i is key i.
    if q.dim() != 4 or q.shape[2] != k.shape[2] or global_rows > q.shape[2]:
        raise ValueError(
            f"global_rows needs head-split self-attention q, k (B, H, N, d) with N >= global_rows = {global_rows}, "
            f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    expected = (k.shape[0], k.shape[2])
    if key_valid is not None and (key_valid.dtype != torch.bool or tuple(key_valid.shape) != expected):
        raise ValueError(f"key_valid must be bool of shape {expected}, got {key_valid.dtype} {tuple(key_valid.shape)}")


def row_settings(scale: float | None, dropout_p: float, seed: Tensor | None) -> dict:
    """The keywords of [`replace_global_rows`] for rows whose dropout is `seed`'s (`kernels.dropout.call_dropout`:
    `None` without dropout)."""
    dropout = seed is not None and dropout_p > 0.0
    return {"scale": scale, "dropout_p": dropout_p if dropout else 0.0, "training": dropout, "seed": seed}


def replace_global_rows(
    out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_valid: Tensor | None,
    num_global: int,
    *,
    scale: float | None,
    dropout_p: float,
    training: bool,
    seed: Tensor | None = None,
) -> Tensor:
    """`out` `(B, H, N, d)` with the rows of the real global queries (the first `g`) replaced by dense masked
    attention over every real key: `ZooAttention.with_global_rows` (`core.global_tokens`) as part of the primitive,
    so that a fused implementation can compute those rows in its own kernels. `seed`: their dropout mask's
    (`kernels.dropout.call_dropout`)."""
    rows, _ = global_query_rows(
        q, k, v, key_valid, num_global, scale=scale, dropout_p=dropout_p, training=training, return_weights=False,
        seed=seed,
    )  # fmt: skip
    return splice_rows(out, rows, key_valid)

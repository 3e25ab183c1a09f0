"""Position tables of another length: rows beyond the source's learned ones repeat its table (Longformer's copy
initialisation, Beltagy et al. 2020, §5)."""

from __future__ import annotations

import torch


def repeat_rows(table: torch.Tensor, num_rows: int) -> torch.Tensor:
    """
    A table of `num_rows` rows whose row `p` is `table[p % len(table)]`.

    Rows below the source length are the source's own, so a model keeps its function on inputs the source could
    read; each further block of rows restarts the learned table, which keeps the local position differences the
    attention learned (row `p + 1` minus row `p` is the learned step everywhere except at block boundaries).

    Args:
        table (`torch.Tensor` of shape `(length, hidden)`): the learned position embeddings.
        num_rows (`int`): rows wanted; fewer than `length` keeps the first `num_rows`.
    """
    if num_rows < 1:
        raise ValueError(f"`num_rows` must be a positive integer, got {num_rows}.")
    index = torch.arange(num_rows, device=table.device) % table.shape[0]
    return table[index].clone()

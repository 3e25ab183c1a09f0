"""Global tokens for every sparse attention (BigBird's ITC, Longformer's global attention).

The first `num_global_tokens` positions (the classification token at least) are *global*: they attend to every real
position, and every position attends to them, in the same softmax as the method's own keys (FSAT, by default, in a
softmax of their own: `global_key_softmax`). This costs O(N·g) and is what lets the pooled token of a sparse model read
a whole long document in one layer, whatever the method's pattern.

The two halves are implemented once, here, and used by every family:

- **global rows**: the method computes its output for all queries as usual; the rows of the global queries are then
  replaced by dense masked attention over all keys ([`global_query_rows`], [`splice_rows`]; exact, O(g·N); done by
  `ZooAttention.with_global_rows` for every family). Those two live in the kernel layer (`attnzoo.kernels.dense`),
  which also calls them where a fused primitive computes the global rows itself (A²-Former's torch fallback).
- **global columns**: the method adds the global positions to every query's key set, in the form its structure
  takes: extra slots of a gathered index ([`append_global_slots`]), extra columns of a dense mask
  ([`add_global_columns`]) or extra edges of an edge list ([`global_edges`]). A global key that the method selected on
  its own is not added a second time where the method's keys form a set (Smart Bird, Sparse Transformer, SBM).

A global position that is padding (left padding, a mask with holes) is neither a global key nor a global query.
"""

from __future__ import annotations

import torch

from ..kernels.dense import global_query_rows, splice_rows

__all__ = [
    "add_global_columns",
    "append_global_slots",
    "global_count",
    "global_edges",
    "global_key_validity",
    "global_query_rows",
    "splice_rows",
]


def global_count(num_global_tokens: int, num_keys: int) -> int:
    """Number of global positions that exist in a sequence of `num_keys` tokens."""
    return min(num_global_tokens, num_keys)


def global_key_validity(key_valid: torch.Tensor | None, g: int, batch: int, device: torch.device) -> torch.Tensor:
    """`(B, g)` bool: which global positions are real keys."""
    if key_valid is None:
        return torch.ones(batch, g, dtype=torch.bool, device=device)
    return key_valid[:, :g]


def append_global_slots(
    idx: torch.Tensor, valid: torch.Tensor | None, key_valid: torch.Tensor | None, g: int, *, as_set: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add the `g` global keys to a gathered structure `(B, H, Nq, K)` -> `(B, H, Nq, K + g)`.

    Args:
        idx (`torch.LongTensor` of shape `(B, H, Nq, K)`): key positions per query.
        valid (`torch.BoolTensor` of shape `(B, H, Nq, K)`, *optional*): slot validity (`None`: all valid).
        key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): real keys.
        as_set (`bool`): the method's slots are distinct keys; a slot that already holds a global key is turned off
            so that the key is counted once.
    """
    B, H, Nq, _ = idx.shape
    valid = torch.ones_like(idx, dtype=torch.bool) if valid is None else valid
    if as_set:
        valid = valid & (idx >= g)
    positions = torch.arange(g, device=idx.device).expand(B, H, Nq, g)  # (B, H, Nq, g)
    real = global_key_validity(key_valid, g, B, idx.device)[:, None, None, :].expand(B, H, Nq, g)
    return torch.cat([idx, positions], dim=-1), torch.cat([valid, real], dim=-1)


def add_global_columns(mask: torch.Tensor, key_valid: torch.Tensor | None, g: int) -> torch.Tensor:
    """A dense boolean pattern `(B or 1, H or 1, Nq, Nk)` with the real global keys allowed for every query."""
    B = mask.shape[0] if key_valid is None else key_valid.shape[0]
    real = global_key_validity(key_valid, g, B, mask.device)[:, None, None, :]  # (B, 1, 1, g)
    head = mask[..., :g] | real
    return torch.cat([head, mask[..., g:].expand(*head.shape[:-1], -1)], dim=-1)


def global_edges(
    batch: int,
    heads: int,
    num_queries: int,
    num_keys: int,
    query_valid: torch.Tensor | None,
    key_valid: torch.Tensor | None,
    g: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat `(rows, cols)` edges from every real query to every real global key, rows `(b*H + h)*Nq + i` and
    cols `(b*H + h)*Nk + j` (the edge kernels' layout), sorted by row.

    Returns:
        `rows`, `cols` (`torch.LongTensor` of shape `(E,)`).
    """
    real_key = global_key_validity(key_valid, g, batch, device)  # (B, g)
    real_query = (
        torch.ones(batch, num_queries, dtype=torch.bool, device=device) if query_valid is None else query_valid
    )
    keep = (real_query[:, None, :, None] & real_key[:, None, None, :]).expand(batch, heads, num_queries, g)
    bh = torch.arange(batch * heads, device=device).view(batch, heads, 1, 1)
    rows = (bh * num_queries + torch.arange(num_queries, device=device).view(1, 1, -1, 1)).expand_as(keep)
    cols = (bh * num_keys + torch.arange(g, device=device).view(1, 1, 1, -1)).expand_as(keep)
    return rows[keep], cols[keep]

"""Shared attention kernels of the zoo: dense masked reference, edge-list (CSR) attention and gathered attention."""

from __future__ import annotations

from .csr import CSRPattern
from .dense import dense_masked_attention
from .edgelist import edge_attention, edge_attention_reference
from .gathered import gathered_attention, gathered_attention_reference
from .indexing import batch_head_offsets, flatten_heads, unflatten_heads

__all__ = [
    "CSRPattern",
    "batch_head_offsets",
    "dense_masked_attention",
    "edge_attention",
    "edge_attention_reference",
    "flatten_heads",
    "gathered_attention",
    "gathered_attention_reference",
    "unflatten_heads",
]

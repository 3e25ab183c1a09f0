"""Shared attention kernels of the zoo: dense masked attention, edge-list (CSR) attention, gathered attention and
gated attention (differentiable in a 0/1 gate on every pair).

Families call the primitives exported here with their `config.attention_backend`; [`attnzoo.kernels.dispatch`]
picks the reference, torch (CPU / CUDA) or Triton implementation.
"""

from __future__ import annotations

from .csr import CSRPattern
from .dense import dense_masked_attention
from .dispatch import (
    ATTENTION_BACKENDS,
    dense_attention,
    edge_attention,
    edge_attention_reference,
    gathered_attention,
    gathered_attention_reference,
    interpolated_attention,
    key_slot_attention,
    resolve_backend,
)
from .gated import gated_attention, gated_attention_reference
from .indexing import batch_head_offsets, flatten_heads, unflatten_heads

__all__ = [
    "ATTENTION_BACKENDS",
    "CSRPattern",
    "batch_head_offsets",
    "dense_attention",
    "dense_masked_attention",
    "edge_attention",
    "edge_attention_reference",
    "flatten_heads",
    "gated_attention",
    "gated_attention_reference",
    "gathered_attention",
    "gathered_attention_reference",
    "interpolated_attention",
    "key_slot_attention",
    "resolve_backend",
    "unflatten_heads",
]

"""Triton kernels of the shared attention primitives and of the methods' own fused steps (optional: needs `triton`,
`pip install attnzoo[gpu]`).

Imported only by [`attnzoo.kernels.dispatch`] when a Triton implementation is asked for. With `TRITON_INTERPRET=1`
in the environment at import time, `triton.jit` builds interpreter functions that run on CPU tensors with numpy
(slow; the CPU tests use it); otherwise the kernels compile for the GPU.
"""

from __future__ import annotations

from . import fsat_pooling, memberships
from .edgelist import _edge_fwd, edge_attention_triton
from .fastrg import fastrg_edge_list_triton, fastrg_pair_ids_triton
from .fsat_index import fsat_index_slots_triton
from .gathered import gathered_attention_triton
from .interpolated import interpolated_attention_triton
from .key_slots import key_slot_attention_triton
from .sampling import attentive_sample_triton
from .spmm import csr_sddmm_triton, csr_spmm_pair_triton


def interpreted() -> bool:
    """Whether these kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 when first imported)."""
    return type(_edge_fwd).__name__ == "InterpretedFunction"


__all__ = [
    "attentive_sample_triton",
    "csr_sddmm_triton",
    "csr_spmm_pair_triton",
    "edge_attention_triton",
    "fastrg_edge_list_triton",
    "fastrg_pair_ids_triton",
    "fsat_index_slots_triton",
    "fsat_pooling",
    "gathered_attention_triton",
    "interpolated_attention_triton",
    "interpreted",
    "key_slot_attention_triton",
    "memberships",
]

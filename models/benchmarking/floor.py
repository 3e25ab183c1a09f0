"""The floor row of the benchmark: the dense family with an attention whose output is its values.

Every attention method pays the embeddings, the Q/K/V/O projections, the FFN, the LayerNorms and the residual adds;
[`NullAttention`] keeps all of them and replaces the attention itself by `out = v` (no scores, no softmax, no
selection). No attention can run faster or keep less for backward than this row at the same size, so the row puts
the part of every ratio that no attention design can remove into each table (the research note
`gpu-performance.md` §2.1 estimates it at about 0.18x dense's forward+backward time at 16K tokens on an H100).

It is a slight under-estimate: the queries and keys are projected but unused, so their projections' backward is not
paid (2 of the layer's 12 `N x D x D`-sized matrix products of a training step).
"""

from __future__ import annotations

import torch

from ..core.attention import AttentionOutput, ZooAttention
from ..dense_transformer import DenseTransformerConfig, DenseTransformerModel
from .settings import ModelSize

#: Benchmark row name of the floor.
FLOOR_MODEL = "null_attention"


class NullAttention(ZooAttention):
    """Attention whose output is the values: query `i` of head `h` returns `v[h, i]` (the identity pattern)."""

    def attend(self, q, k, v, key_valid, *, query_offset=0, output_attentions=False):
        weights = None
        if output_attentions:  # the identity pattern, in the dense layout every attention returns
            eye = torch.eye(q.shape[2], k.shape[2], dtype=q.dtype, device=q.device)
            weights = eye.expand(q.shape[0], q.shape[1], -1, -1)  # (B, H, N, N)
        return AttentionOutput(hidden_states=v, attn_weights=weights)


class NullAttentionModel(DenseTransformerModel):
    """The dense family's bare encoder with [`NullAttention`] in every layer (same parameters, same config)."""

    attention_class = NullAttention


def null_attention_model(size: ModelSize, length: int) -> NullAttentionModel:
    """The floor model at the benchmark's `size` for sequences of `length` tokens, in eval mode."""
    return NullAttentionModel(DenseTransformerConfig(**size.config_kwargs(length))).eval()

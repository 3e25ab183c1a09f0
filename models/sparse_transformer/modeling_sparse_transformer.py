"""Sparse Transformer family: thin bindings of the core classes to `SparseTransformerConfig` and its attention."""

from __future__ import annotations

from ..core.modeling import (
    ZooForConditionalGeneration,
    ZooForMaskedLM,
    ZooForSequenceClassification,
    ZooModel,
    ZooPreTrainedModel,
)
from .attention_sparse_transformer import SparseTransformerAttention
from .configuration_sparse_transformer import SparseTransformerConfig


class SparseTransformerPreTrainedModel(ZooPreTrainedModel):
    """Binds the Sparse Transformer config and attention: the factorised pattern in the encoder and (causal, with
    KV cache) in the decoder's self-attention; cross-attention stays dense (the pattern is not defined there)."""

    config_class = SparseTransformerConfig
    attention_class = SparseTransformerAttention
    decoder_self_attention_class = SparseTransformerAttention


class SparseTransformerModel(SparseTransformerPreTrainedModel, ZooModel):
    """Sparse Transformer encoder (BERT layout, factorised self-attention) returning hidden states."""


class SparseTransformerForMaskedLM(SparseTransformerPreTrainedModel, ZooForMaskedLM):
    """Sparse Transformer encoder with a masked-LM head."""

    base_model_class = SparseTransformerModel


class SparseTransformerForSequenceClassification(SparseTransformerPreTrainedModel, ZooForSequenceClassification):
    """Sparse Transformer encoder with a pooled classification head."""

    base_model_class = SparseTransformerModel


class SparseTransformerForConditionalGeneration(SparseTransformerPreTrainedModel, ZooForConditionalGeneration):
    """Sparse Transformer encoder-decoder for summarization with `generate()`: factorised attention in the encoder
    (bidirectional unless `sparse_causal`) and in the decoder's causal self-attention (KV cache), dense
    cross-attention."""

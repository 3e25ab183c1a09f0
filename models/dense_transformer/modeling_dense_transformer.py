"""Dense baseline family: thin bindings of the core classes to `DenseTransformerConfig` and SDPA attention."""

from __future__ import annotations

from ..core.attention import DenseAttention
from ..core.modeling import (
    ZooForConditionalGeneration,
    ZooForMaskedLM,
    ZooForSequenceClassification,
    ZooModel,
    ZooPreTrainedModel,
)
from .configuration_dense_transformer import DenseTransformerConfig


class DenseTransformerPreTrainedModel(ZooPreTrainedModel):
    """Binds the dense family's config and attention."""

    config_class = DenseTransformerConfig
    attention_class = DenseAttention


class DenseTransformerModel(DenseTransformerPreTrainedModel, ZooModel):
    """Dense Transformer encoder (BERT layout) returning hidden states."""


class DenseTransformerForMaskedLM(DenseTransformerPreTrainedModel, ZooForMaskedLM):
    """Dense Transformer with a masked-LM head."""

    base_model_class = DenseTransformerModel


class DenseTransformerForSequenceClassification(DenseTransformerPreTrainedModel, ZooForSequenceClassification):
    """Dense Transformer with a pooled classification head."""

    base_model_class = DenseTransformerModel


class DenseTransformerForConditionalGeneration(DenseTransformerPreTrainedModel, ZooForConditionalGeneration):
    """Dense Transformer encoder-decoder for summarization with `generate()`."""

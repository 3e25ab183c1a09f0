"""Sparse Transformer family (`model_type="sparse_transformer"`), registered with the Auto classes on import."""

from ..registry import Family, register_family
from .attention_sparse_transformer import SparseTransformerAttention
from .configuration_sparse_transformer import SparseTransformerConfig
from .modeling_sparse_transformer import (
    SparseTransformerForConditionalGeneration,
    SparseTransformerForMaskedLM,
    SparseTransformerForSequenceClassification,
    SparseTransformerModel,
    SparseTransformerPreTrainedModel,
)

register_family(
    Family(
        config_class=SparseTransformerConfig,
        model_class=SparseTransformerModel,
        masked_lm_class=SparseTransformerForMaskedLM,
        sequence_classification_class=SparseTransformerForSequenceClassification,
        conditional_generation_class=SparseTransformerForConditionalGeneration,
        attention_class=SparseTransformerAttention,
    )
)

__all__ = [
    "SparseTransformerAttention",
    "SparseTransformerConfig",
    "SparseTransformerForConditionalGeneration",
    "SparseTransformerForMaskedLM",
    "SparseTransformerForSequenceClassification",
    "SparseTransformerModel",
    "SparseTransformerPreTrainedModel",
]

"""Dense baseline family (`model_type="dense_transformer"`), registered with the Auto classes on import."""

from ..core.attention import DenseAttention
from ..registry import Family, register_family
from .configuration_dense_transformer import DenseTransformerConfig
from .modeling_dense_transformer import (
    DenseTransformerForConditionalGeneration,
    DenseTransformerForMaskedLM,
    DenseTransformerForSequenceClassification,
    DenseTransformerModel,
    DenseTransformerPreTrainedModel,
)

register_family(
    Family(
        config_class=DenseTransformerConfig,
        model_class=DenseTransformerModel,
        masked_lm_class=DenseTransformerForMaskedLM,
        sequence_classification_class=DenseTransformerForSequenceClassification,
        conditional_generation_class=DenseTransformerForConditionalGeneration,
        attention_class=DenseAttention,
    )
)

__all__ = [
    "DenseTransformerConfig",
    "DenseTransformerForConditionalGeneration",
    "DenseTransformerForMaskedLM",
    "DenseTransformerForSequenceClassification",
    "DenseTransformerModel",
    "DenseTransformerPreTrainedModel",
]

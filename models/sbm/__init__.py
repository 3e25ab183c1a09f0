"""SBM-Transformer family (`model_type="sbm"`), registered with the Auto classes on import."""

from ..registry import Family, register_family
from .attention_sbm import SBMAttention
from .configuration_sbm import SBMConfig
from .modeling_sbm import (
    SBMForConditionalGeneration,
    SBMForMaskedLM,
    SBMForSequenceClassification,
    SBMModel,
    SBMPreTrainedModel,
)

register_family(
    Family(
        config_class=SBMConfig,
        model_class=SBMModel,
        masked_lm_class=SBMForMaskedLM,
        sequence_classification_class=SBMForSequenceClassification,
        conditional_generation_class=SBMForConditionalGeneration,
        attention_class=SBMAttention,
    )
)

__all__ = [
    "SBMAttention",
    "SBMConfig",
    "SBMForConditionalGeneration",
    "SBMForMaskedLM",
    "SBMForSequenceClassification",
    "SBMModel",
    "SBMPreTrainedModel",
]

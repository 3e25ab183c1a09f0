"""FSAT family (`model_type="fsat"`): Fourier sparse attention, registered with the Auto classes on import."""

from ..registry import Family, register_family
from .attention_fsat import FSATAttention
from .configuration_fsat import FSATConfig
from .modeling_fsat import (
    FSATForConditionalGeneration,
    FSATForMaskedLM,
    FSATForSequenceClassification,
    FSATModel,
    FSATPreTrainedModel,
)

register_family(
    Family(
        config_class=FSATConfig,
        model_class=FSATModel,
        masked_lm_class=FSATForMaskedLM,
        sequence_classification_class=FSATForSequenceClassification,
        conditional_generation_class=FSATForConditionalGeneration,
        attention_class=FSATAttention,
    )
)

__all__ = [
    "FSATAttention",
    "FSATConfig",
    "FSATForConditionalGeneration",
    "FSATForMaskedLM",
    "FSATForSequenceClassification",
    "FSATModel",
    "FSATPreTrainedModel",
]

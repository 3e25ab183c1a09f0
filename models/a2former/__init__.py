"""A²-Former family (`model_type="a2former"`), registered with the Auto classes on import.

Also provides [`interpolated_attention_reference`], the dense reference of attention over K points at fractional key
positions (the fast paths are [`attnzoo.kernels.interpolated_attention`]: one fused Triton kernel per pass on
CUDA, gathered attention with two weighted entries per slot on CPU).
"""

from ..registry import Family, register_family
from .attention_a2former import A2FormerAttention
from .configuration_a2former import A2FormerConfig
from .interpolated import interpolated_attention_reference
from .modeling_a2former import (
    A2FormerForConditionalGeneration,
    A2FormerForMaskedLM,
    A2FormerForSequenceClassification,
    A2FormerModel,
    A2FormerPreTrainedModel,
)

register_family(
    Family(
        config_class=A2FormerConfig,
        model_class=A2FormerModel,
        masked_lm_class=A2FormerForMaskedLM,
        sequence_classification_class=A2FormerForSequenceClassification,
        conditional_generation_class=A2FormerForConditionalGeneration,
        attention_class=A2FormerAttention,
    )
)

__all__ = [
    "A2FormerAttention",
    "A2FormerConfig",
    "A2FormerForConditionalGeneration",
    "A2FormerForMaskedLM",
    "A2FormerForSequenceClassification",
    "A2FormerModel",
    "A2FormerPreTrainedModel",
    "interpolated_attention_reference",
]

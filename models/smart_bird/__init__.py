"""Smart Bird family (`model_type="smart_bird"`), registered with the Auto classes on import."""

from ..registry import Family, register_family
from .attention_smart_bird import SmartBirdAttention
from .configuration_smart_bird import SmartBirdConfig
from .modeling_smart_bird import (
    SmartBirdForConditionalGeneration,
    SmartBirdForMaskedLM,
    SmartBirdForSequenceClassification,
    SmartBirdModel,
    SmartBirdPreTrainedModel,
)
from .sampling import sample_keys, sample_keys_reference
from .sketch import SmartBirdEncoder, init_sketch_from_main_embeddings

register_family(
    Family(
        config_class=SmartBirdConfig,
        model_class=SmartBirdModel,
        masked_lm_class=SmartBirdForMaskedLM,
        sequence_classification_class=SmartBirdForSequenceClassification,
        conditional_generation_class=SmartBirdForConditionalGeneration,
        attention_class=SmartBirdAttention,
    )
)

__all__ = [
    "SmartBirdAttention",
    "SmartBirdConfig",
    "SmartBirdEncoder",
    "SmartBirdForConditionalGeneration",
    "SmartBirdForMaskedLM",
    "SmartBirdForSequenceClassification",
    "SmartBirdModel",
    "SmartBirdPreTrainedModel",
    "init_sketch_from_main_embeddings",
    "sample_keys",
    "sample_keys_reference",
]

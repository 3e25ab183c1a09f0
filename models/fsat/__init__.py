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
        name="fsat",
        config_class=FSATConfig,
        model_class=FSATModel,
        masked_lm_class=FSATForMaskedLM,
        sequence_classification_class=FSATForSequenceClassification,
        conditional_generation_class=FSATForConditionalGeneration,
        attention_class=FSATAttention,
    )
)

#: Extra benchmark rows (the harness gives every family the same size, FFN 1024 at width 256): the paper's FFN of
#: 2x the width, the dense "FAT" ablation (attention over the pooled cross without sparsity), and the paper's index
#: predictor (untrained, its edges all land near the middle of the sequence instead of around each key), and the
#: global keys in one softmax with the predicted edges (the default gives them their own: one more softmax group).
BENCHMARK_VARIANTS: dict[str, dict] = {
    "ffn_2x": {"intermediate_size": 512},
    "fat_dense": {"use_sparse": False},
    "paper_predictor": {"index_prior": "none"},
    "shared_global_softmax": {"global_key_softmax": "shared"},
}

__all__ = [
    "FSATAttention",
    "FSATConfig",
    "FSATForConditionalGeneration",
    "FSATForMaskedLM",
    "FSATForSequenceClassification",
    "FSATModel",
    "FSATPreTrainedModel",
]

"""One Transformer for the whole zoo: config base, attention contract, layers, stacks, heads and models."""

from .attention import AttentionOutput, DenseAttention, ZooAttention
from .configuration import SparseZooConfig, ZooConfig
from .modeling import (
    ZooForConditionalGeneration,
    ZooForMaskedLM,
    ZooForSequenceClassification,
    ZooModel,
    ZooPreTrainedModel,
    shift_tokens_right,
)
from .outputs import ZooMaskedLMOutput, ZooModelOutput, ZooSeq2SeqLMOutput, ZooSequenceClassifierOutput

__all__ = [
    "AttentionOutput",
    "DenseAttention",
    "ZooAttention",
    "SparseZooConfig",
    "ZooConfig",
    "ZooForConditionalGeneration",
    "ZooForMaskedLM",
    "ZooForSequenceClassification",
    "ZooMaskedLMOutput",
    "ZooModel",
    "ZooModelOutput",
    "ZooPreTrainedModel",
    "ZooSeq2SeqLMOutput",
    "ZooSequenceClassifierOutput",
    "shift_tokens_right",
]

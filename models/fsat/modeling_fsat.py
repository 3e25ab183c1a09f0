"""FSAT family: thin bindings of the core classes to `FSATConfig` and `FSATAttention`.

FSAT runs in encoder self-attention only; the decoder of `FSATForConditionalGeneration` keeps the dense (SDPA)
causal self-attention and cross-attention of the core, as LED does.
"""

from __future__ import annotations

from ..core.attention import DenseAttention
from ..core.modeling import (
    ZooForConditionalGeneration,
    ZooForMaskedLM,
    ZooForSequenceClassification,
    ZooModel,
    ZooPreTrainedModel,
)
from .attention_fsat import FSATAttention
from .configuration_fsat import FSATConfig


class FSATPreTrainedModel(ZooPreTrainedModel):
    """Binds FSAT's config and encoder attention; decoder self- and cross-attention stay dense."""

    config_class = FSATConfig
    attention_class = FSATAttention
    decoder_self_attention_class = DenseAttention
    cross_attention_class = DenseAttention


class FSATModel(FSATPreTrainedModel, ZooModel):
    """FSAT encoder (BERT layout, FSAT self-attention) returning hidden states and per-layer edge densities."""


class FSATForMaskedLM(FSATPreTrainedModel, ZooForMaskedLM):
    """FSAT encoder with a masked-LM head tied to the token embeddings."""

    base_model_class = FSATModel


class FSATForSequenceClassification(FSATPreTrainedModel, ZooForSequenceClassification):
    """FSAT encoder with a pooled classification / regression head."""

    base_model_class = FSATModel


class FSATForConditionalGeneration(FSATPreTrainedModel, ZooForConditionalGeneration):
    """FSAT encoder with a dense causal decoder (self- and cross-attention) for summarization with `generate()`."""

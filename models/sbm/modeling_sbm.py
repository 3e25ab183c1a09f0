"""SBM-Transformer family: thin bindings of the core classes to `SBMConfig` and `SBMAttention`."""

from __future__ import annotations

from ..core.modeling import (
    ZooForConditionalGeneration,
    ZooForMaskedLM,
    ZooForSequenceClassification,
    ZooModel,
    ZooPreTrainedModel,
)
from .attention_sbm import SBMAttention
from .configuration_sbm import SBMConfig


class SBMPreTrainedModel(ZooPreTrainedModel):
    """Binds the SBM config and SBM attention in the encoder, the decoder self-attention and the cross-attention.

    The decoder sites fall back to dense attention when `config.sbm_in_decoder` / `config.sbm_in_cross_attention`
    is `False`.
    """

    config_class = SBMConfig
    attention_class = SBMAttention
    decoder_self_attention_class = SBMAttention
    cross_attention_class = SBMAttention


class SBMModel(SBMPreTrainedModel, ZooModel):
    """SBM-Transformer encoder (BERT layout) returning hidden states, the density regulariser as `aux_loss` and the
    per-example, per-layer, per-head mask density as `attention_density` `(batch, num_layers, num_heads)`."""


class SBMForMaskedLM(SBMPreTrainedModel, ZooForMaskedLM):
    """SBM-Transformer with a masked-LM head; the loss includes `aux_loss_coef * aux_loss` (the regulariser)."""

    base_model_class = SBMModel


class SBMForSequenceClassification(SBMPreTrainedModel, ZooForSequenceClassification):
    """SBM-Transformer with a pooled classification head (the paper's GLUE and LRA setting)."""

    base_model_class = SBMModel


class SBMForConditionalGeneration(SBMPreTrainedModel, ZooForConditionalGeneration):
    """SBM-Transformer encoder-decoder for summarization with `generate()`; SBM attention in the encoder, the causal
    decoder self-attention and the cross-attention."""

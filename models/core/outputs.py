"""Output dataclasses: the HF outputs plus the attention side channel (`aux_loss`, `attention_density`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    MaskedLMOutput,
    Seq2SeqLMOutput,
    SequenceClassifierOutput,
)


@dataclass
class ZooModelOutput(BaseModelOutput):
    """
    Encoder output.

    Args:
        aux_loss (`torch.FloatTensor`, *optional*):
            Sum over layers of the attention auxiliary losses (unweighted); `None` when no layer has one.
        attention_density (`torch.FloatTensor` of shape `(batch, num_layers, num_heads)`, *optional*):
            Fraction of each example's valid (query, key) pairs each head of each layer attended to; `None` for
            dense attention. Average over the batch (`.mean(0)`) for a per-layer, per-head figure.
        source_ids (`torch.LongTensor` of shape `(batch, sequence_length)`, *optional*):
            The input ids, kept by the encoder of a seq2seq model that copies from its source
            (`copy_from_source`): `generate()` runs the encoder once and hands its output to every decoding step.
    """

    aux_loss: torch.FloatTensor | None = None
    attention_density: torch.FloatTensor | None = None
    source_ids: torch.LongTensor | None = None


@dataclass
class ZooDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """Decoder output: `last_hidden_state`, the cache (under the installed transformers release's field name, see
    `attnzoo.core.compat`), optional per-layer tuples and the summed auxiliary loss."""

    aux_loss: torch.FloatTensor | None = None


@dataclass
class ZooMaskedLMOutput(MaskedLMOutput):
    """[`~transformers.modeling_outputs.MaskedLMOutput`] plus `aux_loss` and `attention_density`."""

    aux_loss: torch.FloatTensor | None = None
    attention_density: torch.FloatTensor | None = None


@dataclass
class ZooSequenceClassifierOutput(SequenceClassifierOutput):
    """[`~transformers.modeling_outputs.SequenceClassifierOutput`] plus `aux_loss` and `attention_density`."""

    aux_loss: torch.FloatTensor | None = None
    attention_density: torch.FloatTensor | None = None


@dataclass
class ZooSeq2SeqLMOutput(Seq2SeqLMOutput):
    """[`~transformers.modeling_outputs.Seq2SeqLMOutput`] plus `aux_loss`. The encoder's `attention_density` is on
    the encoder's own output (`model.get_encoder()(...)`), keeping the fields transformers' seq2seq outputs have."""

    aux_loss: torch.FloatTensor | None = None

"""A²-Former family: thin bindings of the core classes to `A2FormerConfig` and `A2FormerAttention`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.modeling import (
    ZooForConditionalGeneration,
    ZooForMaskedLM,
    ZooForSequenceClassification,
    ZooModel,
    ZooPreTrainedModel,
)
from .attention_a2former import A2FormerAttention
from .configuration_a2former import A2FormerConfig


class A2FormerPreTrainedModel(ZooPreTrainedModel):
    """Binds A²-Former's config and its encoder self-attention (decoder self- and cross-attention stay dense)."""

    config_class = A2FormerConfig
    attention_class = A2FormerAttention


class A2FormerModel(A2FormerPreTrainedModel, ZooModel):
    """A²-Former encoder (BERT layout) returning hidden states; each query attends to K interpolated key points."""


class A2FormerForMaskedLM(A2FormerPreTrainedModel, ZooForMaskedLM):
    """A²-Former encoder with a masked-LM head."""

    base_model_class = A2FormerModel


class A2FormerForSequenceClassification(A2FormerPreTrainedModel, ZooForSequenceClassification):
    """A²-Former encoder with a pooled classification head.

    With `config.length_projection = L'` the token embeddings (padding zeroed, padded to
    `max_position_embeddings`) are first mixed along the length axis into `L'` positions by a learned linear map,
    as in the paper's classification setting without pre-training; the encoder then runs on `L'` positions
    (all real) with the positions `0..L'-1` (added embeddings, or the rotation of rotary positions).
    """

    base_model_class = A2FormerModel

    def __init__(self, config: A2FormerConfig):
        super().__init__(config)
        self.length_projection = (
            nn.Linear(config.max_position_embeddings, config.length_projection)
            if config.length_projection is not None
            else None
        )
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ):
        """Arguments as [`~attnzoo.core.ZooForSequenceClassification.forward`] (named, so that Trainer keeps the
        `labels` column)."""
        head_args = {
            "labels": labels,
            "output_attentions": output_attentions,
            "output_hidden_states": output_hidden_states,
            "return_dict": return_dict,
        }
        if self.length_projection is None:
            return super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, **head_args)
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        if attention_mask is not None:
            inputs_embeds = inputs_embeds * attention_mask[..., None].to(inputs_embeds.dtype)
        pad = self.config.max_position_embeddings - inputs_embeds.shape[1]
        if pad < 0:
            raise ValueError(
                f"Sequence length {inputs_embeds.shape[1]} exceeds `max_position_embeddings` "
                f"({self.config.max_position_embeddings})."
            )
        # (B, N, D) -> (B, max_positions, D) -> (B, L', D): a learned mix of positions per output slot.
        padded = F.pad(inputs_embeds, (0, 0, 0, pad))
        projected = self.length_projection(padded.transpose(1, 2)).transpose(1, 2)
        return super().forward(inputs_embeds=projected, **head_args)


class A2FormerForConditionalGeneration(A2FormerPreTrainedModel, ZooForConditionalGeneration):
    """A²-Former encoder with a dense causal decoder (dense cross-attention) for summarization with `generate()`."""

"""Encoder and decoder layers with pluggable attention (post-norm as BERT, or pre-norm)."""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import AttentionOutput, ZooAttention
from .configuration import ZooConfig
from .feedforward import FeedForward

# What a layer returns: hidden states, attention weights, auxiliary loss, `(B, H)` density (the last three optional).
LayerOutput = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


class Residual(nn.Module):
    """Residual branch with dropout and LayerNorm, placed after (post-norm) or before (pre-norm) the sub-layer."""

    def __init__(self, config: ZooConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.pre_norm = config.pre_norm

    def norm_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(hidden_states) if self.pre_norm else hidden_states

    def add(self, residual: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        out = residual + self.dropout(branch)
        return out if self.pre_norm else self.LayerNorm(out)


class EncoderLayer(GradientCheckpointingLayer):
    """Self-attention + FFN. Tensors that need gradients are positional so checkpointing sees them."""

    def __init__(self, config: ZooConfig, attention_class: type[ZooAttention], layer_idx: int):
        super().__init__()
        self.attention = attention_class(config, layer_idx=layer_idx)
        self.attention_residual = Residual(config)
        self.ffn = FeedForward(config)
        self.ffn_residual = Residual(config)

    def forward(
        self, hidden_states: torch.Tensor, key_valid: torch.Tensor | None = None, output_attentions: bool = False
    ) -> LayerOutput:
        attn: AttentionOutput = self.attention(
            self.attention_residual.norm_input(hidden_states), key_valid, output_attentions=output_attentions
        )
        hidden_states = self.attention_residual.add(hidden_states, attn.hidden_states)
        # The FFN has its own dropout, so the residual adds it unchanged.
        ffn_out = self.ffn(self.ffn_residual.norm_input(hidden_states))
        hidden_states = self.ffn_residual.add(hidden_states, ffn_out)
        return hidden_states, attn.attn_weights, attn.aux_loss, attn.density


class DecoderLayer(GradientCheckpointingLayer):
    """Causal self-attention + cross-attention + FFN (BART layout, BERT naming)."""

    def __init__(
        self,
        config: ZooConfig,
        self_attention_class: type[ZooAttention],
        cross_attention_class: type[ZooAttention],
        layer_idx: int,
    ):
        super().__init__()
        self.self_attn = self_attention_class(config, is_causal=True, layer_idx=layer_idx)
        self.self_attn_residual = Residual(config)
        self.cross_attn = cross_attention_class(config, is_cross_attention=True, layer_idx=layer_idx)
        self.cross_attn_residual = Residual(config)
        self.ffn = FeedForward(config)
        self.ffn_residual = Residual(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        self_key_valid: torch.Tensor | None = None,
        encoder_key_valid: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Returns hidden states, self-attention weights, cross-attention weights and the summed auxiliary loss."""
        attn = self.self_attn(
            self.self_attn_residual.norm_input(hidden_states),
            self_key_valid,
            cache=cache,
            output_attentions=output_attentions,
        )
        hidden_states = self.self_attn_residual.add(hidden_states, attn.hidden_states)
        cross = self.cross_attn(
            self.cross_attn_residual.norm_input(hidden_states),
            encoder_key_valid,
            key_value_states=encoder_hidden_states,
            cache=cache,
            output_attentions=output_attentions,
        )
        hidden_states = self.cross_attn_residual.add(hidden_states, cross.hidden_states)
        hidden_states = self.ffn_residual.add(hidden_states, self.ffn(self.ffn_residual.norm_input(hidden_states)))
        aux = [a for a in (attn.aux_loss, cross.aux_loss) if a is not None]
        aux_loss = torch.stack(aux).sum() if aux else None
        return hidden_states, attn.attn_weights, cross.attn_weights, aux_loss

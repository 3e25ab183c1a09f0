"""Prediction heads: masked-LM head (BERT layout, tied decoder) and the pooled classification head."""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from .configuration import ZooConfig


class MaskedLMHead(nn.Module):
    """`dense -> act -> LayerNorm -> decoder (tied to the token embeddings) + bias` (BERT's `cls.predictions`)."""

    def __init__(self, config: ZooConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def set_decoder(self, value: nn.Linear) -> None:
        """New output embeddings (e.g. resized): the bias follows their vocabulary, keeping the learnt entries of the
        tokens both vocabularies share (the first ones, as `resize_token_embeddings` keeps them) and 0 for new ones."""
        self.decoder = value
        bias = torch.zeros(value.out_features, device=value.weight.device, dtype=self.bias.dtype)
        kept = min(value.out_features, self.bias.numel())
        bias[:kept] = self.bias.detach()[:kept]
        self.bias = nn.Parameter(bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden_states)))) + self.bias


class SequencePooler(nn.Module):
    """Pools `(B, N, D)` to `(B, D)`: first token, mean over real tokens, or additive attention pooling."""

    def __init__(self, config: ZooConfig):
        super().__init__()
        self.mode = config.classifier_pooling
        if self.mode == "attention":
            self.attn_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.attn_score = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if self.mode == "cls":
            return hidden_states[:, 0]
        valid = (
            torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
            if attention_mask is None
            else attention_mask.bool()
        )
        if self.mode == "mean":
            weights = valid.to(hidden_states.dtype)
            return (hidden_states * weights[..., None]).sum(1) / weights.sum(1, keepdim=True).clamp(min=1.0)
        scores = self.attn_score(torch.tanh(self.attn_proj(hidden_states))).squeeze(-1)  # (B, N)
        scores = scores.float().masked_fill(~valid, torch.finfo(torch.float32).min)
        weights = torch.softmax(scores, dim=-1).to(hidden_states.dtype)
        return torch.einsum("bn,bnd->bd", weights, hidden_states)


class ClassificationHead(nn.Module):
    """Pooling, then `dense + tanh` (BERT's pooler), dropout and the output projection."""

    def __init__(self, config: ZooConfig):
        super().__init__()
        self.pooler = SequencePooler(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        pooled = torch.tanh(self.dense(self.pooler(hidden_states, attention_mask)))
        return self.out_proj(self.dropout(pooled))

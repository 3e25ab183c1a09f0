"""Position-wise feed-forward network (BERT's `intermediate` + `output.dense`)."""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from .configuration import ZooConfig


class FeedForward(nn.Module):
    """`dense(D -> I) -> act -> dense(I -> D) -> dropout`; residual and norm live in the layer."""

    def __init__(self, config: ZooConfig):
        super().__init__()
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.output(self.act(self.intermediate(hidden_states))))

"""Weight initialisation: method hooks run for parameters in child modules, and never overwrite loaded weights."""

from __future__ import annotations

import torch
import transformers.initialization as init
from torch import nn

from attnzoo.core import DenseAttention, ZooConfig, ZooModel


class _AttentionWithOwnInit(DenseAttention):
    """A method attention whose extra parameters sit in a child module, as most methods' do."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.selector = nn.Linear(config.hidden_size, 3)

    def init_method_weights(self) -> None:
        init.constant_(self.selector.weight, 0.25)
        init.constant_(self.selector.bias, -1.0)


class _Model(ZooModel):
    attention_class = _AttentionWithOwnInit


def _config() -> ZooConfig:
    return ZooConfig(vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=2)


def test_method_init_hook_runs_for_parameters_in_child_modules():
    model = _Model(_config())
    for layer in model.encoder.layers:
        assert torch.all(layer.attention.selector.weight == 0.25)
        assert torch.all(layer.attention.selector.bias == -1.0)


def test_loading_keeps_checkpoint_values_of_method_parameters(tmp_path):
    model = _Model(_config())
    with torch.no_grad():
        model.encoder.layers[0].attention.selector.weight.fill_(7.0)
    model.save_pretrained(tmp_path)
    reloaded = _Model.from_pretrained(tmp_path)
    assert torch.all(reloaded.encoder.layers[0].attention.selector.weight == 7.0)
    assert torch.all(reloaded.encoder.layers[1].attention.selector.weight == 0.25)

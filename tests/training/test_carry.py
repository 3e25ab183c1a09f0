"""Carrying a starting checkpoint's unused tensors into the saved model: both safetensors layouts load them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel

from attnzoo.training import carry_unloaded_tensors
from attnzoo.training.carry import CARRIED_SHARD

POOLER = ["pooler.dense.bias", "pooler.dense.weight"]


def _bert(pooler: bool) -> BertModel:
    torch.manual_seed(int(pooler))
    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    return BertModel(config, add_pooling_layer=pooler)


@pytest.mark.parametrize("shard_size", [None, "20KB"], ids=["one-file", "sharded"])
def test_the_carried_pooler_loads_and_the_trained_weights_stay(tmp_path, shard_size):
    source, trained = _bert(pooler=True), _bert(pooler=False)
    source.save_pretrained(tmp_path / "source")
    trained.save_pretrained(tmp_path / "out", **({"max_shard_size": shard_size} if shard_size else {}))
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file() == (shard_size is not None)

    carried = carry_unloaded_tensors(str(tmp_path / "source"), tmp_path / "out", [*POOLER, "not.stored"])

    assert carried == POOLER
    loaded = BertModel.from_pretrained(tmp_path / "out")
    torch.testing.assert_close(loaded.pooler.dense.weight, source.pooler.dense.weight, rtol=0, atol=0)
    torch.testing.assert_close(loaded.pooler.dense.bias, source.pooler.dense.bias, rtol=0, atol=0)
    # Everything the run trained is as it saved it, not overwritten by the source.
    for name, value in trained.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0)
    if shard_size:
        index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
        assert {index["weight_map"][name] for name in POOLER} == {CARRIED_SHARD}
    # Carrying again changes nothing: a name the saved model holds is left as saved.
    assert carry_unloaded_tensors(str(tmp_path / "source"), tmp_path / "out", POOLER) == []


def test_a_name_the_saved_model_holds_is_not_overwritten(tmp_path):
    (tmp_path / "source").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "source" / "config.json").write_text("{}")
    save_file({"a": torch.ones(2), "b": torch.ones(3)}, str(tmp_path / "source" / "model.safetensors"))
    save_file({"a": torch.zeros(2)}, str(tmp_path / "out" / "model.safetensors"), metadata={"format": "pt"})
    assert carry_unloaded_tensors(str(tmp_path / "source"), tmp_path / "out", ["a", "b"]) == ["b"]
    saved = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(saved["a"], torch.zeros(2)) and torch.equal(saved["b"], torch.ones(3))


def test_nothing_to_carry_into_is_a_clear_error(tmp_path):
    _bert(pooler=True).save_pretrained(tmp_path / "source")
    (tmp_path / "out").mkdir()
    assert carry_unloaded_tensors(str(tmp_path / "source"), tmp_path / "out", []) == []
    with pytest.raises(ValueError, match="holds no model.safetensors"):
        carry_unloaded_tensors(str(tmp_path / "source"), tmp_path / "out", POOLER)

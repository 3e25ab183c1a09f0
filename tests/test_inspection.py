"""`attnzoo.inspection`: the model and the inputs shared by the inspection scripts."""

from __future__ import annotations

import pytest
import torch

from attnzoo import inspection
from attnzoo.inspection import InspectionArguments, build_model, make_inputs
from source_checkout import REPO_ROOT, sst2_tokenizer

TINY = str(REPO_ROOT / "configs" / "models" / "dense_transformer" / "tiny.json")


@pytest.mark.parametrize("sources", [{}, {"config_path": TINY, "model_name_or_path": "ckpt"}])
def test_build_model_needs_exactly_one_source(sources):
    with pytest.raises(ValueError, match="exactly one of --config_path and --model_name_or_path"):
        build_model(InspectionArguments(**sources))


def test_build_model_applies_overrides_in_eval_mode_and_loads_checkpoints(tmp_path):
    args = InspectionArguments(config_path=TINY, config_overrides='{"num_hidden_layers": 1}')
    model = build_model(args, attention_probs_dropout_prob=0.0)
    assert not model.training
    assert model.config.num_hidden_layers == 1 and model.config.attention_probs_dropout_prob == 0.0
    with pytest.raises(ValueError, match="num_hidden_layers"):
        build_model(InspectionArguments(config_path=TINY, config_overrides='{"num_hidden_layers": 0}'))
    model.save_pretrained(tmp_path)
    overrides = '{"hidden_dropout_prob": 0.0}'
    loaded = build_model(InspectionArguments(model_name_or_path=str(tmp_path), config_overrides=overrides))
    assert loaded.config.hidden_dropout_prob == 0.0 and loaded.config.num_hidden_layers == 1 and not loaded.training
    state, loaded_state = model.state_dict(), loaded.state_dict()
    assert state.keys() == loaded_state.keys() and all(torch.equal(state[k], loaded_state[k]) for k in state)


def test_make_inputs_from_random_tokens_is_seeded():
    config = build_model(InspectionArguments(config_path=TINY)).config
    inputs = make_inputs(InspectionArguments(length=12, seed=3), config)
    assert inputs["input_ids"].shape == (1, 12) and inputs["attention_mask"].eq(1).all()
    assert inputs["input_ids"].min() >= 5 and inputs["input_ids"].max() < config.vocab_size
    assert torch.equal(inputs["input_ids"], make_inputs(InspectionArguments(length=12, seed=3), config)["input_ids"])
    assert not torch.equal(inputs["input_ids"], make_inputs(InspectionArguments(length=12), config)["input_ids"])


def test_make_inputs_from_text_uses_the_tokenizer(tmp_path):
    tokenizer = sst2_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    args = InspectionArguments(text="a gripping , funny film", length=99, tokenizer_name_or_path=str(tmp_path))
    inputs = make_inputs(args, config=None)  # the config only matters for random tokens
    assert inputs["input_ids"].tolist() == [tokenizer("a gripping , funny film")["input_ids"]]
    assert inputs["attention_mask"].shape == inputs["input_ids"].shape and inputs["attention_mask"].eq(1).all()
    given = make_inputs(InspectionArguments(text="a funny film"), config=None, tokenizer=tokenizer)
    assert given["input_ids"].tolist() == [tokenizer("a funny film")["input_ids"]]


def test_build_model_imports_the_families_only_for_an_unregistered_model_type(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(inspection, "import_families", lambda: calls.append(1))
    build_model(InspectionArguments(config_path=TINY))
    assert calls == []
    (tmp_path / "config.json").write_text('{"model_type": "not_a_zoo_family"}')
    with pytest.raises((KeyError, ValueError)):
        build_model(InspectionArguments(config_path=str(tmp_path / "config.json")))
    assert calls == [1]

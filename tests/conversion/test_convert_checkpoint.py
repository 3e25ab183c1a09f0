"""`attnzoo.conversion`: BERT / RoBERTa checkpoints saved by transformers into every family, at a new length."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer

from attnzoo import FAMILIES
from attnzoo.conversion import (
    REPORT_FILE,
    ConversionArguments,
    ConversionError,
    convert_checkpoint,
    convert_for_training,
    read_report,
)
from attnzoo.conversion.bert_names import strip_model_prefix

from .conftest import SOURCE_POSITIONS, right_padded_batch

NEW_LENGTH = 160  # 2.5 source tables: a whole repeat and a partial one


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "RobertaForMaskedLM"])
def test_dense_conversion_computes_the_source_logits(tmp_path, source_checkpoint, architecture):
    folder, source = source_checkpoint(architecture)
    convert_checkpoint(str(folder), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    zoo = AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    ids, mask = right_padded_batch(source.config.vocab_size, source.config.pad_token_id, length=SOURCE_POSITIONS)
    with torch.no_grad():
        expected = source(input_ids=ids, attention_mask=mask).logits
        actual = zoo(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(actual[1, :30], expected[1, :30], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("architecture", ["BertModel", "RobertaModel"])
def test_dense_conversion_of_a_bare_encoder_keeps_hidden_states_and_pooler(tmp_path, source_checkpoint, architecture):
    folder, source = source_checkpoint(architecture)
    report = convert_checkpoint(str(folder), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    assert report.target_class == "DenseTransformerForMaskedLM"  # with a fresh head (test_masked_lm_head.py)
    ids, mask = right_padded_batch(source.config.vocab_size, source.config.pad_token_id)
    encoder = AutoModel.from_pretrained(tmp_path / "out").eval()
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", num_labels=2).eval()
    with torch.no_grad():
        expected = source(input_ids=ids, attention_mask=mask)
        hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = torch.tanh(classifier.classifier.dense(hidden[:, 0]))
    torch.testing.assert_close(hidden[0], expected.last_hidden_state[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden[1, :30], expected.last_hidden_state[1, :30], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pooled, expected.pooler_output, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("architecture", "offset"), [("BertForMaskedLM", 0), ("RobertaForMaskedLM", 2)])
def test_rows_beyond_the_source_length_repeat_its_table(tmp_path, source_checkpoint, architecture, offset):
    folder, source = source_checkpoint(architecture)
    convert_checkpoint(str(folder), "sparse_transformer", NEW_LENGTH, tmp_path / "out")
    table = AutoModelForMaskedLM.from_pretrained(tmp_path / "out").model.encoder.embeddings.position_embeddings.weight
    learned = source.base_model.embeddings.position_embeddings.weight[offset:]
    assert learned.shape[0] == SOURCE_POSITIONS
    assert table.shape[0] == NEW_LENGTH
    for position in (0, 1, SOURCE_POSITIONS - 1, SOURCE_POSITIONS, SOURCE_POSITIONS + 5, 2 * SOURCE_POSITIONS, 159):
        torch.testing.assert_close(table[position], learned[position % SOURCE_POSITIONS], rtol=0, atol=0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_loads_with_auto_masked_lm_and_runs_at_the_new_length(tmp_path, source_checkpoint, family):
    folder, source = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(str(folder), family, NEW_LENGTH, tmp_path / "out")
    model, loading = AutoModelForMaskedLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    config = model.config
    assert config.model_type == family
    assert config.max_position_embeddings == NEW_LENGTH
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "layer_norm_eps"):
        assert getattr(config, name) == getattr(source.config, name), name
    # The family's own fields are at the config class's defaults.
    defaults = FAMILIES[family].config_class()
    assert report.method_defaults == {name: getattr(defaults, name) for name in report.method_defaults}
    # ... and so are the shared fields a sparse family sets apart from the zoo's (its global token, mean pooling).
    if family != "dense_transformer":
        assert report.method_defaults["num_global_tokens"] == 1
        assert report.method_defaults["classifier_pooling"] == "mean"
    else:
        assert "num_global_tokens" not in report.method_defaults
    # Every parameter of the target is either carried from the source, tied, or listed as new.
    carried = {row["destination"] for row in report.mapped}
    new = {row["name"] for row in report.new}
    tied = {row["name"] for row in report.tied}
    assert carried | new | tied == set(model.state_dict())
    assert not carried & new
    if family == "dense_transformer":
        assert not new
    model.eval()
    ids = torch.randint(5, config.vocab_size, (1, NEW_LENGTH), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, NEW_LENGTH, config.vocab_size)
    assert torch.isfinite(logits).all()


def test_method_tensors_are_reported_with_their_initialisation(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(str(folder), "sbm", NEW_LENGTH, tmp_path / "out")
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "out")
    own = {name for name, _ in model.named_parameters() if ".attention." in name and "_proj." not in name}
    rows = {row["name"]: row for row in report.new}
    assert own and own == set(rows)
    assert rows["model.encoder.layers.0.attention.clusters"]["init"].startswith("SBMAttention.init_method_weights")
    assert rows["model.encoder.layers.0.attention.membership_mlp.0.bias"]["init"].startswith("zeros")
    text = (tmp_path / "out" / "conversion_report.md").read_text()
    assert "model.encoder.layers.1.attention.clusters" in text


def test_report_accounts_for_every_stored_source_tensor(tmp_path, source_checkpoint):
    """BertForPreTraining stores a pooler and the next-sentence head next to the masked-LM head."""
    folder, source = source_checkpoint("BertForPreTraining")
    report = convert_checkpoint(str(folder), "fsat", NEW_LENGTH, tmp_path / "out")
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        stored = set(handle.keys())
    accounted = [row["source"] for row in report.mapped] + [row["source"] for row in report.not_carried]
    assert set(accounted) == stored
    not_carried = {strip_model_prefix(row["source"]): row["reason"] for row in report.not_carried}
    # FSAT's keys, values and output weight start fresh (`FSATAttention.not_from_source`), with its reasons.
    fsat_own = {
        f"encoder.layer.{i}.attention.{part}": reason
        for i in range(source.config.num_hidden_layers)
        for part, reason in {
            "self.key.weight": "keys and values project its pooled cross",
            "self.key.bias": "keys and values project its pooled cross",
            "self.value.weight": "keys and values project its pooled cross",
            "self.value.bias": "keys and values project its pooled cross",
            "output.dense.weight": "zero at a warm start",
        }.items()
    }
    assert set(not_carried) == {"cls.seq_relationship.weight", "cls.seq_relationship.bias", *fsat_own}
    for name, reason in fsat_own.items():
        assert not_carried[name].startswith("FSATAttention: ") and reason in not_carried[name], name
    pooler = next(row for row in report.mapped if row["source"] == "bert.pooler.dense.weight")
    assert pooler["destination"] == "classifier.dense.weight"
    assert "mean of the real tokens" in pooler["note"]  # FSAT's default pooling, not BERT's first token
    saved = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert saved["source"] == str(folder) and saved["base_model"] is None


def test_fsat_warm_start_carries_queries_and_starts_its_attention_branch_silent(tmp_path, source_checkpoint):
    """FSAT's keys and values read its pooled cross, not the hidden states: they start fresh and the output
    projection at zero, so the converted encoder mixes no tokens until it trains, and the branch still learns."""
    folder, source = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(str(folder), "fsat", NEW_LENGTH, tmp_path / "out")
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "out")
    for layer, source_layer in zip(model.model.encoder.layers, source.bert.encoder.layer, strict=True):
        attention, source_attention = layer.attention, source_layer.attention
        torch.testing.assert_close(attention.q_proj.weight, source_attention.self.query.weight)
        torch.testing.assert_close(attention.o_proj.bias, source_attention.output.dense.bias)
        assert not attention.o_proj.weight.any()
        assert not torch.equal(attention.k_proj.weight, source_attention.self.key.weight)
        assert attention.v_proj.weight.std().item() == pytest.approx(model.config.initializer_range, rel=0.1)
    rows = {row["name"]: row["init"] for row in report.new}
    assert rows["model.encoder.layers.0.attention.o_proj.weight"] == "FSATAttention.init_for_warm_start: zeros"
    assert rows["model.encoder.layers.1.attention.k_proj.weight"].startswith("FSATAttention.init_for_warm_start")
    # No token mixing yet: changing one token leaves every other position's output as it was.
    model.eval()
    ids = torch.randint(5, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, 7] = (ids[0, 7] + 1) % model.config.vocab_size
    with torch.no_grad():
        before, after = model(input_ids=ids).logits, model(input_ids=changed).logits
    others = torch.arange(24) != 7
    torch.testing.assert_close(before[:, others], after[:, others])
    assert not torch.allclose(before[:, 7], after[:, 7])
    # The silent branch is not a dead one: the output projections get a gradient at the first step.
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    for layer in model.model.encoder.layers:
        assert layer.attention.o_proj.weight.grad.abs().sum() > 0


def test_tokenizer_is_saved_with_the_new_model_max_length(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("RobertaForMaskedLM")
    convert_checkpoint(str(folder), "a2former", NEW_LENGTH, tmp_path / "out")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.model_max_length == NEW_LENGTH
    assert AutoTokenizer.from_pretrained(folder).model_max_length == SOURCE_POSITIONS
    assert tokenizer("a long sentence").input_ids == AutoTokenizer.from_pretrained(folder)("a long sentence").input_ids


def test_roberta_special_ids_and_token_types_come_from_the_source(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("RobertaForMaskedLM")
    report = convert_checkpoint(str(folder), "smart_bird", NEW_LENGTH, tmp_path / "out")
    config = AutoModelForMaskedLM.from_pretrained(tmp_path / "out").config
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id, config.type_vocab_size) == (1, 0, 2, 1)
    assert config.layer_norm_eps == 1e-5
    assert "roberta row p + 2" in report.positions


def test_config_overrides_set_method_fields_but_not_sizes(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(
        str(folder), "smart_bird", NEW_LENGTH, tmp_path / "a", config_overrides="num_samples=7"
    )
    assert report.method_defaults["num_samples"] == 7
    assert AutoModelForMaskedLM.from_pretrained(tmp_path / "a").config.num_samples == 7
    with pytest.raises(ConversionError, match="hidden_size"):
        convert_checkpoint(str(folder), "smart_bird", NEW_LENGTH, tmp_path / "b", config_overrides="hidden_size=64")
    with pytest.raises(ConversionError, match="position_embedding_type"):  # the source's learned table is carried
        convert_checkpoint(str(folder), "smart_bird", NEW_LENGTH, tmp_path / "d", "position_embedding_type=sinusoidal")
    with pytest.raises(ValueError, match="num_sample_points"):
        convert_checkpoint(str(folder), "smart_bird", NEW_LENGTH, tmp_path / "c", "num_sample_points=3")


def test_unmapped_source_tensor_stops_the_conversion_naming_it(tmp_path, source_checkpoint):
    from transformers import BertForSequenceClassification

    folder, source = source_checkpoint("BertForMaskedLM")
    classifier = BertForSequenceClassification(source.config)
    classifier.save_pretrained(tmp_path / "classifier")
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path / "classifier")
    with pytest.raises(ConversionError, match=r"classifier\.bias, classifier\.weight"):
        convert_checkpoint(str(tmp_path / "classifier"), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_untied_output_embeddings_are_refused(tmp_path, source_checkpoint):
    from transformers import BertForMaskedLM

    folder, source = source_checkpoint("BertForMaskedLM")
    config = source.config.__class__(**{**source.config.to_dict(), "tie_word_embeddings": False})
    untied = BertForMaskedLM(config)
    untied.save_pretrained(tmp_path / "untied")
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path / "untied")
    with pytest.raises(ConversionError, match="untied output embeddings"):
        convert_checkpoint(str(tmp_path / "untied"), "dense_transformer", NEW_LENGTH, tmp_path / "out")


def test_output_folder_must_be_new_or_empty(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(ConversionError, match="not empty"):
        convert_checkpoint(str(folder), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    assert read_report(tmp_path / "out") is None


def test_unknown_family_is_refused_with_the_choices(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    with pytest.raises(ConversionError, match="smart_bird"):
        convert_checkpoint(str(folder), "bigbird", NEW_LENGTH, tmp_path / "out")


def test_pytorch_bin_with_tied_copies_and_buffers_converts(tmp_path, source_checkpoint):
    """Older Hub checkpoints store `pytorch_model.bin` with the tied LM decoder and the position-id buffer."""
    folder, source = source_checkpoint("BertForMaskedLM")
    state = dict(source.state_dict())
    state["bert.embeddings.position_ids"] = torch.arange(SOURCE_POSITIONS)[None]
    assert "cls.predictions.decoder.weight" in state
    (tmp_path / "bin").mkdir()
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "bin" / name).write_bytes((folder / name).read_bytes())
    report = convert_checkpoint(str(tmp_path / "bin"), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    rows = {row["source"]: row for row in report.mapped}
    assert rows["cls.predictions.decoder.weight"]["destination"] == "lm_head.decoder.weight"
    assert {row["source"] for row in report.not_carried} == {"bert.embeddings.position_ids"}
    zoo = AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    ids = right_padded_batch(source.config.vocab_size, source.config.pad_token_id)[0][:1]
    with torch.no_grad():
        torch.testing.assert_close(zoo(input_ids=ids).logits, source(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def _legacy_layer_norm_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The names early BERT code saved (`LayerNorm.gamma` / `LayerNorm.beta`), which transformers still loads."""
    return {
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): tensor
        for name, tensor in state.items()
    }


def _bin_checkpoint(folder, source_folder, state: dict[str, torch.Tensor]):
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((source_folder / name).read_bytes())
    return folder


def test_legacy_layer_norm_names_convert_like_todays(tmp_path, source_checkpoint):
    folder, source = source_checkpoint("BertForMaskedLM")
    state = _legacy_layer_norm_names(source.state_dict())
    assert any(name.endswith("LayerNorm.gamma") for name in state)
    legacy = _bin_checkpoint(tmp_path / "legacy", folder, state)
    report = convert_checkpoint(str(legacy), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    rows = {row["source"]: row["destination"] for row in report.mapped}
    assert rows["bert.embeddings.LayerNorm.gamma"] == "model.encoder.embeddings.LayerNorm.weight"  # as stored
    zoo = AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    ids, mask = right_padded_batch(source.config.vocab_size, source.config.pad_token_id, length=SOURCE_POSITIONS)
    with torch.no_grad():
        expected = source.eval()(input_ids=ids, attention_mask=mask).logits
        actual = zoo(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-5)


def test_a_layer_norm_stored_under_both_names_is_refused(tmp_path, source_checkpoint):
    folder, source = source_checkpoint("BertForMaskedLM")
    state = dict(source.state_dict())
    state["bert.embeddings.LayerNorm.gamma"] = state["bert.embeddings.LayerNorm.weight"].clone()
    both = _bin_checkpoint(tmp_path / "both", folder, state)
    with pytest.raises(ConversionError, match="bert.embeddings.LayerNorm.gamma.*both map to"):
        convert_checkpoint(str(both), "dense_transformer", NEW_LENGTH, tmp_path / "out")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"config_overrides": "exploration_delta=0.02"}, "config_overrides {'exploration_delta': 0.02} (it holds {})"),
        ({"seq2seq": True}, "seq2seq True (it holds False)"),
        ({"family": "fsat"}, "family 'fsat' (it holds 'sbm')"),
    ],
)
def test_a_folder_converted_with_other_settings_is_refused_naming_them(tmp_path, source_checkpoint, change, named):
    folder, _ = source_checkpoint("BertForMaskedLM")
    request = {"model_name_or_path": str(folder), "family": "sbm", "max_position_embeddings": 96}
    convert_for_training(ConversionArguments(**request, output_dir=str(tmp_path / "out")))
    again = ConversionArguments(**request, output_dir=str(tmp_path / "out"))
    assert convert_for_training(again) == tmp_path / "out"  # the same request reuses the folder
    with pytest.raises(ConversionError, match="other settings") as refusal:
        convert_for_training(ConversionArguments(**{**request, **change}, output_dir=str(tmp_path / "out")))
    assert named in str(refusal.value) and "max_position_embeddings" not in str(refusal.value)

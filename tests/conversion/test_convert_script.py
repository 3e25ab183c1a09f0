"""`scripts/convert_checkpoint.py`: the command line, its report, and one-line errors for sources it cannot convert."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForMaskedLM, GPT2Config, GPT2LMHeadModel

from source_checkout import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("convert_checkpoint")


def test_command_converts_prints_and_saves_the_report(tmp_path, source_checkpoint, script, capsys):
    folder, _ = source_checkpoint("RobertaForMaskedLM")
    argv = ["--model_name_or_path", str(folder), "--family", "smart_bird", "--max_position_embeddings", "96"]
    assert script.main([*argv, "--output_dir", str(tmp_path / "out"), "--config_overrides", "num_samples=5"]) == 0
    printed = capsys.readouterr().out
    saved = (tmp_path / "out" / "conversion_report.md").read_text()
    assert saved in printed
    assert "roberta.embeddings.position_embeddings.weight" in saved
    assert "model.encoder.sketch.input_proj.weight" in saved  # a new tensor of the method
    report = json.loads((tmp_path / "out" / "conversion_report.json").read_text())
    assert report["family"] == "smart_bird" and report["config_overrides"] == {"num_samples": 5}
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "out")
    assert model.config.num_samples == 5 and model.config.max_position_embeddings == 96


def test_a_misspelt_override_field_is_one_line_not_a_traceback(tmp_path, source_checkpoint, script, capsys):
    folder, _ = source_checkpoint("RobertaForMaskedLM")
    argv = ["--model_name_or_path", str(folder), "--family", "smart_bird", "--max_position_embeddings", "96"]
    capsys.readouterr()
    assert script.main([*argv, "--output_dir", str(tmp_path / "out"), "--config_overrides", "num_sample=5"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: Unknown config field(s) num_sample for SmartBirdConfig") and error.count("\n") == 1


def test_gpt2_folder_is_refused_with_a_message_not_a_traceback(tmp_path, script, capsys):
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    capsys.readouterr()
    argv = ["--model_name_or_path", str(tmp_path / "gpt2"), "--family", "fsat", "--max_position_embeddings", "64"]
    assert script.main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1
    assert "'gpt2' checkpoint (GPT2LMHeadModel), not a BERT-layout encoder" in error
    assert "Traceback" not in error
    assert not (tmp_path / "out").exists()


def test_folder_without_tokenizer_is_refused(tmp_path, source_checkpoint, script, capsys):
    from transformers import BertForMaskedLM

    _, source = source_checkpoint("BertForMaskedLM")
    BertForMaskedLM(source.config).save_pretrained(tmp_path / "weights-only")
    capsys.readouterr()
    argv = ["--model_name_or_path", str(tmp_path / "weights-only"), "--family", "sbm"]
    assert script.main([*argv, "--max_position_embeddings", "64", "--output_dir", str(tmp_path / "out")]) == 2
    assert "no loadable tokenizer" in capsys.readouterr().err


def test_missing_folder_is_refused_without_a_download(tmp_path, script, capsys):
    argv = ["--model_name_or_path", str(tmp_path / "absent"), "--family", "sbm", "--max_position_embeddings", "64"]
    assert script.main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    assert "is not a checkpoint folder" in capsys.readouterr().err


def test_hub_id_that_cannot_be_downloaded_is_refused_with_a_message(tmp_path, script, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [
        "--model_name_or_path",
        "attnzoo-tests/no-such-model",
        "--family",
        "sbm",
        "--max_position_embeddings",
        "64",
    ]
    assert script.main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "attnzoo-tests/no-such-model is not a local folder and could not be downloaded" in error

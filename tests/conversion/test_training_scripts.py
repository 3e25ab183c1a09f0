"""`--family` in the training scripts: convert a BERT / RoBERTa checkpoint and train it in one run; the conversion
report follows the model, and `publish.py` takes the card's `base_model` from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from attnzoo import FAMILIES
from attnzoo.conversion import REPORT_FILE, ConversionReport, read_report
from source_checkout import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "tests" / "fixtures" / "data"
QUIET = ["--use_cpu", "--disable_tqdm", "true", "--log_level", "warning", "--seed", "0", "--report_to", "none"]


def _mlm_args(source: Path, family: str, output: Path) -> list[str]:
    return [
        "--model_name_or_path", str(source),
        "--family", family,
        "--max_position_embeddings", "128",
        "--train_file", str(DATA / "text" / "wikitext_train.txt"),
        "--validation_file", str(DATA / "text" / "wikitext_valid.txt"),
        "--max_seq_length", "128",
        "--max_steps", "2",
        "--per_device_train_batch_size", "2",
        "--max_train_samples", "8",
        "--max_eval_samples", "4",
        "--save_strategy", "no",
        "--output_dir", str(output),
        *QUIET,
    ]  # fmt: skip


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_run_mlm_converts_and_continues_pretraining_in_one_run(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("RobertaForMaskedLM")
    run_mlm = load_script("run_mlm")
    result = run_mlm.main(_mlm_args(folder, "sbm", tmp_path / "run"))
    assert result["global_step"] == 2 and "eval_loss" in result["metrics"]
    assert result["model"]["init"] == "checkpoint"
    assert result["model"]["missing_keys"] == [] and result["model"]["unexpected_keys"] == []
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["model_type"], config["max_position_embeddings"]) == ("sbm", 128)
    assert AutoTokenizer.from_pretrained(tmp_path / "run").model_max_length == 128
    report = read_report(tmp_path / "run")
    assert report is not None and report.source == str(folder) and report.family == "sbm"
    # Running again into the same folder reuses the conversion; another family there is refused.
    run_mlm.main(_mlm_args(folder, "sbm", tmp_path / "run"))
    with pytest.raises(ValueError, match="already holds a conversion"):
        run_mlm.main(_mlm_args(folder, "fsat", tmp_path / "run"))


def test_run_mlm_continues_a_plain_bert_checkpoint(tmp_path, source_checkpoint):
    # No `--family`: the checkpoint trains as it is (the warm-start evidence's second source phase). BERT's config in
    # transformers 5.x has no `position_embedding_type`, and the positions check must not need one.
    folder, _ = source_checkpoint("BertForMaskedLM")
    run_mlm = load_script("run_mlm")
    args = _mlm_args(folder, "sbm", tmp_path / "run")
    args = args[:2] + args[6:]  # without --family and --max_position_embeddings
    args[args.index("--max_seq_length") + 1] = "64"  # the source's length
    result = run_mlm.main(args)
    assert result["global_step"] == 2 and "eval_loss" in result["metrics"]
    assert result["model"]["init"] == "checkpoint"
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model_type"] == "bert"
    with pytest.raises(ValueError, match="position_embedding_type"):
        run_mlm.main([*args, "--config_overrides", "position_embedding_type=rotary"])


def test_continued_pretraining_keeps_the_pooler_for_the_classifier(tmp_path, source_checkpoint):
    # A BertModel's pooler becomes the classification head's `classifier.dense`, which the masked-LM model has no
    # place for: the continued checkpoint must still hold it, so a classifier fine-tuned from it starts from BERT's.
    from transformers import AutoModelForSequenceClassification

    folder, bert = source_checkpoint("BertModel")
    result = load_script("run_mlm").main(_mlm_args(folder, "sparse_transformer", tmp_path / "run"))
    pooler = {"classifier.dense.weight", "classifier.dense.bias"}
    assert set(result["model"]["unexpected_keys"]) == pooler
    assert result["model"]["carried_keys"] == sorted(pooler)
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run", num_labels=2)
    torch.testing.assert_close(classifier.classifier.dense.weight, bert.pooler.dense.weight, rtol=0, atol=0)
    torch.testing.assert_close(classifier.classifier.dense.bias, bert.pooler.dense.bias, rtol=0, atol=0)
    # The trained weights are the run's, not the source's.
    trained = AutoModelForMaskedLM.from_pretrained(tmp_path / "run").model.encoder.embeddings.word_embeddings.weight
    assert not torch.equal(trained, bert.embeddings.word_embeddings.weight)


def test_family_needs_a_length_and_no_config_path(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    run_mlm = load_script("run_mlm")
    args = _mlm_args(folder, "sbm", tmp_path / "run")
    without_length = args[:4] + args[6:]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        run_mlm.main(without_length)
    with pytest.raises(ValueError, match="not both"):
        run_mlm.main([*args, "--config_path", str(REPO_ROOT / "configs/models/sbm/tiny.json")])


def test_run_summarization_with_family_trains_the_bert2bert_warm_start(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    stories = str(DATA / "cnn_dailymail" / "cnn_stories")
    result = load_script("run_summarization").main(
        [
            "--model_name_or_path", str(folder),
            "--family", "dense_transformer",
            "--max_position_embeddings", "128",
            "--train_file", stories,
            "--train_url_list", str(DATA / "cnn_dailymail/url_lists/all_train.txt"),
            "--validation_file", stories,
            "--validation_url_list", str(DATA / "cnn_dailymail/url_lists/all_val.txt"),
            "--max_source_length", "128",
            "--max_target_length", "32",
            "--generation_max_new_tokens", "8",
            "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2",
            "--max_eval_samples", "2",
            "--max_steps", "1",
            "--predict_with_generate",
            "--save_strategy", "no",
            "--output_dir", str(tmp_path / "run"),
            *QUIET,
        ]
    )  # fmt: skip
    assert "eval_rouge1" in result["metrics"]
    assert read_report(tmp_path / "run").seq2seq is True
    assert json.loads((tmp_path / "run" / "config.json").read_text())["architectures"] == [
        "DenseTransformerForConditionalGeneration"
    ]


def test_publish_takes_base_model_from_the_conversion_report(tmp_path, source_checkpoint):
    from attnzoo.hub import PublishOptions, assemble

    folder, _ = source_checkpoint("BertForMaskedLM")
    run = tmp_path / "run"
    load_script("run_mlm").main(_mlm_args(folder, "dense_transformer", run))
    # Stand-in for a Hub source: the report records the Hub id a conversion downloaded.
    report = read_report(run)
    (run / REPORT_FILE).write_text(
        json.dumps({**report.to_dict(), "base_model": "google-bert/bert-base-uncased"}), encoding="utf-8"
    )
    options = {
        "checkpoint": str(run),
        "metrics": str(run / "metrics.json"),
        "repo_id": "me/dense-from-bert",
        "dataset_name": "WikiText",
        "card_dir": str(REPO_ROOT / "model_cards"),
    }
    card = (assemble(PublishOptions(**options, output_dir=str(tmp_path / "pub"))).folder / "README.md").read_text()
    assert "base_model: google-bert/bert-base-uncased" in card
    explicit = PublishOptions(**options, output_dir=str(tmp_path / "pub2"), base_model="me/other")
    assert "base_model: me/other" in (assemble(explicit).folder / "README.md").read_text()
    # A checkpoint converted from a local folder has no Hub id to name.
    assert isinstance(report, ConversionReport) and report.base_model is None


def test_continue_pretraining_recipe_converts_at_the_length_it_trains():
    from transformers import TrainingArguments

    from attnzoo.training import MLMDataArguments, ModelArguments, parse_arguments

    recipe = str(REPO_ROOT / "configs" / "train" / "continue_pretraining_long.yaml")
    model_args, data_args, training_args = parse_arguments(
        (ModelArguments, MLMDataArguments, TrainingArguments), [recipe]
    )
    assert model_args.family in FAMILIES
    assert model_args.max_position_embeddings == data_args.max_seq_length == 4096
    assert training_args.eval_on_start

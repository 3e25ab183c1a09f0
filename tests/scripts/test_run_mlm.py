"""`scripts/run_mlm.py`: end-to-end runs on bundled WikiText, long-block grouping, warm starts, exact resume."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, pipeline

import attnzoo
from attnzoo.training import DataReport, StopAtStepCallback
from source_checkout import REPO_ROOT

TINY = str(REPO_ROOT / "configs/models/dense_transformer/tiny.json")
FAMILY_NAMES = sorted(f.name for f in attnzoo.FAMILIES.values())


def _data(data_dir, train: str = "wikitext_valid.txt") -> list[str]:
    return [
        "--train_file", str(data_dir / "text" / train),
        "--validation_file", str(data_dir / "text" / "wikitext_valid.txt"),
        "--max_eval_samples", "8",
        "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "8",
    ]  # fmt: skip


def test_run_mlm_trains_evaluates_and_writes_metrics_and_plot(tmp_path, data_dir, load_script, quiet_args):
    out = tmp_path / "mlm"
    argv = [*_data(data_dir), *quiet_args, "--config_path", TINY, "--max_seq_length", "64", "--max_steps", "2"]
    result = load_script("run_mlm").main([*argv, "--logging_steps", "1", "--output_dir", str(out)])
    metrics = result["metrics"]
    assert metrics["train_loss"] > 0 and metrics["eval_loss"] > 0
    assert metrics["eval_perplexity"] == pytest.approx(torch.tensor(metrics["eval_loss"]).exp().item(), rel=1e-5)
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert json.loads((out / "metrics.json").read_text())["metrics"] == metrics
    assert (out / "training_curves.png").stat().st_size > 0
    assert [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    # Every token of the corpus is in some block: none is dropped (the short remainders are counted).
    data = result["data"]
    tokenizer = AutoTokenizer.from_pretrained(out)
    texts = [line.strip() for line in (data_dir / "text" / "wikitext_valid.txt").read_text().splitlines()]
    assert data["train_tokens"] == sum(len(ids) for ids in tokenizer([t for t in texts if t])["input_ids"])
    assert data["validation_blocks_dropped_by_max_samples"] == data["validation_blocks"] - 8
    # The saved model and tokenizer work with the fill-mask pipeline.
    predictions = pipeline("fill-mask", model=str(out), tokenizer=str(out), device="cpu")("the [MASK] of the city")
    assert len(predictions) == 5


def test_grouping_builds_long_blocks_for_long_context_pretraining(load_script, tokenizer_dir, data_dir):
    run_mlm = load_script("run_mlm")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = [t for t in (data_dir / "text" / "wikitext_train.txt").read_text().splitlines() if t.strip()]
    report = DataReport()
    blocks = run_mlm.group_texts(tokenizer, texts, 4096, report, "train")
    lengths = [len(ids) for ids in blocks["input_ids"]]
    assert (
        max(lengths) == 4096
        and lengths.count(4096) == report.counts["train_blocks"] - report.counts["train_short_blocks"]
    )
    assert sum(lengths) == report.counts["train_tokens"] == sum(len(ids) for ids in tokenizer(texts)["input_ids"])


def test_line_by_line_reports_truncated_texts(load_script, tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    report = DataReport()
    texts = ["the", "the album was released in the united states of america in the year"]
    dataset = load_script("run_mlm").line_by_line(tokenizer, texts, 8, report, "train")
    assert [len(ids) for ids in dataset["input_ids"]] == [3, 8]
    assert report.counts["train_truncated"] == 1


def test_run_mlm_rejects_blocks_longer_than_the_positions(tmp_path, data_dir, load_script, quiet_args):
    argv = [*_data(data_dir), *quiet_args, "--config_path", TINY, "--max_seq_length", "4096", "--max_steps", "1"]
    with pytest.raises(ValueError, match="exceeds the model's `max_position_embeddings` \\(512\\)"):
        load_script("run_mlm").main([*argv, "--output_dir", str(tmp_path / "x")])


@pytest.mark.slow
def test_interrupted_and_resumed_mlm_run_equals_the_uninterrupted_run(tmp_path, data_dir, load_script, quiet_args):
    # Dropout is on and masking is dynamic: the resumed run must replay the same masks and the same RNG stream.
    run_mlm = load_script("run_mlm")
    argv = [*_data(data_dir), *quiet_args, "--config_path", TINY, "--max_seq_length", "32", "--max_steps", "4"]
    argv += ["--save_steps", "2", "--learning_rate", "1e-3", "--logging_steps", "1"]
    full = run_mlm.main([*argv, "--output_dir", str(tmp_path / "full")])
    run_mlm.main([*argv, "--output_dir", str(tmp_path / "split")], callbacks=[StopAtStepCallback(2)])
    assert not (tmp_path / "split" / "checkpoint-4").exists()
    resumed = run_mlm.main([*argv, "--output_dir", str(tmp_path / "split"), "--resume_from_checkpoint", "last"])
    a, b = load_file(tmp_path / "full/model.safetensors"), load_file(tmp_path / "split/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    middle = load_file(tmp_path / "split/checkpoint-2/model.safetensors")
    assert not all(torch.equal(a[k], middle[k]) for k in a)
    assert resumed["metrics"]["eval_loss"] == full["metrics"]["eval_loss"]
    assert resumed["global_step"] == full["global_step"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_run_mlm_warm_starts_every_family_from_a_dense_checkpoint(tmp_path, data_dir, load_script, quiet_args, family):
    run_mlm = load_script("run_mlm")
    common = [*_data(data_dir), *quiet_args, "--max_seq_length", "64", "--max_steps", "2", "--save_strategy", "no"]
    run_mlm.main([*common, "--config_path", TINY, "--output_dir", str(tmp_path / "dense")])
    family_config = str(REPO_ROOT / "configs/models" / family / "tiny.json")
    result = run_mlm.main(
        [*common, "--config_path", family_config, "--model_name_or_path", str(tmp_path / "dense"),
         "--output_dir", str(tmp_path / family)]
    )  # fmt: skip
    assert result["model"]["init"] == "warm_start"
    assert result["model"]["unexpected_keys"] == []
    assert json.loads((tmp_path / family / "config.json").read_text())["model_type"] == (
        attnzoo.testing.family_by_name(family).model_type
    )

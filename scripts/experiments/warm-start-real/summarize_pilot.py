#!/usr/bin/env python
"""Step 3b's learning rate and model, chosen on held-back training calls, never on the validation calls the study
reports.

    python scripts/experiments/warm-start-real/summarize_pilot.py --profile cpu --learning-rates 1e-4 3e-4 \
        --config-overrides copy_from_source=false copy_from_source=true

The last `--hold-out` ECTSum training calls are held back and the model is fine-tuned on the others, once per learning
rate and model variant (`--config-overrides`: config fields set at conversion; by default the recipe's own), with the
profile's batch and `--steps` steps. The row is BERT2BERT with the dense family at the source's own length. It is the
cheapest row, and the part that step 3b trains from nothing is the same in every row: the decoder's fresh
cross-attention (and copy head). Every `--eval-every` steps, and before the first, the run is scored on the held-back
calls: teacher-forced loss, and the ROUGE, figures reproduced and distinct bigrams of greedy summaries. At the end it
is also scored on the number of different summaries. Needs `run.py data` first (the same `--profile` and `--work`).
Writes `<results>/summarize_pilot.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the study's own modules, beside this file

import run as study_run  # noqa: E402
from budgets import PROFILES, Profile  # noqa: E402
from schedule import Job  # noqa: E402

PILOT = "pilot"


def split_training_file(study: study_run.Study, name: str, hold_out: int, prefix: str = "") -> tuple[Path, Path]:
    """Write the study's training file `name` (`ectsum_train.jsonl`, `imdb_train.jsonl`) without its last `hold_out`
    records (the pilot's training file) and those alone (its tuning file) under `<work>/pilot/data`, as
    `<prefix>train.jsonl` and `<prefix>tune.jsonl`."""
    records = study_run.read_jsonl(study.absolute(study.data) / name)
    if not 0 < hold_out < len(records):
        raise ValueError(f"--hold-out must be between 1 and {len(records) - 1} ({name}'s records), not {hold_out}.")
    data = study.work / PILOT / "data"
    train, tune = data / f"{prefix}train.jsonl", data / f"{prefix}tune.jsonl"
    study_run.write_jsonl(study.absolute(train), records[:-hold_out])
    study_run.write_jsonl(study.absolute(tune), records[-hold_out:])
    return train, tune


def pilot_jobs(
    study: study_run.Study,
    learning_rates: list[float],
    eval_every: int,
    hold_out: int,
    config_overrides: list[str | None],
) -> list[Job]:
    """One `run_summarization.py` run per learning rate and model variant (the config fields set at conversion;
    `None`: none), evaluated on the held-back calls as it trains."""
    train, tune = split_training_file(study, "ectsum_train.jsonl", hold_out)
    length = study.short
    jobs = []
    for overrides in config_overrides:
        variant = f"-{study_run.slug(overrides)}" if overrides else ""
        for rate in learning_rates:
            # Everything that changes the run is in its folder's name: a finished folder is reused, never rerun.
            settings = f"lr{rate:g}-steps{study.profile.summarize_steps}-every{eval_every}-holdout{hold_out}{variant}"
            output = study.work / PILOT / f"dense_transformer-{length}-{settings}"
            command = study_run.summarize_command(
                study, "dense_transformer", length, output, train, tune, rate, None, overrides
            )
            command += ["--eval_strategy", "steps", "--eval_steps", str(eval_every), "--eval_on_start", "true"]
            jobs.append(Job(f"pilot-lr{rate:g}{variant}", command, output))
    return jobs


def curve(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The held-back scores at each evaluation, in step order (the evaluation after training repeats the last step's,
    and is kept once)."""
    scores = ("loss", "rouge1", "rouge2", "rougeL", "numbers_reproduced", "distinct_2grams")
    keys = tuple(f"eval_{score}" for score in scores)
    points = {
        row["step"]: {"step": row["step"], **{key.removeprefix("eval_"): row[key] for key in keys if key in row}}
        for row in history
        if "eval_loss" in row
    }
    return [points[step] for step in sorted(points)]


def collect(study: study_run.Study, jobs: list[Job], records: dict[str, Any], tune: Path) -> dict[str, Any]:
    """Each learning rate's curve, its final summaries scored like the study's rows, and its training cost."""
    calls = study_run.read_jsonl(study.absolute(tune))
    rows = {}
    for job in jobs:
        row = dict(records.get(job.name, {}))
        scored = study_run.scored_run(study, job.output, calls, examples=2)
        if scored is not None:
            row.update(
                curve=curve(study_run.run_history(study, job.output)),
                train_loss=scored["train_loss"],
                final=scored["scores"],
                different_summaries=scored["different_summaries"],
                examples=scored["examples"],
                cost=scored["cost"],
            )
        rows[job.name] = row
    return {"held_back_calls": len(calls), "rows": rows}


def add_location_arguments(parser: argparse.ArgumentParser) -> None:
    """`--work` and `--results`, as every pilot of the study takes them."""
    parser.add_argument(
        "--work", type=Path, help="the study's work folder (default: outputs/warm-start-real/<profile>)"
    )
    parser.add_argument("--results", type=Path, help="folder of the record (default: the study's results/<profile>)")


def pilot_study(args: argparse.Namespace, profile: Profile) -> study_run.Study:
    """The study a pilot reads and writes: its `--source`, `--device`, `--work` and `--results` with `profile`."""
    return study_run.Study(
        args.source,
        profile,
        args.work or Path("outputs") / "warm-start-real" / profile.name,
        args.results or study_run.STUDY / "results" / profile.name,
        args.device,
        study_run.SHARED / "ectsum",
        study_run.SHARED / "wikitext",
        study_run.SHARED / "imdb",
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=study_run.DEFAULT_SOURCE, help="BERT / RoBERTa folder or Hub id")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu", help="batch, lengths, threads")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[1e-4, 3e-4])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of each run")
    parser.add_argument("--eval-every", type=int, default=100, help="steps between evaluations")
    parser.add_argument("--hold-out", type=int, default=32, help="training calls held back to score on")
    parser.add_argument(
        "--config-overrides",
        nargs="+",
        help="model variants compared, each the config fields set at conversion, e.g. copy_from_source=false "
        "copy_from_source=true (default: the recipe's own `config_overrides`)",
    )
    add_location_arguments(parser)
    args = parser.parse_args(argv)
    profile = dataclasses.replace(PROFILES[args.profile], summarize_steps=args.steps, families=("dense_transformer",))
    study = pilot_study(args, profile)
    started = study_run.ran_on(study)
    from attnzoo.training.arguments import read_recipe

    variants = args.config_overrides or [read_recipe(study_run.ECTSUM_RECIPE).get("config_overrides")]
    jobs = pilot_jobs(study, args.learning_rates, args.eval_every, args.hold_out, variants)
    begin = time.time()
    records = study.run(jobs)
    record = {
        "ran_on": started,
        "wall_seconds": round(time.time() - begin, 1),
        "steps": args.steps,
        "batch": profile.summarize_batch * profile.summarize_accumulation,
        **collect(study, jobs, records, study.work / PILOT / "data" / "tune.jsonl"),
    }
    study_run.save(study, "summarize_pilot", record)
    return record


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

#!/usr/bin/env python
"""Step 3a's head learning rate, chosen on held-back training reviews, never on the validation reviews the study
reports.

    python scripts/experiments/warm-start-real/classify_pilot.py --profile cpu \
        --rows "sparse_transformer warm" "dense_transformer@512 warm (mean pooling)" --head-learning-rates none 3e-3

The last `--hold-out` IMDB training reviews are held back. Each row (a label of the study's IMDB table) is fine-tuned
on the other reviews at the profile's budget (`--steps` changes its length), once per head learning rate (`none`: the
recipe's own), and scored on the held-back reviews: accuracy, and each setting against the row's first one review by
review (the mean difference of correctness with its standard error, and the reviews only one of the two gets right).
Why it matters: MiniLM's pooled features are small, so at an encoder's learning rate the fresh output layer hardly
moves in a short run (`attnzoo.training.head_learning_rate`). Needs `run.py data` and the rows' checkpoints (`run.py
convert`, and `run.py mlm` for a warm+mlm row) first. Writes `<results>/classify_pilot.json`.
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
from budgets import PROFILES  # noqa: E402
from schedule import Job  # noqa: E402
from summarize_pilot import PILOT, add_location_arguments, pilot_study, split_training_file  # noqa: E402

#: the recipe's own head learning rate (none given: `--learning_rate` for the whole model)
RECIPE = "none"


def _checkpoint(row: dict[str, Any]) -> str:
    """The checkpoint a row fine-tunes (its architecture, for a scratch row)."""
    flags = row["model"]
    given = {flags[i]: flags[i + 1] for i in range(0, len(flags) - 1, 2)}
    return given.get("--config_path") or given["--model_name_or_path"]


def pilot_jobs(
    study: study_run.Study, labels: list[str], head_rates: list[str], hold_out: int, seed: int
) -> dict[str, dict[str, Job]]:
    """One `run_glue.py` run per row and head learning rate, keyed by the row's label, then by the rate."""
    rows = {row["row"]: row for row in study_run.classify_rows(study)}
    unknown = [label for label in labels if label not in rows]
    if unknown:
        raise ValueError(f"No IMDB row {unknown} in the study; its rows are {sorted(rows)}.")
    for label in labels:
        # A row made by an earlier step must find its checkpoint (the source row may be a Hub id).
        checkpoint = _checkpoint(rows[label])
        if rows[label]["needs"] and not study.absolute(Path(checkpoint)).exists():
            raise ValueError(f"Row {label!r} fine-tunes {checkpoint}, which does not exist: run `run.py` first.")
    train, tune = split_training_file(study, "imdb_train.jsonl", hold_out, prefix="imdb_")
    jobs: dict[str, dict[str, Job]] = {}
    for label in labels:
        for rate in head_rates:
            # Everything that changes the run is in its folder's name: a finished folder is reused, never rerun.
            settings = f"head{rate}-steps{study.profile.classify_steps}-holdout{hold_out}-seed{seed}"
            name = f"imdb-{study_run.slug(label)}-{settings}"
            output = study.work / PILOT / name
            command = study_run.classify_command(study, rows[label], output, seed, train, tune)
            if rate != RECIPE:
                command += ["--head_learning_rate", rate]
            jobs.setdefault(label, {})[rate] = Job(name, command, output, ())
    return jobs


def correct(study: study_run.Study, output: Path) -> list[int] | None:
    """Whether the run got each held-back review right (1) or wrong (0), in the file's order (`None`: no run)."""
    path = study.absolute(output) / "eval_predictions.tsv"
    if not path.is_file():
        return None
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [int(label == prediction) for _, label, prediction in rows]


def versus(first: list[int], other: list[int]) -> dict[str, Any]:
    """`other - first`, review by review: the mean difference of correctness (percent), its standard error, and the
    reviews only one of the two gets right."""
    from attnzoo.evaluation.seeds import PairedDifference

    differences = tuple(b - a for a, b in zip(first, other, strict=True))
    paired = PairedDifference(tuple(range(len(differences))), differences)
    return {
        "accuracy_difference": 100 * paired.mean,
        "standard_error": 100 * paired.standard_error,
        "only_this_right": paired.ahead,
        "only_first_right": paired.behind,
    }


def collect(
    study: study_run.Study, jobs: dict[str, dict[str, Job]], records: dict[str, Any], first: str
) -> dict[str, Any]:
    """Each run's accuracy, training loss and cost, and each row's settings against its `first` setting."""
    rows: dict[str, Any] = {}
    for label, by_rate in jobs.items():
        runs, outcomes = {}, {}
        for rate, job in by_rate.items():
            run = dict(records.get(job.name, {}))
            metrics = study_run.run_metrics(study, job.output)
            if metrics is not None:
                history = study_run.run_history(study, job.output)
                run.update(
                    accuracy=metrics["metrics"]["eval_accuracy"],
                    train_loss=metrics["metrics"].get("train_loss"),
                    loss_curve=[(row["step"], row["loss"]) for row in history if "loss" in row],
                    head_parameters=metrics["model"].get("head_parameters"),
                    cost=study_run.cost(metrics, history, study.device),
                )
                outcomes[rate] = correct(study, job.output)
            runs[rate] = run
        paired = {
            rate: versus(outcomes[first], outcome)
            for rate, outcome in outcomes.items()
            if rate != first and first in outcomes
        }
        rows[label] = {"runs": runs, f"versus_{first}": paired}
    return {"rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=study_run.DEFAULT_SOURCE, help="BERT / RoBERTa folder or Hub id")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu", help="rows, lengths, budget, threads")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rows", nargs="+", required=True, help="IMDB rows, as the study's table labels them")
    parser.add_argument(
        "--head-learning-rates",
        nargs="+",
        default=[RECIPE, "3e-3"],
        help=f"head learning rates compared, the first the baseline ({RECIPE!r}: the recipe's own)",
    )
    parser.add_argument("--steps", type=int, help="optimizer steps of each run (default: the profile's)")
    parser.add_argument("--hold-out", type=int, default=400, help="training reviews held back to score on")
    parser.add_argument("--seed", type=int, default=0)
    add_location_arguments(parser)
    args = parser.parse_args(argv)
    from attnzoo.training.head_learning_rate import check_head_learning_rate

    for rate in args.head_learning_rates:
        if rate != RECIPE:
            check_head_learning_rate(float(rate))
    profile = PROFILES[args.profile]
    profile = dataclasses.replace(profile, classify_steps=args.steps or profile.classify_steps)
    study = pilot_study(args, profile)
    started = study_run.ran_on(study)
    jobs = pilot_jobs(study, args.rows, args.head_learning_rates, args.hold_out, args.seed)
    begin = time.time()
    records = study.run([job for by_rate in jobs.values() for job in by_rate.values()])
    record = {
        "ran_on": started,
        "wall_seconds": round(time.time() - begin, 1),
        "steps": profile.classify_steps,
        "batch": profile.classify_batch,
        "learning_rate": profile.classify_learning_rate,
        "held_back_reviews": args.hold_out,
        **collect(study, jobs, records, args.head_learning_rates[0]),
    }
    study_run.save(study, "classify_pilot", record)
    return record


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

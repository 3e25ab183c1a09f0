#!/usr/bin/env python
"""Step 3b's decoding settings, chosen on held-back training calls, never on the validation calls the study reports.

    python scripts/experiments/warm-start-real/decoding_pilot.py --profile gpu \
        --work outputs/warm-start-real/gpu-on-cpu --no-repeat-ngram-sizes 0 3 4 6 \
        --runs outputs/warm-start-real/gpu-on-cpu/pilot/<a summarize_pilot.py run>

Each model that `summarize_pilot.py` trained writes the summaries of the calls it held back again, once per
`no_repeat_ngram_size` (greedy decoding, the profile's number of new tokens), through `run_summarization.py` without
training; every set of summaries is scored like the study's rows, and against the recipe's setting call by call
(paired differences of ROUGE-2 and of the figures reproduced). Why it matters: the ECTSum recipe forbids repeated
token trigrams, and a figure is several WordPiece tokens (`$ 0 . 53`), so a second figure that starts as the first did
(`$ 0 .`) could not be written. Writes `<results>/decoding_pilot.json`.
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
from summarize_pilot import PILOT, add_location_arguments, pilot_study  # noqa: E402


def decoding_jobs(
    study: study_run.Study, runs: list[Path], sizes: list[int], calls: Path
) -> dict[str, dict[int, Job]]:
    """One generation of `calls` per trained run and `no_repeat_ngram_size`, each in a folder beside the run; keyed by
    the run's folder name, then by the size."""
    jobs: dict[str, dict[int, Job]] = {}
    for trained in runs:
        config = json.loads((study.absolute(trained) / "config.json").read_text(encoding="utf-8"))
        by_size = jobs.setdefault(trained.name, {})
        for size in sizes:
            output = trained.parent / f"{trained.name}-decode-norepeat{size}"
            command = [
                "scripts/run_summarization.py",
                "--model_name_or_path", str(trained),
                "--validation_file", str(calls),
                "--text_column", "text",
                "--summary_column", "summary",
                "--max_source_length", str(config["max_position_embeddings"]),
                "--max_target_length", str(study.profile.target_length),
                "--generation_max_new_tokens", str(study.profile.new_tokens),
                "--no_repeat_ngram_size", str(size),
                "--predict_with_generate", "true",
                "--per_device_eval_batch_size", str(study.profile.eval_batch),
                "--output_dir", str(output),
                *study.common_flags(),
            ]  # fmt: skip
            by_size[size] = Job(f"decode-{trained.name}-norepeat{size}", command, output)
    return jobs


def per_call(summaries: list[str], references: list[str]) -> dict[str, list[float | None]]:
    """A generation's ROUGE-2 and share of the reference's figures (percent; `None` where the reference has none), call
    by call, for paired comparisons."""
    from attnzoo.training.metrics import extract_numbers, numbers_reproduced, rouge_scores

    pairs = list(zip(summaries, references, strict=True))
    figures = [
        numbers_reproduced([summary], [reference])["numbers_reproduced"] if extract_numbers(reference) else None
        for summary, reference in pairs
    ]
    rouge2 = [rouge_scores([summary], [reference])["rouge2"] for summary, reference in pairs]
    return {"numbers_reproduced": figures, "rouge2": rouge2}


def paired(rows: dict[str, dict[str, list[float | None]]], baseline: str) -> dict[str, dict[str, Any]]:
    """Each row's per-call scores minus the baseline row's: mean, standard error and the calls ahead and behind."""
    from attnzoo.evaluation.seeds import PairedDifference

    result = {}
    for name, scores in rows.items():
        if name == baseline:
            continue
        result[name] = {}
        for metric, values in scores.items():
            pairs = [(a, b) for a, b in zip(values, rows[baseline][metric], strict=True) if a is not None]
            difference = PairedDifference(tuple(range(len(pairs))), tuple(a - b for a, b in pairs))
            result[name][metric] = {
                # JSON has no NaN: no call to compare (no reference states a figure), or one (no spread).
                "mean": difference.mean if pairs else None,
                "standard_error": difference.standard_error if len(pairs) > 1 else None,
                "ahead": difference.ahead,
                "behind": difference.behind,
                "calls": len(pairs),
            }
    return result


def collect(
    study: study_run.Study, jobs: dict[str, dict[int, Job]], records: dict[str, Any], calls: Path, baseline: int
) -> dict[str, Any]:
    """Each generation scored like the study's rows, with two summaries beside their references, each run's settings
    against its `baseline` setting, call by call, and the lead and the extractive oracle on the same calls."""
    references = study_run.read_jsonl(study.absolute(calls))
    rows, comparisons = {}, {}
    for run, by_size in jobs.items():
        calls_scores = {}
        for job in by_size.values():
            row = dict(records.get(job.name, {}))
            summaries = study_run.read_predictions(study, job.output)
            scored = study_run.scored_run(study, job.output, references, examples=2, predictions=summaries)
            if scored is not None:
                row.update(
                    scores=scored["scores"],
                    different_summaries=scored["different_summaries"],
                    examples=scored["examples"],
                )
                calls_scores[job.name] = per_call(summaries, [call["summary"] for call in references])
            rows[job.name] = row
        if by_size[baseline].name in calls_scores:
            comparisons[run] = paired(calls_scores, by_size[baseline].name)
    # The lead and the oracle on the same calls: what a model's scores on them compare with (the lead's length chosen
    # on every training call, these included, as for the study's rows).
    reference_points = study_run.extractive_baselines(study, references)
    return {
        "held_back_calls": len(references),
        "baseline_size": baseline,
        "rows": rows,
        "paired": comparisons,
        **reference_points,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=study_run.DEFAULT_SOURCE, help="the runs' source checkpoint (recorded)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu", help="new tokens, batch, threads")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="folders of summarize_pilot.py runs")
    parser.add_argument("--no-repeat-ngram-sizes", type=int, nargs="+", default=[0, 3], help="0: no constraint")
    parser.add_argument("--jobs", type=int, default=1, help="generations at once")
    parser.add_argument(
        "--baseline-size", type=int, help="the size compared against, call by call (default: the recipe's)"
    )
    add_location_arguments(parser)
    args = parser.parse_args(argv)
    if any(size < 0 for size in args.no_repeat_ngram_sizes):
        parser.error("--no-repeat-ngram-sizes must be 0 (no constraint) or positive")
    profile = dataclasses.replace(PROFILES[args.profile], families=("dense_transformer",), parallel=args.jobs)
    study = pilot_study(args, profile)
    calls = study.work / PILOT / "data" / "tune.jsonl"
    for trained in args.runs:
        if not (study.absolute(trained) / "config.json").is_file():
            parser.error(f"{trained} holds no trained model (no config.json): give summarize_pilot.py run folders")
    if not study.absolute(calls).is_file():
        parser.error(f"{calls} is missing: run summarize_pilot.py with the same --profile and --work first")
    from attnzoo.training.arguments import read_recipe

    baseline = args.baseline_size
    if baseline is None:
        baseline = read_recipe(study_run.ECTSUM_RECIPE).get("no_repeat_ngram_size", 0)
    if baseline not in args.no_repeat_ngram_sizes:
        parser.error(f"the baseline size {baseline} is not among --no-repeat-ngram-sizes: nothing to compare with")
    started = study_run.ran_on(study)
    jobs = decoding_jobs(study, args.runs, args.no_repeat_ngram_sizes, calls)
    begin = time.time()
    records = study.run([job for by_size in jobs.values() for job in by_size.values()])
    scores = collect(study, jobs, records, calls, baseline)
    record = {"ran_on": started, "wall_seconds": round(time.time() - begin, 1), **scores}
    study_run.save(study, "decoding_pilot", record)
    return record


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

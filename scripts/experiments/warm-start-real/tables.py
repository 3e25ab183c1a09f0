"""The tables of a results folder (`<results>/README.md`), rendered from its step records (`convert.json`, ...).

A step that has not run leaves its table out; a row whose program did not finish shows its status instead of numbers.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

TABLES_FILE = "README.md"


def _load(folder: Path, step: str) -> dict[str, Any]:
    path = folder / f"{step}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _number(value: float | None, digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _cost(record: dict[str, Any]) -> str:
    cost = record.get("cost")
    if not cost:
        return "– | –"
    return f"{_number(cost['seconds_per_step'], 3)} | {_number(cost['tokens_per_second'], 0)}"


def _status(record: dict[str, Any]) -> str:
    return record.get("status") or "not run"


def _ran_on(record: dict[str, Any]) -> str:
    ran = record.get("ran_on", {})
    return f"commit `{ran.get('commit', '?')[:7]}`, {ran.get('device', '?')}, profile `{ran.get('profile', '?')}`"


def convert_table(convert: dict[str, Any]) -> list[str]:
    lines = ["## Step 1: conversion", "", f"Ran on {_ran_on(convert)}.", ""]
    lines += ["| model | saved class | new tensors | new parameters |", "|---|---|---|---|"]
    for name, record in convert.items():
        if isinstance(record, dict) and "target_class" in record:
            row = f"| {name} | {record['target_class']} | {record['new_tensors']} | {record['new_parameters']:,} |"
            lines.append(row)
        elif isinstance(record, dict) and "command" in record:
            lines.append(f"| {name} | {_status(record)} | – | – |")
    check = convert.get("dense_matches_source")
    if check:
        lines += [
            "",
            f"Dense conversion at the source's length against the source on {check['reviews']} reviews: last hidden "
            f"states differ by at most {check['hidden_states_max_abs_difference']:.2g}, the pooled output by "
            f"{check['pooled_max_abs_difference']:.2g}.",
        ]
    return lines


def mlm_table(mlm: dict[str, Any]) -> list[str]:
    lines = ["## Step 2: continued masked-LM pretraining", "", f"Ran on {_ran_on(mlm)}.", ""]
    lines += [
        "| model | held-back blocks x tokens | MLM loss before → after | accuracy after | s / step | tokens / s |",
        "|---|---|---|---|---|---|",
    ]
    for name, record in mlm.items():
        if not isinstance(record, dict) or "command" not in record:
            continue
        curve = record.get("eval_loss") or []
        if len(curve) >= 2:
            loss = f"{curve[0][1]:.3f} → {curve[-1][1]:.3f}"
            blocks = f"{record.get('eval_blocks')} x {name.rsplit('-', 1)[1]}"
            accuracy = _number(100 * record["eval_accuracy"]) if record.get("eval_accuracy") is not None else "–"
            lines.append(f"| {name} | {blocks} | {loss} | {accuracy} | {_cost(record)} |")
        else:
            lines.append(f"| {name} | – | {_status(record)} | – | – | – |")
    return lines


def _mean_sd(accuracies: dict[str, float]) -> str:
    values = [100 * v for v in accuracies.values()]
    if not values:
        return "–"
    return f"{statistics.fmean(values):.1f}" + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else "")


def classify_table(classify: dict[str, Any], seeds: list[str], imdb: dict[str, Any]) -> list[str]:
    split = f" ({imdb['train']:,} training / {imdb['validation']:,} held-back reviews)" if imdb else ""
    lines = [f"## Step 3a: IMDB{split}", "", f"Ran on {_ran_on(classify)}.", ""]
    lines += [
        f"| row | length | {' | '.join(f'seed {s}' for s in seeds)} | mean ± SD | s / step (seed {seeds[0]}) "
        "| tokens / s |",
        f"|---|---|{'---|' * len(seeds)}---|---|---|",
    ]
    for name, row in classify.get("rows", {}).items():
        cells = [
            _number(100 * row["accuracy"][s]) if s in row["accuracy"] else _status(row["runs"].get(s, {}))
            for s in seeds
        ]
        first = row["runs"].get(seeds[0], {})
        lines.append(
            f"| {name} | {row['length']} | {' | '.join(cells)} | {_mean_sd(row['accuracy'])} | {_cost(first)} |"
        )
    if classify.get("paired"):
        lines += ["", "Paired differences (points, mean ± standard error over the seeds both rows ran):", ""]
        lines += ["| row | against | Δ | seeds ahead |", "|---|---|---|---|"]
        for item in classify["paired"]:
            error = item["standard_error"]
            spread = "" if error is None or math.isnan(error) else f" ± {100 * error:.1f}"
            lines.append(
                f"| {item['row']} | {item['baseline']} | {100 * item['mean']:+.1f}{spread} | "
                f"{item['ahead']} of {len(item['seeds'])} |"
            )
    return lines


def _scores(scores: dict[str, float]) -> str:
    rouge = " / ".join(_number(scores[key]) for key in ("rouge1", "rouge2", "rougeL"))
    # No figures in any reference scored (a subset of calls): the share is undefined and left out of the scores.
    return f"{rouge} | {_number(scores.get('numbers_reproduced'))} | {_number(scores['distinct_2grams'])}"


def _steps(record: dict[str, Any]) -> str:
    """The optimizer steps a row trained, marked when its time limit stopped it before its budget."""
    steps = record.get("steps_trained")
    return "–" if steps is None else f"{steps} (time limit)" if record.get("time_limited") else str(steps)


def summarize_table(summarize: dict[str, Any]) -> list[str]:
    calls = summarize.get("validation_calls")
    lines = ["## Step 3b: ECTSum validation calls", "", f"Ran on {_ran_on(summarize)}; {calls} calls scored.", ""]
    lines += [
        "| row | ROUGE-1 / 2 / L | figures reproduced (%) | distinct bigrams (%) | different summaries | steps "
        "| s / step | tokens / s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, record in summarize.get("rows", {}).items():
        if "scores" in record:
            different = f"{record['different_summaries']} of {calls} | {_steps(record)}"
            lines.append(f"| {name} | {_scores(record['scores'])} | {different} | {_cost(record)} |")
        else:
            lines.append(f"| {name} | {_status(record)} | – | – | – | – | – | – |")
    lines += _baseline_rows(summarize, " – | – | – | – |")
    examples = {name: record.get("examples", []) for name, record in summarize.get("rows", {}).items()}
    shown = next((items for items in examples.values() if items), [])
    for index, example in enumerate(shown):
        lines += [
            "",
            f"### {example['id']}",
            "",
            "Reference:",
            "",
            *(f"> {b}" for b in example["reference"].split("\n")),
        ]
        for name, items in examples.items():
            if index < len(items):
                lines += ["", f"{name}: {items[index]['summary']}"]
    return lines


def _baseline_rows(record: dict[str, Any], tail: str = "") -> list[str]:
    """The lead and oracle rows of a record that holds them; `tail` fills the columns they have no value for."""
    rows = []
    lead, oracle = record.get("lead"), record.get("oracle")
    if lead:
        name = f"lead-{lead['sentences']} (first sentences; how many chosen on the training calls)"
        rows.append(f"| {name} | {_scores(lead['scores'])} |{tail}")
    if oracle:
        rows.append(f"| extractive oracle (upper bound) | {_scores(oracle['scores'])} |{tail}")
    return rows


def baselines_table(baselines: dict[str, Any]) -> list[str]:
    calls = baselines.get("validation_calls")
    lines = ["## Step 3b's reference points (no model)", "", f"Ran on {_ran_on(baselines)}; {calls} calls scored.", ""]
    lines += ["| row | ROUGE-1 / 2 / L | figures reproduced (%) | distinct bigrams (%) |", "|---|---|---|---|"]
    return lines + _baseline_rows(baselines)


def jobs_table(summary: dict[str, Any]) -> list[str]:
    jobs = summary.get("jobs", {})
    counts: dict[str, int] = {}
    for record in jobs.values():
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    lines = ["## The run", "", f"Ran on {_ran_on(summary)} in {summary.get('wall_seconds')} s: "]
    lines[-1] += ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + "."
    missing = [name for name, record in jobs.items() if record["status"] not in ("done", "reused")]
    if missing:
        lines += ["", "Not finished: " + ", ".join(f"`{name}` ({jobs[name]['status']})" for name in missing) + "."]
    return lines


def write_tables(folder: Path) -> str:
    """Render `folder`'s step records into `folder/README.md`; returns the text."""
    parts = ["# Warm start from a real checkpoint: results", "", "Written by `run.py table` from the step records."]
    summary = _load(folder, "all")
    if summary:
        parts += ["", *jobs_table(summary)]
    convert, mlm, classify, summarize = (_load(folder, step) for step in ("convert", "mlm", "classify", "summarize"))
    if convert:
        parts += ["", *convert_table(convert)]
    if mlm:
        parts += ["", *mlm_table(mlm)]
    if classify:
        seeds = sorted({s for row in classify.get("rows", {}).values() for s in row["runs"]}, key=int)
        parts += ["", *classify_table(classify, seeds, _load(folder, "data").get("imdb", {}))]
    if summarize:
        parts += ["", *summarize_table(summarize)]
    baselines = _load(folder, "baselines")
    if baselines:
        parts += ["", *baselines_table(baselines)]
    text = "\n".join(parts) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TABLES_FILE).write_text(text, encoding="utf-8")
    return text

"""Results of a long-input evaluation: `long_eval.json` (every run), `long_eval.md` (tables) and `long_eval.png`."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:  # POSIX; elsewhere processes must not share a folder (the lock is then a no-op)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

TASK_TITLES = {
    "imdb": "IMDB (WordPiece tokens)",
    "text": "LRA Text (IMDB as bytes)",
    "listops": "LRA ListOps",
}


def load_results(path: Path) -> dict[str, Any]:
    """The results file, or an empty one (the runner appends to it run by run so that it can resume)."""
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"runs": []}


def save_results(path: Path, results: dict[str, Any]) -> None:
    """Replace `path` atomically. The temporary file is this writer's own, so that writers sharing the folder never
    move each other's half-written files into place (hold [`results_lock`] to merge with what another wrote)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(json.dumps(results, indent=1) + "\n")
        os.replace(tmp, path)  # never leave a half-written file behind an interrupted run
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def results_lock(path: Path) -> Iterator[None]:
    """Exclusive lock on the results file `path` (a lock file beside it) across the processes sharing its folder, for
    a read-check-merge-write of the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a", encoding="utf-8") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _baseline(runs: list[dict[str, Any]], length: int | None) -> dict[str, Any] | None:
    """The dense family's plain run (no overrides) at `length`."""
    for run in runs:
        if run["model_type"] == "dense_transformer" and not run["overrides"] and run["length"] == length:
            return run
    return None


def markdown_report(results: dict[str, Any]) -> str:
    """One table per task: accuracy per row and length, training time and tokens/s, and the difference to dense."""
    lines = ["# attnzoo long-input evaluation", ""]
    for key, value in results.get("settings", {}).items():
        lines.append(f"- {key}: {value}")
    lines.append("")
    for task in TASK_TITLES:
        runs = [r for r in results["runs"] if r["task"] == task]
        if not runs:
            continue
        lines += [f"## {TASK_TITLES[task]}", ""]
        for length, info in sorted(results.get("task_info", {}).get(task, {}).items(), key=lambda kv: int(kv[0])):
            lines.append(f"- data at length {length}: " + ", ".join(f"{k}: {v}" for k, v in info.items()))
        lines.append("")
        lengths = sorted({r["length"] for r in runs})
        dense_short = _baseline(runs, lengths[0])
        lines += [
            "| model | length | accuracy (%) | Δ vs dense@" + str(lengths[0]) + " | validation loss | train time (s) "
            "| train tokens/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for run in sorted(runs, key=lambda r: (r["label"], r["length"])):
            delta = "–" if dense_short is None else f"{100 * (run['accuracy'] - dense_short['accuracy']):+.1f}"
            seconds = f"{run['train_seconds']:.0f}"
            if "pretrain_seconds" in run:  # self-pretraining first: its time is part of the run's cost
                seconds = f"{run['pretrain_seconds']:.0f} pretraining + {seconds}"
            lines.append(
                f"| {run['label']} | {run['length']} | {100 * run['accuracy']:.1f} | {delta} | "
                f"{run['validation_loss']:.3f} | {seconds} | {run['train_tokens_per_second']:.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_report(results: dict[str, Any], path: Path) -> bool:
    """Accuracy against input length, one panel per task and one line per row label. `False` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tasks = [t for t in TASK_TITLES if any(r["task"] == t for r in results["runs"])]
    if not tasks:
        return False
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.6), squeeze=False)
    # Ablation rows make a dozen lines: a 20-colour cycle keeps them apart, and each legend goes below its panel.
    colours = plt.get_cmap("tab20").colors
    for ax, task in zip(axes[0], tasks, strict=True):
        runs = [r for r in results["runs"] if r["task"] == task]
        for index, label in enumerate(sorted({r["label"] for r in runs})):
            points = sorted((r["length"], 100 * r["accuracy"]) for r in runs if r["label"] == label)
            xs, ys = zip(*points, strict=True)
            style = "--" if label.startswith("dense_transformer") else "-"
            ax.plot(xs, ys, style, marker="o", color=colours[index % len(colours)], label=label)
        low, high = ax.get_ylim()
        if high - low < 10:  # a few tenths of a point must not look like a trend
            middle = (low + high) / 2
            ax.set_ylim(middle - 5, middle + 5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel("validation accuracy (%)")
        ax.set_title(TASK_TITLES[task])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


def write_reports(output_dir: Path, results: dict[str, Any]) -> None:
    """`long_eval.md` and (with matplotlib) `long_eval.png` beside `long_eval.json`."""
    (output_dir / "long_eval.md").write_text(markdown_report(results), encoding="utf-8")
    plot_report(results, output_dir / "long_eval.png")

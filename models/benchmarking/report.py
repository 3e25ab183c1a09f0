"""The reports of a benchmark: `benchmark.json`, a Markdown table per level and a log-log plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .settings import LEVELS, MODES, REFERENCE_MODEL


def _short_commit(machine: dict[str, Any]) -> str:
    return (machine["git_commit"] or "?")[:10]


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"


def _fmt_ratio(mode: dict[str, Any] | None) -> str:
    if not mode or mode.get("ratio") is None:
        return "–"
    low, high = mode["ratio_iqr"]
    text = f"{mode['ratio']:.2f} [{low:.2f}–{high:.2f}]"
    if mode.get("runs_agree") is False:
        text += " ⚠runs"
    return text


def markdown_report(report: dict[str, Any]) -> str:
    """A Markdown table per level: per length and model, times, ratios to dense (median [IQR]) and memory."""
    machine, settings = report["machine"], report["settings"]
    size = settings["size"]
    lines = [
        "# attnzoo benchmark",
        "",
        f"- machine: {machine['cpu_model']} ({machine['cpu_count']} cores), device {machine['device']}"
        + (f" ({machine['gpu']['name']})" if machine.get("gpu") else "")
        + f", {machine['dtype']}, {machine['threads']} thread(s)",
        f"- torch {machine['torch']}, transformers {machine['transformers']}, attnzoo {machine['attnzoo']}, "
        f"commit {_short_commit(machine)}{' (dirty)' if machine['git_dirty'] else ''}",
        f"- {machine['date_start']} → {machine['date_end']}; loadavg {machine['loadavg_start']} → "
        f"{machine['loadavg_end']}" + (" **(load above the core count: noisy)**" if machine["load_warning"] else ""),
        f"- size: {size['num_hidden_layers']} layers, hidden {size['hidden_size']}, "
        f"{size['num_attention_heads']} heads, FFN {size['intermediate_size']}, vocab {size['vocab_size']}; "
        f"batch {settings['batch_size']}; {settings['rounds']} rounds after {settings['warmup']} warm-up; "
        f"{settings['runs']} run(s)",
        f"- ratios: median over rounds of (model time / `{report['reference']}` time in the same round) [IQR]; "
        "memory: peak above the pre-step baseline; saved: bytes autograd keeps for backward; density: attended "
        "fraction of (query, key) pairs (eval mode)",
        "",
    ]
    warnings = [f"- not benchmarked: **{name}** ({error})" for name, error in report.get("unavailable", {}).items()]
    failed = [m for m in report["models"] if m["equivalence"] is not None and not m["equivalence"]["passed"]]
    for model in failed:
        detail = model["equivalence"].get("error") or (
            f"output error {model['equivalence']['output_error']:.2g}, "
            f"gradient error {model['equivalence']['grad_error']:.2g} (× tolerance)"
        )
        warnings.append(f"- ⚠ **{model['name']}: fast path ≠ reference path** ({detail}); its ratios are marked †")
    if warnings:
        lines += [*warnings, ""]
    failed_names = {m["name"] for m in failed}
    for level in LEVELS:
        level_results = [r for r in report["results"] if r["level"] == level]
        if not level_results:
            continue
        lines += [
            f"## {'whole model' if level == 'model' else 'one encoder layer'}",
            "",
            "| N | model | fwd ms | fwd+bwd ms | fwd × dense | fwd+bwd × dense | peak MB fwd+bwd | mem × dense "
            "| saved MB | density | notes |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in level_results:
            mark = " †" if r["model"] in failed_names else ""
            notes = "; ".join(r["notes"]) if r["status"] == "ok" else "; ".join([r["status"], *r["notes"]])
            memory = r.get("memory") or {}
            lines.append(
                f"| {r['length']} | {r['model']}{mark} | {_fmt((r.get('fwd') or {}).get('ms'), 1)} "
                f"| {_fmt((r.get('fwd_bwd') or {}).get('ms'), 1)} | {_fmt_ratio(r.get('fwd'))} "
                f"| {_fmt_ratio(r.get('fwd_bwd'))} | {_fmt(memory.get('fwd_bwd_mb'), 1)} "
                f"| {_fmt(memory.get('fwd_bwd_ratio'))} | {_fmt(r.get('saved_for_backward_mb'), 1)} "
                f"| {_fmt(r.get('attention_density'), 3)} | {notes} |"
            )
        lines.append("")
        if len({r["length"] for r in level_results}) > 1:
            lines += [
                f"### {'whole model' if level == 'model' else 'one encoder layer'}: forward+backward time × dense",
                "",
                *crossover_markdown(report, level),
                "",
            ]
    return "\n".join(lines)


def crossover_table(report: dict[str, Any], level: str = "model", mode: str = "fwd_bwd") -> dict[str, dict[str, Any]]:
    """Per row, its time ratio to dense at every length, and the crossover length: the shortest measured `N` from
    which on the row is faster than dense (ratio < 1) at every longer length where it ran.

    Returns `{row: {"ratios": {N: ratio or None}, "crossover": N or None, "faster_at_longest": bool or None}}`;
    `crossover` is `None` when the row is not faster at the longest length it ran (or ran nowhere). A length where
    the row did not run (out of memory, too slow, time budget) has ratio `None` and does not break the run of faster
    lengths.
    """
    lengths = sorted({r["length"] for r in report["results"] if r["level"] == level})
    table: dict[str, dict[str, Any]] = {}
    for result in report["results"]:
        if result["level"] != level or result["model"] == REFERENCE_MODEL:
            continue
        row = table.setdefault(result["model"], {"ratios": dict.fromkeys(lengths)})
        timing = result.get(mode) if result["status"] == "ok" else None
        row["ratios"][result["length"]] = timing.get("ratio") if timing else None
    for row in table.values():
        measured = [(n, ratio) for n, ratio in row["ratios"].items() if ratio is not None]
        crossover = None
        for n, ratio in reversed(measured):
            if ratio >= 1.0:
                break
            crossover = n
        row["crossover"] = crossover
        row["faster_at_longest"] = measured[-1][1] < 1.0 if measured else None
    return table


def crossover_markdown(report: dict[str, Any], level: str = "model") -> list[str]:
    """The forward+backward ratio to dense of every row at every length, and the crossover length (Markdown)."""
    table = crossover_table(report, level)
    lengths = sorted({r["length"] for r in report["results"] if r["level"] == level})
    lines = [
        "| model | " + " | ".join(f"N = {n}" for n in lengths) + " | faster than dense from |",
        "|---|" + "---|" * (len(lengths) + 1),
    ]
    for name, row in table.items():
        cells = [_fmt(row["ratios"][n]) for n in lengths]
        crossover = f"N = {row['crossover']}" if row["crossover"] is not None else "not within the lengths run"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {crossover} |")
    return lines


def plot_report(report: dict[str, Any], path: str | Path) -> bool:
    """Log-log plot of time (fwd, fwd+bwd) and memory against N per model, dense family in bold black.

    Returns `False` (and writes nothing) when matplotlib is not installed (it is the optional `plots` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    levels = [level for level in LEVELS if any(r["level"] == level for r in report["results"])]
    memory_key = "memory"
    if not any(r.get("memory") for r in report["results"]):
        memory_key = "saved"  # without a peak measurement the saved-for-backward bytes are the memory proxy
    columns = [("fwd", "forward ms"), ("fwd_bwd", "forward+backward ms"), (memory_key, "peak MB (fwd+bwd)")]
    if memory_key == "saved":
        columns[2] = ("saved", "saved for backward MB")
    figure, axes = plt.subplots(len(levels), 3, figsize=(16, 4.8 * len(levels)), squeeze=False)
    names = list(dict.fromkeys(r["model"] for r in report["results"]))
    for row_index, level in enumerate(levels):
        for column_index, (key, title) in enumerate(columns):
            axis = axes[row_index][column_index]
            for name in names:
                points = []
                for r in report["results"]:
                    if r["model"] != name or r["level"] != level or r["status"] != "ok":
                        continue
                    if key in MODES:
                        value = r[key]["ms"]
                    elif key == "memory":
                        value = (r.get("memory") or {}).get("fwd_bwd_mb")
                    else:
                        value = r.get("saved_for_backward_mb")
                    if value is not None and value > 0:
                        points.append((r["length"], value))
                if not points:
                    continue
                points.sort()
                style = {"color": "black", "linewidth": 2.5, "zorder": 3} if name == REFERENCE_MODEL else {}
                linestyle = "--" if name.startswith("hf:") else "-"
                axis.plot(*zip(*points, strict=True), marker="o", linestyle=linestyle, label=name, **style)
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("sequence length N")
            axis.set_title(f"{'model' if level == 'model' else 'one layer'}: {title}")
            axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6) or 1)
    machine = report["machine"]
    figure.suptitle(
        f"attnzoo benchmark — {machine['device']} {machine['dtype']}, {machine['threads']} thread(s), "
        f"commit {_short_commit(machine)}"
    )
    figure.tight_layout(rect=(0, 0.06, 1, 0.96))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def write_reports(report: dict[str, Any], output_dir: str | Path) -> dict[str, Path | None]:
    """Write `benchmark.json`, `benchmark.md` and (with matplotlib) `benchmark.png` into `output_dir`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path | None] = {
        "json": output_dir / "benchmark.json",
        "markdown": output_dir / "benchmark.md",
        "plot": output_dir / "benchmark.png",
    }
    paths["json"].write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    paths["markdown"].write_text(markdown_report(report) + "\n")
    if not plot_report(report, paths["plot"]):
        paths["plot"] = None
    return paths

"""Merge the raw per-round data of one or more timing sweeps and the memory measurements into the results."""

from __future__ import annotations

import statistics
from typing import Any

from .settings import LEVELS, MODES, REFERENCE_MODEL, BenchmarkSettings

# Two runs whose median ratios differ by more than this factor are flagged (performance.md §5.3).
RUN_AGREEMENT = 1.15


def summarize(values: list[float]) -> tuple[float, list[float]]:
    """Median and inter-quartile range `[q1, q3]` (a single value is its own range)."""
    if len(values) == 1:
        return values[0], [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), [q1, q3]


def _aggregate_mode(runs: list[dict[str, Any]], mode: str, tokens: int) -> dict[str, Any]:
    times = [t for run in runs for t in run.get("times_s", {}).get(mode, [])]
    ratios = [r for run in runs for r in run.get("ratios", {}).get(mode, [])]
    median_s, iqr_s = summarize(times)
    result: dict[str, Any] = {
        "ms": median_s * 1e3,
        "ms_iqr": [t * 1e3 for t in iqr_s],
        "tokens_per_s": tokens / median_s if median_s > 0 else None,
        "rounds": len(times),
        "ratio": None,
        "ratio_iqr": None,
        "run_ratios": [],
        "runs_agree": None,
    }
    if ratios:
        result["ratio"], result["ratio_iqr"] = summarize(ratios)
        run_medians = [statistics.median(run["ratios"][mode]) for run in runs if run.get("ratios")]
        result["run_ratios"] = run_medians
        result["runs_agree"] = max(run_medians) <= RUN_AGREEMENT * min(run_medians) if len(run_medians) > 1 else None
    return result


def aggregate(
    sweeps: list[dict[str, Any]],
    memory: dict[tuple[str, int], Any],
    settings: BenchmarkSettings,
) -> list[dict[str, Any]]:
    """Merge the runs' raw entries into one result per (model, level, length), with ratios to the dense family."""
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for sweep in sweeps:
        for entry in sweep["entries"]:
            grouped.setdefault((entry["model"], entry["level"], entry["length"]), []).append(entry)
    results = []
    for (name, level, length), runs in grouped.items():
        ok = [run for run in runs if run["status"] == "ok"]
        notes = sorted({note for run in runs for note in run["notes"]})
        failed = [run["status"] for run in runs if run["status"] != "ok"]
        if ok and failed:
            notes.append(f"{len(failed)} of {len(runs)} runs failed: {failed[0]}")
        result: dict[str, Any] = {
            "model": name,
            "level": level,
            "length": length,
            "status": "ok" if ok else runs[0]["status"],
            "notes": notes,
            "attention_density": ok[0].get("attention_density") if ok else None,
            "saved_for_backward_mb": None,
            "parameters_mb": None,
            "memory": None,
        }
        if ok:
            tokens = settings.batch_size * length
            for mode in MODES:
                result[mode] = _aggregate_mode(ok, mode, tokens)
            saved = [run["saved_bytes"] for run in ok if run.get("saved_bytes") is not None]
            result["saved_for_backward_mb"] = saved[0] / 2**20 if saved else None
            result["parameters_mb"] = ok[0].get("parameters_bytes", 0) / 2**20
            result["loadavg"] = [run.get("loadavg") for run in runs]
            cuda = [run["cuda_peak_bytes"] for run in ok if run.get("cuda_peak_bytes")]
            cpu = memory.get((name, length))
            if cuda:
                peaks = {mode: statistics.median(c[mode] for c in cuda) for mode in MODES}
                result["memory"] = _memory_result("cuda_max_memory_allocated", peaks)
            elif isinstance(cpu, dict) and level in cpu:
                result["memory"] = _memory_result("cpu_vmhwm", cpu[level])
            elif isinstance(cpu, str):
                result["notes"].append(f"memory worker {cpu}")
        results.append(result)
    by_key = {(r["model"], r["level"], r["length"]): r for r in results}
    for result in results:
        reference = by_key.get((REFERENCE_MODEL, result["level"], result["length"]))
        result["saved_ratio"] = _ratio(result.get("saved_for_backward_mb"), reference, "saved_for_backward_mb")
        if result["memory"] is not None:
            ref_memory = reference.get("memory") if reference else None
            for mode in MODES:
                result["memory"][f"{mode}_ratio"] = _ratio(result["memory"][f"{mode}_mb"], ref_memory, f"{mode}_mb")
    results.sort(key=lambda r: (LEVELS.index(r["level"]), r["length"], r["model"] != REFERENCE_MODEL))
    return results


def _memory_result(method: str, peak_bytes: dict[str, float]) -> dict[str, Any]:
    """The `memory` entry of a result: how it was measured and the peak per mode in MB."""
    return {"method": method, **{f"{mode}_mb": peak_bytes[mode] / 2**20 for mode in MODES}}


def _ratio(value: float | None, reference: dict[str, Any] | None, key: str) -> float | None:
    denominator = reference.get(key) if reference else None
    if value is None or not denominator or denominator <= 0:
        return None
    return value / denominator

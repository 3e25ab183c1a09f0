"""Time: one step on CPU or CUDA, interleaved round-robin rounds, and one whole timing sweep (one process)."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .machine import apply_threads, loadavg
from .memory import in_process_memory
from .rows import BenchModel, benchmark_models
from .settings import MODES, REFERENCE_MODEL, BenchmarkSettings
from .workload import Workload, short_error


def timed(step: Callable[[], None], device: str) -> float:
    """Seconds of one call: CUDA events around it (after draining the queue) or `perf_counter` on CPU."""
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    start_time = time.perf_counter()
    step()
    return time.perf_counter() - start_time


def release_cached_memory(device: str) -> None:
    """Hand the CUDA allocator's cached blocks back. After a sticky CUDA error (an illegal address, a device-side
    assert) every CUDA call raises again; that must not end the sweep, whose earlier lengths are results (the
    workloads still to run record the error)."""
    if device == "cuda":
        with contextlib.suppress(RuntimeError):
            torch.cuda.empty_cache()


Task = tuple[tuple[str, str], str]  # ((model, level), mode)
#: The clock of the benchmark's time budget (a module attribute, so that tests can replace it).
_clock = time.monotonic


def clock() -> float:
    """Seconds on the clock of the benchmark's time budget."""
    return _clock()


def time_interleaved(
    workloads: dict[tuple[str, str], Workload], settings: BenchmarkSettings
) -> tuple[dict[Task, list[float]], dict[Task, float], dict[tuple[str, str], str]]:
    """Warm up every (workload, mode), then time them in `settings.rounds` round-robin rounds.

    Round `r` starts at task `r mod T`, which spreads "first after a pause" effects (caches, clock frequency) over
    all models. Returns per-task times (one per round), the slowest warm-up step per task, and the error of every
    workload that raised (e.g. out of memory); a failed workload is dropped from the remaining rounds.
    """
    tasks: list[Task] = [(key, mode) for key in workloads for mode in MODES]
    times: dict[Task, list[float]] = {task: [] for task in tasks}
    warm: dict[Task, float] = {}
    failed: dict[tuple[str, str], str] = {}

    def run(task: Task) -> float | None:
        key, mode = task
        if key in failed:
            return None
        workload = workloads[key]
        try:
            workload.prepare(mode)
            return timed(lambda: workload.step(mode), settings.device)
        except Exception as err:  # noqa: BLE001 - e.g. out of memory at this length; the others go on
            failed[key] = short_error(err)
            release_cached_memory(settings.device)
            return None

    for task in tasks:
        for _ in range(settings.warmup):
            seconds = run(task)
            if seconds is not None:
                warm[task] = max(warm.get(task, 0.0), seconds)
    # A garbage collection inside a timed step would charge one model for everybody's garbage (as timeit does).
    gc.collect()
    gc.disable()
    try:
        for round_index in range(settings.rounds):
            shift = round_index % max(len(tasks), 1)
            for task in tasks[shift:] + tasks[:shift]:
                seconds = run(task)
                if seconds is not None:
                    times[task].append(seconds)
    finally:
        gc.enable()
    return times, warm, failed


def timing_sweep(settings: BenchmarkSettings, log: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Time every (model, level, mode) at every length in interleaved rounds; raw per-round data, JSON-able.

    All models of one length live in this process together (fresh instances per length: HF BigBird switches itself
    to full attention for short inputs, and position tables follow the length). Returns
    `{"loadavg_start", "loadavg_end", "entries": [...], "interrupted"}` (`interrupted`: Ctrl-C ended the sweep; the
    lengths not measured have the status `"skipped: interrupted"`); an entry has `model`, `level`, `length`,
    `status`, `notes`, `loadavg`, `warmup_s`, `times_s` and `ratios` (per mode, one value per round), `saved_bytes`,
    `cuda_peak_bytes`, `parameters_bytes` and `attention_density`.
    """
    apply_threads(settings)
    # Load failures are reported by the parent process, which built the same rows.
    rows = benchmark_models(settings.families, settings.hf_baselines, errors={}, keep=settings.rows)
    start_load = loadavg()
    too_slow: set[tuple[str, str]] = set()
    entries: list[dict[str, Any]] = []
    deadline = None if settings.time_budget_s is None else _clock() + settings.time_budget_s
    pace = 0.0  # seconds per token of the previous length
    done: set[int] = set()

    def active(length: int) -> list[BenchModel]:
        return [row for row in rows if length in settings.lengths or row.kind != "hf"]

    try:
        for length in settings.all_lengths:
            length_start = _clock()
            # The first length always runs: a result at the shortest length beats none.
            if deadline is not None and done and length_start + pace * length > deadline:
                log(f"N={length}: skipped, the time budget ({settings.time_budget_s:.0f} s) leaves no room for it")
                entries += _skipped(active(length), length, settings, "skipped: time budget")
            else:
                entries += _length_entries(active(length), length, settings, too_slow, log)
                pace = (_clock() - length_start) / length
            done.add(length)
    except KeyboardInterrupt:
        # Ctrl-C, or `timeout -s INT` ahead of a hard time limit: the lengths measured so far are results and are
        # reported; the one in progress and the rest are marked.
        log("interrupted: the lengths measured so far are reported")
        for length in settings.all_lengths:
            if length not in done:
                entries += _skipped(active(length), length, settings, "skipped: interrupted")
    interrupted = len(done) < len(settings.all_lengths)
    return {"loadavg_start": start_load, "loadavg_end": loadavg(), "entries": entries, "interrupted": interrupted}


def _skipped(rows: list[BenchModel], length: int, settings: BenchmarkSettings, status: str) -> list[dict[str, Any]]:
    """The entries of rows not run at `length`, with the reason as their status."""
    return [
        {"model": row.name, "level": level, "length": length, "status": status, "notes": []}
        for row in rows
        for level in settings.levels
    ]


def _length_entries(
    rows: list[BenchModel],
    length: int,
    settings: BenchmarkSettings,
    too_slow: set[tuple[str, str]],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Every (row, level) at one length: built, timed in interleaved rounds, its memory measured, then released.
    Adds the rows whose step exceeds `settings.max_seconds_per_step` to `too_slow` (skipped at longer lengths)."""
    workloads: dict[tuple[str, str], Workload] = {}
    length_entries: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for row in rows:
            for level in settings.levels:
                key = (row.name, level)
                entry = {"model": row.name, "level": level, "length": length, "status": "ok", "notes": []}
                length_entries[key] = entry
                if key in too_slow:
                    entry["status"] = "skipped: too slow"
                    continue
                try:
                    workloads[key] = Workload(row, level, length, settings)
                except Exception as err:  # noqa: BLE001 - record and keep benchmarking the other models
                    entry["status"] = short_error(err)
                    continue
                entry["notes"] += workloads[key].notes
                entry["attention_density"] = workloads[key].density
                entry["parameters_bytes"] = workloads[key].parameters_bytes()
        length_load = loadavg()
        log(f"N={length}: timing {len(workloads)} workloads x {len(MODES)} modes, loadavg {length_load}")
        times, warm, failed = time_interleaved(workloads, settings)
        for key, entry in length_entries.items():
            entry["loadavg"] = length_load
            if key in failed:
                entry["status"] = failed[key]
            if entry["status"] != "ok":
                continue
            entry["times_s"] = {mode: times[key, mode] for mode in MODES}
            entry["warmup_s"] = {mode: warm.get((key, mode)) for mode in MODES}
            # Judged on the timed rounds: a warm-up step may include compiling (Triton kernels, FlexAttention), which
            # says nothing about a step at the next length.
            slowest = max(statistics.median(times[key, mode]) for mode in MODES)
            if settings.max_seconds_per_step is not None and slowest > settings.max_seconds_per_step:
                too_slow.add(key)
                entry["notes"].append(f"a step took {slowest:.1f} s (median of the rounds): longer lengths skipped")
        for (_, level), entry in length_entries.items():
            reference = length_entries.get((REFERENCE_MODEL, level))
            if entry["status"] == "ok" and reference is not None and reference["status"] == "ok":
                # Same round, same conditions: the ratio cancels whatever slowed that round down.
                entry["ratios"] = {
                    mode: [t / r for t, r in zip(entry["times_s"][mode], reference["times_s"][mode], strict=True)]
                    for mode in MODES
                }
        for key in list(workloads):
            if length_entries[key]["status"] == "ok":
                try:
                    length_entries[key].update(in_process_memory(workloads[key], settings))
                except Exception as err:  # noqa: BLE001
                    length_entries[key]["notes"].append(f"memory measurement failed ({short_error(err)})")
            # Closed before the next one's peak is measured, and only then out of the set: an interrupt during the
            # measurement leaves it for the cleanup below.
            workloads.pop(key).close()
    finally:  # also when interrupted: the models not yet closed go, and the device memory goes back
        for workload in workloads.values():
            workload.close()
        workloads.clear()
        gc.collect()
        release_cached_memory(settings.device)
    return list(length_entries.values())

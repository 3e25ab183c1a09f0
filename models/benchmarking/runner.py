"""The whole benchmark: header, equivalence checks, timing run(s), CPU memory subprocesses and aggregation."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

from .aggregate import aggregate
from .equivalence import check_equivalence
from .machine import apply_threads, cpu_affinity, loadavg, machine_header, utc_now
from .memory import cpu_memory
from .rows import benchmark_models
from .settings import REFERENCE_MODEL, SCHEMA_VERSION, BenchmarkSettings
from .subprocesses import collect_worker, run_worker
from .timing import clock, timing_sweep


def run_benchmark(settings: BenchmarkSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole benchmark: header, equivalence checks, timing run(s), CPU memory subprocesses, aggregation."""
    start = clock()  # the sweep's time budget counts from here
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but CUDA is not available.")
    if settings.memory and settings.device == "cpu" and not os.path.exists("/proc/self/clear_refs"):
        raise RuntimeError("CPU peak memory needs Linux's /proc/self/clear_refs.")
    apply_threads(settings)
    header = machine_header(settings)
    header["loadavg_start"] = loadavg()
    load_errors: dict[str, str] = {}
    rows = benchmark_models(settings.families, settings.hf_baselines, load_errors, keep=settings.rows)
    for error in load_errors.values():
        log(f"not benchmarked: {error}")
    if not any(row.name == REFERENCE_MODEL for row in rows):
        raise ValueError(f"The dense family ({REFERENCE_MODEL!r}) must be benchmarked: every ratio is relative to it.")
    models = []
    for row in rows:
        description = row.describe()
        description["equivalence"] = None
        if row.kind == "family" and settings.check_equivalence:
            check_length = settings.default_check_length()
            description["equivalence"] = check_equivalence(row, settings, check_length)
            log(f"equivalence {row.name}: {description['equivalence']}")
        models.append(description)

    sweep_settings = settings
    if settings.time_budget_s is not None:
        # The budget is the run's: what the equivalence checks took (on CUDA, Triton's and FlexAttention's compiles
        # for fp32) is not the sweep's to spend.
        left = max(0.0, settings.time_budget_s - (clock() - start))
        sweep_settings = dataclasses.replace(settings, time_budget_s=left)
    if settings.runs == 1:
        sweeps = [timing_sweep(sweep_settings, log)]
    else:
        # Each run in a fresh process: allocator state, thread pools and neighbours differ, which is the point.
        sweeps = []
        for run_index in range(settings.runs):
            log(f"timing run {run_index + 1}/{settings.runs} (subprocess)")
            process = run_worker("timing-worker", {"settings": sweep_settings.to_json()}, settings)
            sweeps.append(collect_worker(process))

    memory: dict[tuple[str, int], Any] = {}
    # After Ctrl-C (which only an in-process sweep, `runs == 1`, survives) the report is written without more work.
    interrupted = any(sweep.get("interrupted") for sweep in sweeps)
    if settings.memory and settings.device == "cpu" and not interrupted:
        lengths = settings.memory_lengths or settings.all_lengths
        jobs = sorted(
            {
                (e["model"], e["length"])
                for sweep in sweeps
                for e in sweep["entries"]
                if e["status"] == "ok" and e["length"] in lengths
            },
            key=lambda job: (job[1], job[0]),
        )
        memory = cpu_memory(settings, jobs, log)

    results = aggregate(sweeps, memory, settings)
    failed = {m["name"] for m in models if m["equivalence"] is not None and not m["equivalence"]["passed"]}
    for result in results:
        if result["model"] in failed:
            result["notes"].append("equivalence check FAILED: ratios not trustworthy")
    header["loadavg_end"] = loadavg()
    header["date_end"] = utc_now()
    affinity = cpu_affinity()
    busy_cores = len(affinity) if affinity is not None else os.cpu_count()
    loads = [load[0] for load in (header["loadavg_start"], header["loadavg_end"]) if load]
    # Load above the core count means other processes competed for the CPU during the run.
    header["load_warning"] = bool(loads and max(loads) > (busy_cores or 1))
    header["runs"] = [
        {"loadavg_start": sweep["loadavg_start"], "loadavg_end": sweep["loadavg_end"]} for sweep in sweeps
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "reference": REFERENCE_MODEL,
        "machine": header,
        "settings": settings.to_json(),
        "models": models,
        "unavailable": load_errors,
        "results": results,
    }

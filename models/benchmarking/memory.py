"""Peak memory of one step: CUDA allocator peak in-process, CPU resident high-water mark in fresh subprocesses."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import re
import subprocess
from collections.abc import Callable
from typing import Any

import torch

from .machine import apply_threads
from .rows import benchmark_models
from .settings import MODES, BenchmarkSettings
from .subprocesses import collect_worker, run_worker
from .workload import Workload, short_error


def cuda_peak_bytes(step: Callable[[], None]) -> int:
    """Peak CUDA allocation of one call above what was allocated before it."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _proc_status_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        match = re.search(rf"^{field_name}:\s+(\d+) kB", status.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field_name}.")
    return int(match.group(1))


def cpu_peak_bytes(step: Callable[[], None]) -> int:
    """Increase of the resident high-water mark during one call (Linux; needs `/proc/self/clear_refs`)."""
    gc.collect()
    with contextlib.suppress(OSError):
        # Hand freed heap pages back so the baseline RSS is the live data only.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # "5" resets VmHWM to the current RSS
    before = _proc_status_kib("VmRSS")
    step()
    return (_proc_status_kib("VmHWM") - before) * 1024


def step_peaks(workload: Workload, peak: Callable[[Callable[[], None]], int], warm_up: bool) -> dict[str, int]:
    """`peak(step)` of one step of `workload` per mode, after `prepare(mode, keep_grads=True)`.

    With `warm_up`, one untimed step of the mode runs first: lazy initialisation (kernels, caches, gradient buffers)
    is not the step's working set.
    """
    peaks = {}
    for mode in MODES:
        if warm_up:
            workload.prepare(mode)
            workload.step(mode)
        workload.prepare(mode, keep_grads=True)
        peaks[mode] = peak(lambda mode=mode: workload.step(mode))
    return peaks


def in_process_memory(workload: Workload, settings: BenchmarkSettings) -> dict[str, Any]:
    """In-process memory numbers of a workload: saved-for-backward bytes, and on CUDA the peak per mode (at the
    `memory_lengths`)."""
    result: dict[str, Any] = {"saved_bytes": workload.saved_for_backward_bytes()}
    if settings.device == "cuda" and (settings.memory_lengths is None or workload.length in settings.memory_lengths):
        # The saved-bytes count above dropped the gradients: one warm-up step re-creates them before the peak.
        result["cuda_peak_bytes"] = step_peaks(workload, cuda_peak_bytes, warm_up=True)
    return result


def memory_worker(settings: BenchmarkSettings, model_name: str, length: int) -> dict[str, dict[str, int]]:
    """CPU peak memory of one model at one length, for each level and mode (run in a fresh process)."""
    apply_threads(settings)
    rows = benchmark_models(settings.families, settings.hf_baselines, errors={})
    row = next(row for row in rows if row.name == model_name)
    peaks: dict[str, dict[str, int]] = {}
    for level in settings.levels:
        workload = Workload(row, level, length, settings)
        peaks[level] = step_peaks(workload, cpu_peak_bytes, warm_up=True)
        workload.close()
        del workload
    return peaks


def cpu_memory(
    settings: BenchmarkSettings, jobs: list[tuple[str, int]], log: Callable[[str], None]
) -> dict[tuple[str, int], Any]:
    """Run :func:`memory_worker` for each (model, length) in fresh subprocesses, `settings.memory_jobs` at a time."""
    results: dict[tuple[str, int], Any] = {}
    pending = list(jobs)
    running: list[tuple[tuple[str, int], subprocess.Popen]] = []
    while pending or running:
        while pending and len(running) < max(settings.memory_jobs, 1):
            name, length = pending.pop(0)
            payload = {"settings": settings.to_json(), "model": name, "length": length}
            running.append(((name, length), run_worker("memory-worker", payload, settings)))
        job, process = running.pop(0)
        try:
            results[job] = collect_worker(process)
        except (RuntimeError, json.JSONDecodeError) as err:
            results[job] = short_error(err)
        log(f"memory {job[0]} N={job[1]}: {results[job]}")
    return results

"""The stages of issue 49's prepared GPU run (`bash scripts/run.sh gpu speed`), run by `gpu_check.py` beside it.

- `sanity`: which kernel SDPA runs for head dims 64, 8 and 4 with and without a mask, and every device sync of one
  forward+backward per family (base width, N = 4,096) under `torch.cuda.set_sync_debug_mode`, with the first one's
  attnzoo line;
- `proxies`: the CPU proxies (`attnzoo.benchmarking.proxies`) counted on the real CUDA run (N = 1,024), next to the
  numbers the CPU tests hold;
- `kernels`: the kernel micro-benchmarks against SDPA (B = 1, H = 12, N = 16,384, d = 64);
- `profile`: a `torch.profiler` trace of one forward+backward per family (base size, N = 16,384);
- `bench-speed`, last, with the time the others left: the benchmark at base size, bf16, N = 1,024 ... 65,536 (the
  floor row, every family's main rows, SBM at 60 keys per query, the Sparse Transformer's Triton-kernel path beside
  its FlexAttention default, and the peers BERT-SDPA, Longformer, BigBird and ModernBERT), the issue's goals at
  N = 16,384 and the crossover length of each row. A row whose step takes over a second is not run at longer
  lengths, and a length the remaining time cannot hold is skipped.

Each stage writes its files under the run's folder and returns a JSON-able summary; `--dry-run` runs them on the CPU
at toy sizes.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import torch

from attnzoo.benchmarking import (
    BenchmarkSettings,
    ModelSize,
    kernel_markdown,
    proxies_markdown,
    run_benchmark,
    run_proxies,
    time_kernels,
    write_proxies,
    write_reports,
)
from attnzoo.benchmarking.gpu_checks import profile_step, sdpa_backend, sync_check
from attnzoo.benchmarking.report import crossover_markdown
from attnzoo.benchmarking.rows import benchmark_models
from attnzoo.benchmarking.timing import release_cached_memory

SPEED_STAGES = ("sanity", "proxies", "kernels", "profile", "bench-speed")
#: Seconds each stage may take at most in the prepared run, which is also what the later stages keep in reserve while
#: an earlier one runs: together the default budget of 450 s (`ATTNZOO_GPU_BUDGET_S`), so that the run, with the
#: machine's start and the results' writing, fits in 8 minutes. The benchmark, last, takes whatever is left.
# The sanity stage compiles most Triton kernels for the first time (the later stages reuse them).
STAGE_SECONDS = {"sanity": 90, "proxies": 30, "kernels": 60, "profile": 60, "bench-speed": 210}
#: Lengths with a peak-memory measurement in the benchmark (four more steps per row): the goal's and the extremes.
MEMORY_LENGTHS = [4096, 16384, 65536]
#: The families' main rows and the floor, checked and profiled one by one.
FAMILY_ROWS = [
    "dense_transformer",
    "null_attention",
    "sparse_transformer",
    "a2former",
    "fsat",
    "smart_bird",
    "sbm:fastrg-2%",
]
PEERS = ["bert-sdpa", "longformer", "bigbird", "modernbert"]
#: Besides the main rows: SBM at a fixed degree, the Sparse Transformer's Triton path (its default on CUDA is
#: FlexAttention), and the peers.
SPEED_ROWS = [
    *FAMILY_ROWS,
    "sbm:fastrg-60/query",
    "sparse_transformer:triton_kernels",
    *(f"hf:{peer}" for peer in PEERS),
]
SPEED_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
SANITY_LENGTH = 4096
PROFILE_LENGTH = 16384
#: SDPA calls whose kernel choice is logged: head dim 64 (every family), 8 and 4 (Smart Bird's sketch).
SDPA_CASES = [(64, False), (64, True), (8, False), (8, True), (4, False), (4, True)]


def stage_budget(stage: str, stages: list[str], deadline: float) -> float:
    """Seconds `stage` may take: its own cap, and never more than the run's deadline leaves after the reserves of the
    stages still to come."""
    later = stages[stages.index(stage) + 1 :]
    left = deadline - time.monotonic() - sum(STAGE_SECONDS.get(s, 0) for s in later)
    cap = left if stage == "bench-speed" else STAGE_SECONDS.get(stage, left)
    return max(0.0, min(cap, left))


def _setup(dry_run: bool, base: ModelSize, dry: ModelSize) -> tuple[str, torch.dtype, ModelSize]:
    if dry_run:
        return "cpu", torch.float32, dry
    return "cuda", torch.bfloat16, base


def _release(device: str) -> None:
    gc.collect()
    release_cached_memory(device)  # does not raise after a sticky CUDA error: the row already recorded it


def run_sanity(out: Path, dry_run: bool, base: ModelSize, dry: ModelSize, budget: float) -> dict[str, Any]:
    """SDPA's kernel per head dim and mask, then the device syncs of one training step per family."""
    device, dtype, size = _setup(dry_run, base, dry)
    length = 64 if dry_run else SANITY_LENGTH
    end = time.monotonic() + budget
    sdpa = [
        {"head_dim": d, "mask": masked, "kernel": sdpa_backend(d, masked, length=length, device=device, dtype=dtype)}
        for d, masked in SDPA_CASES
    ]
    rows = {row.name: row for row in benchmark_models(None, [], errors={})}
    checks = []
    for name in FAMILY_ROWS:
        if name not in rows:
            checks.append({"row": name, "error": "not registered"})
        elif time.monotonic() > end:
            checks.append({"row": name, "error": "not run: time budget"})
        else:
            checks.append(sync_check(rows[name], size, length, device, dtype))
            print(f"sanity {name}: {checks[-1]}", flush=True)
        _release(device)
    return {
        "length": length,
        "sdpa": sdpa,
        "syncs": checks,
        "passed": all(check.get("error") is None for check in checks),
    }


def run_proxies_stage(out: Path, dry_run: bool, dry: ModelSize) -> dict[str, Any]:
    """The proxies counted on this device (on a CPU: the CUDA code path under Triton's interpreter)."""
    if dry_run:
        # One layer, and a vocabulary small enough for the largest-intermediate proxy to mean what it says.
        size = ModelSize(**{**dry.__dict__, "num_hidden_layers": 1, "vocab_size": 64})
        report = run_proxies(length=64, size=size, device="cpu")
    else:
        report = run_proxies(device="cuda")
    paths = write_proxies(report, out)
    return {
        "files": {kind: path.name for kind, path in paths.items()},
        "table": proxies_markdown(report).splitlines(),
        "errors": report["errors"],
        "over_budget": {name: sorted(s["over_budget"]) for name, s in report["summaries"].items()},
        "passed": not report["errors"],
    }


def run_kernels(out: Path, dry_run: bool) -> dict[str, Any]:
    """The kernel micro-benchmarks against SDPA, written to `kernels.{json,md}`."""
    if dry_run:
        timings = time_kernels(1, 2, 64, 16, device="cpu", dtype=torch.float32, rounds=1, warmup=1)
    else:
        timings = time_kernels(1, 12, 16384, 64, device="cuda", dtype=torch.bfloat16, rounds=10, warmup=2)
    (out / "kernels.json").write_text(_json(timings))
    table = kernel_markdown(timings)
    (out / "kernels.md").write_text(table + "\n")
    errors = {r["name"]: r["error"] for r in timings["results"] if r["error"]}
    return {
        "files": {"json": "kernels.json", "markdown": "kernels.md"},
        "table": table.splitlines(),
        "errors": errors,
        "passed": not errors,
    }


def run_bench_speed(
    out: Path, dry_run: bool, base: ModelSize, dry: ModelSize, budget: float, lengths: list[int] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base-size benchmark with the floor and the peers over `SPEED_LENGTHS`; returns the stage summary and the
    report (for the goals)."""
    settings = BenchmarkSettings(
        families=None,
        rows=SPEED_ROWS,
        hf_baselines=PEERS,
        lengths=lengths or ([64, 128] if dry_run else SPEED_LENGTHS),
        device="cpu" if dry_run else "cuda",
        dtype="fp32" if dry_run else "bf16",
        levels=["model"],
        rounds=1 if dry_run else 3,
        warmup=0 if dry_run else 1,
        max_seconds_per_step=1.0,
        memory_lengths=None if dry_run else MEMORY_LENGTHS,
        time_budget_s=budget,
        size=dry if dry_run else base,
    )
    start = time.perf_counter()
    report = run_benchmark(settings, log=print)
    paths = write_reports(report, out / "bench-speed")
    failed = [m["name"] for m in report["models"] if m["equivalence"] is not None and not m["equivalence"]["passed"]]
    summary = {
        "seconds": time.perf_counter() - start,
        "files": {kind: str(path.relative_to(out)) for kind, path in paths.items() if path is not None},
        "equivalence_failed": failed,
        "skipped_for_time": sorted({r["length"] for r in report["results"] if r["status"] == "skipped: time budget"}),
        "interrupted": sorted({r["length"] for r in report["results"] if r["status"] == "skipped: interrupted"}),
        "crossover": crossover_markdown(report),
    }
    return summary, report


def run_profile(out: Path, dry_run: bool, base: ModelSize, dry: ModelSize, budget: float) -> dict[str, Any]:
    """One profiled training step per family, into `profile/`."""
    device, dtype, size = _setup(dry_run, base, dry)
    length = 64 if dry_run else PROFILE_LENGTH
    end = time.monotonic() + budget
    rows = {row.name: row for row in benchmark_models(None, [], errors={})}
    profiles = []
    for name in FAMILY_ROWS:
        if time.monotonic() > end:
            profiles.append({"row": name, "error": "not run: time budget"})
            continue
        profiles.append(profile_step(rows[name], size, length, device, dtype, out / "profile"))
        print(f"profile {name}: {profiles[-1]}", flush=True)
        _release(device)
    return {"length": length, "profiles": profiles, "passed": all(p["error"] is None for p in profiles)}


def readme_sections(stages: dict[str, Any]) -> list[str]:
    """The README's sections of the speed stages present in `stages`."""
    lines: list[str] = []
    if "sanity" in stages:
        sanity = stages["sanity"]
        lines += [
            f"## sanity (N = {sanity['length']})",
            "",
            "| SDPA head dim | mask | kernel |",
            "|---|---|---|",
            *(f"| {c['head_dim']} | {'yes' if c['mask'] else 'no'} | {c['kernel']} |" for c in sanity["sdpa"]),
            "",
            "| row | device syncs in one forward+backward | first sync |",
            "|---|---|---|",
        ]
        for check in sanity["syncs"]:
            syncs = check.get("error") or sum(check.get("syncs", {}).values())
            lines.append(f"| {check['row']} | {syncs} | {check.get('first_sync') or '–'} |")
        lines.append("")
    if "proxies" in stages:
        lines += ["## CPU proxies, counted on this device", "", *stages["proxies"]["table"], ""]
    if "kernels" in stages:
        lines += ["## kernel micro-benchmarks", "", *stages["kernels"]["table"], ""]
    if "bench-speed" in stages:
        bench = stages["bench-speed"]
        lines += [
            "## benchmark, base size, with the floor and the peers",
            "",
            f"Tables: [{bench['files']['markdown']}]({bench['files']['markdown']})"
            + (f"; lengths skipped for time: {bench['skipped_for_time']}" if bench["skipped_for_time"] else "")
            + (f"; lengths not run, interrupted: {bench['interrupted']}" if bench.get("interrupted") else ""),
            "",
            *bench["crossover"],
            "",
        ]
    if "profile" in stages:
        profile = stages["profile"]
        lines += [
            f"## profile of one forward+backward (N = {profile['length']})",
            "",
            "| row | wall ms | host op ms | device kernel ms | kernels | top op | error |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in profile["profiles"]:
            top = p.get("top") or [{}]
            lines.append(
                f"| {p['row']} | {_num(p.get('wall_ms'))} | {_num(p.get('host_ms'))} | {_num(p.get('device_ms'))} "
                f"| {p.get('device_kernels') or '–'} | {top[0].get('op', '–')} | {p.get('error') or ''} |"
            )
        lines.append("")
    return lines


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"

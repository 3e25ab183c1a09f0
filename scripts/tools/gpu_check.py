"""The GPU validation in one program: `pytest -m gpu`, the CUDA bf16 benchmark, a bf16 `Trainer` fine-tune per family,
and issue 49's prepared speed run.

Run it through `bash scripts/run.sh gpu [STAGE ...] [options]` (which puts attnzoo on the path and installs any
wheels carried in `.whl/`). Stages, in order (default: the first four):

- `tests`: `pytest -m gpu` (every family's four heads on CUDA in bf16, kernels == references on CUDA, generation
  with a cache, ...), summarised from its JUnit XML;
- `bench-small`, `bench-base`: the benchmark harness (`attnzoo.benchmarking`) on CUDA in bf16, batch 1, forward and
  forward+backward, N = 1024 ... 32768 (longer lengths of a model are skipped once a step exceeds
  `--max-seconds-per-step`; out-of-memory is recorded), every family's main rows against the dense (SDPA) family and
  the floor row, HF BERT (SDPA), BigBird, Longformer and ModernBERT; small = 2 layers, width 256, 4 heads; base =
  12 layers, width 768, 12 heads;
- `train`: a 200-step bf16 `Trainer` fine-tune of every family's classifier (small config) on the bundled IMDB
  reviews (`quick_finetune.py` beside this program);
- `sanity`, `proxies`, `kernels`, `bench-speed`, `profile`: issue 49's prepared run (`gpu_speed.py` beside this
  program says what each does), all five at once with the plan name `speed`: about 8 minutes on an H100, within
  `ATTNZOO_GPU_BUDGET_S` (default 450 s) for the stages together.

Everything lands in `scripts/experiments/speed-memory/results/gpu-<date>-<device>/` (or `--output-dir`):
`summary.json` (device, versions and every stage's outcome), `README.md` (the tables, the speed goals at N = 16384
met or not, the crossover lengths), `bench-<size>/benchmark.{json,md,png}`, `tests.xml`, `proxies.{json,md}`,
`kernels.{json,md}` and `profile/` (a Chrome trace and the top ops per family). Stages run in separate invocations
add to the same folder, so each can stay within a 10-minute command limit. `--dry-run` runs every stage on the CPU
at toy sizes (the tests stage only collects the GPU tests) to check the program itself on a machine without CUDA.

Examples:
    bash scripts/run.sh gpu speed                             # issue 49's run: first thing whenever a GPU is at hand
    bash scripts/run.sh gpu                                   # the validation (about 15-25 minutes on an H100)
    bash scripts/run.sh gpu tests bench-small                 # the first 10-minute slice
    bash scripts/run.sh gpu bench-base --lengths 16384 32768  # a part of a stage
    bash scripts/run.sh gpu speed --dry-run --output-dir /tmp/gpu-dry
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import torch
import transformers

import attnzoo
from attnzoo.benchmarking import BenchmarkSettings, ModelSize, run_benchmark, write_reports

# quick_finetune.py lies beside this program; the tests import this file by its path, so its folder is not on the
# path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_speed  # noqa: E402

from quick_finetune import quick_finetune  # noqa: E402

REPO = Path(__file__).resolve().parents[2]  # scripts/tools/gpu_check.py: the checkout
VALIDATION_STAGES = ("tests", "bench-small", "bench-base", "train")
STAGES = (*VALIDATION_STAGES, *gpu_speed.SPEED_STAGES)
#: Named groups of stages.
PLANS = {"speed": gpu_speed.SPEED_STAGES}
SIZES = {
    "small": ModelSize(
        vocab_size=8000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024
    ),
    "base": ModelSize(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    ),
}
DRY_SIZE = ModelSize(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
#: Benchmark rows: every family's default row, SBM's fastRG backend at 2% density and the merged strided Sparse
#: Transformer (the one pattern that runs on the edge kernel), against our dense (SDPA) family, the floor and the HF
#: baselines.
ROWS = [
    "dense_transformer",
    "null_attention",
    "a2former",
    "fsat",
    "sbm",
    "sbm:fastrg-2%",
    "smart_bird",
    "sparse_transformer",
    "sparse_transformer:strided_merged",
    "hf:bert-sdpa",
    "hf:bigbird",
    "hf:longformer",
    "hf:modernbert",
]
LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
#: The issue's goals (issue 49) at N = 16384, base size, bf16, forward+backward: the largest time ratio to dense
#: SDPA (SBM at its fastRG 2% density and at 60 keys per query), and peak memory within 1.1x dense (FSAT 1.5x).
GOAL_LENGTH = 16384
TIME_GOALS = {
    "sparse_transformer": 0.30,
    "a2former": 0.35,
    "smart_bird": 0.5,
    "fsat": 0.5,
    "sbm:fastrg-2%": 2.5,
    "sbm:fastrg-60/query": 1.0,
}
MEMORY_GOAL = 1.1
MEMORY_GOALS = {"fsat": 1.5}
#: Every family is faster than Longformer and BigBird at these lengths.
BEAT_LENGTHS = (16384, 65536)
BASELINES = ("hf:bigbird", "hf:longformer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "stages",
        nargs="*",
        help=f"stages to run, from {STAGES}, or a plan from {sorted(PLANS)} (default: {VALIDATION_STAGES})",
    )
    parser.add_argument(
        "--output-dir", help="results folder (default: scripts/experiments/speed-memory/results/gpu-<date>-<device>)"
    )
    parser.add_argument("--dry-run", action="store_true", help="every stage on the CPU at toy sizes")
    parser.add_argument("--lengths", nargs="+", type=int, help=f"benchmark lengths (default: {LENGTHS})")
    parser.add_argument("--rows", nargs="+", help="benchmark rows (default: the main row of every family + HF)")
    parser.add_argument("--rounds", type=int, default=5, help="timed benchmark rounds")
    parser.add_argument("--warmup", type=int, default=3, help="benchmark warm-up steps")
    parser.add_argument("--max-seconds-per-step", type=float, default=4.0, help="skip longer lengths beyond this")
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--families", nargs="+", help="families of the train stage (default: all)")
    args = parser.parse_args(argv)
    stages = [stage for name in args.stages for stage in PLANS.get(name, (name,))]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {unknown}; choose from {STAGES} or a plan from {sorted(PLANS)}")
    args.stages = list(dict.fromkeys(stages)) or list(VALIDATION_STAGES)
    return args


def device_name(dry_run: bool) -> str:
    if dry_run or not torch.cuda.is_available():
        return "cpu-dryrun"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")


def environment() -> dict[str, Any]:
    """Device and software versions, recorded in `summary.json`."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "triton": triton_version,
        "attnzoo": attnzoo.__version__,
        "device": "cpu",
    }
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(
            device=properties.name,
            capability=list(torch.cuda.get_device_capability(0)),
            memory_gb=round(properties.total_memory / 2**30, 1),
        )
    return info


def run_tests(out: Path, dry_run: bool) -> dict[str, Any]:
    """`pytest -m gpu` (dry run: only collect them), summarised from the JUnit XML.

    Modules that need a package this machine lacks (the training-script tests need `datasets`, which the GPU machine
    does not have) fail to import: that is reported, and does not stop the GPU tests of the other modules.
    """
    xml = out / "tests.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    # The last `-m` wins over the default `-m 'not slow and not gpu'` of pyproject's addopts.
    command.append("--continue-on-collection-errors")
    if dry_run:
        command.append("--collect-only")
    start = time.perf_counter()
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    result: dict[str, Any] = {"seconds": time.perf_counter() - start, "returncode": process.returncode}
    if dry_run:
        # "24/1976 tests collected (1952 deselected)": the first number is what `-m gpu` selected.
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", process.stdout)
        result["collected"] = int(collected.group(1)) if collected else 0
        result["passed"] = process.returncode == 0 and result["collected"] > 0
        return result
    result.update(_junit_summary(xml))
    result["output_tail"] = process.stdout[-3000:]
    result["passed"] = result["failed"] == 0 and result["tests"] > 0
    return result


def _junit_summary(xml: Path) -> dict[str, Any]:
    if not xml.exists():
        return {"tests": 0, "failed": 0, "skipped": 0, "failures": ["pytest wrote no JUnit XML"]}
    root = ElementTree.parse(xml).getroot()
    cases = root.iter("testcase")
    failures, skipped, count = [], 0, 0
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        count += 1
        if case.find("skipped") is not None:
            skipped += 1
        for tag in ("failure", "error"):
            element = case.find(tag)
            if element is not None:
                failures.append(f"{name}: {(element.get('message') or '').splitlines()[0][:200]}")
    # Collection errors (a module that could not be imported) are test cases with an empty name and an error.
    collection = [f for f in failures if f.startswith("::") or "::" not in f.split(": ")[0]]
    return {
        "tests": count,
        "failed": len(failures) - len(collection),
        "skipped": skipped,
        "collection_errors": collection,
        "failures": [f for f in failures if f not in collection],
    }


def run_bench(size_name: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One benchmark size on CUDA in bf16 (dry run: CPU, fp32, toy size), written to `bench-<size>/`."""
    settings = BenchmarkSettings(
        families=None,
        rows=args.rows or ROWS,
        hf_baselines=["bert-sdpa", "bigbird", "longformer", "modernbert"],
        lengths=args.lengths or ([64, 128] if args.dry_run else LENGTHS),
        device="cpu" if args.dry_run else "cuda",
        dtype="fp32" if args.dry_run else "bf16",
        levels=["model"],
        rounds=1 if args.dry_run else args.rounds,
        warmup=0 if args.dry_run else args.warmup,
        max_seconds_per_step=args.max_seconds_per_step,
        size=DRY_SIZE if args.dry_run else SIZES[size_name],
    )
    start = time.perf_counter()
    report = run_benchmark(settings, log=print)
    paths = write_reports(report, out / f"bench-{size_name}")
    failed = [m["name"] for m in report["models"] if m["equivalence"] is not None and not m["equivalence"]["passed"]]
    raised = raised_rows(report)
    return {
        "seconds": time.perf_counter() - start,
        "files": {kind: str(path.relative_to(out)) for kind, path in paths.items() if path is not None},
        "equivalence_failed": failed,
        "raised": raised,
        "goals": goals(report) if size_name == "base" else None,
        "passed": not failed and not raised,
    }


def raised_rows(report: dict[str, Any]) -> dict[str, str]:
    """Rows that raised for another reason than running out of memory (a kernel or model failure), each with its
    first such status. Out of memory and "too slow" at long lengths are results, not failures."""
    raised: dict[str, str] = {}
    for result in report["results"]:
        status = result["status"]
        if status.startswith("error:") and "out of memory" not in status.lower() and "OutOfMemory" not in status:
            raised.setdefault(result["model"], f"{status} (N = {result['length']})")
    return raised


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets at N = 16384, forward+backward: time ratio to dense, peak memory ratio, and faster than
    BigBird and Longformer at 16384 and 65536 tokens. `None` where a row did not run at that length, and for the
    BigBird and Longformer comparison at a length where either baseline was not in the run (a baseline that ran out
    of memory or time there counts as beaten)."""

    def at(length: int) -> dict[str, dict[str, Any]]:
        return {r["model"]: r for r in report["results"] if r["length"] == length and r["status"] == "ok"}

    def planned(length: int) -> set[str]:
        return {r["model"] for r in report["results"] if r["length"] == length}

    goal = at(GOAL_LENGTH)
    rows = []
    for name, limit in TIME_GOALS.items():
        ratio = goal[name]["fwd_bwd"]["ratio"] if name in goal else None
        memory = (goal[name].get("memory") or {}).get("fwd_bwd_ratio") if name in goal else None
        memory_goal = MEMORY_GOALS.get(name, MEMORY_GOAL)
        beats = {}
        for length in BEAT_LENGTHS:
            ran, scheduled = at(length), planned(length)
            beats[length] = None
            if name in ran and all(b in scheduled for b in BASELINES):
                mine = ran[name]["fwd_bwd"]["ms"]
                beats[length] = all(b not in ran or mine < ran[b]["fwd_bwd"]["ms"] for b in BASELINES)
        rows.append(
            {
                "model": name,
                "time_ratio": ratio,
                "time_goal": limit,
                "time_met": None if ratio is None else ratio <= limit,
                "beats_bigbird_and_longformer": beats,
                "memory_ratio": memory,
                "memory_goal": memory_goal,
                "memory_met": None if memory is None else memory <= memory_goal,
            }
        )
    return rows


def goals_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The goals as a Markdown table."""
    beat = " | ".join(f"faster than BigBird and Longformer at {n}" for n in BEAT_LENGTHS)
    lines = [
        f"Goals at N = {GOAL_LENGTH}, forward+backward, bf16 (time and peak memory relative to dense SDPA):",
        "",
        f"| model | time × dense | goal | met | memory × dense | goal | met | {beat} |",
        "|---|---|---|---|---|---|---|" + "---|" * len(BEAT_LENGTHS),
    ]
    for goal in rows:
        beats = goal["beats_bigbird_and_longformer"]
        if not isinstance(beats, dict):  # summaries written before the 65536 comparison: one value, at 16384
            beats = {GOAL_LENGTH: beats}
        cells = " | ".join(_yes(beats.get(n, beats.get(str(n)))) for n in BEAT_LENGTHS)
        lines.append(
            f"| {goal['model']} | {_fmt(goal['time_ratio'])} | ≤ {goal['time_goal']} | {_yes(goal['time_met'])} "
            f"| {_fmt(goal['memory_ratio'])} | ≤ {goal.get('memory_goal', MEMORY_GOAL)} | {_yes(goal['memory_met'])} "
            f"| {cells} |"
        )
    return lines


def run_train(out: Path, args: argparse.Namespace, budget_end: float) -> dict[str, Any]:
    """A bf16 `Trainer` fine-tune per family (dry run: 2 steps of the tiny configs on the CPU)."""
    results = []
    families = args.families or sorted(family.name for family in attnzoo.FAMILIES.values())
    for family in families:
        if time.perf_counter() > budget_end:
            results.append({"family": family, "status": "not run: time budget of this command spent"})
            continue
        try:
            with tempfile.TemporaryDirectory() as trainer_dir:  # Trainer's own folder: nothing in it is kept
                result = quick_finetune(
                    family,
                    trainer_dir,
                    size="tiny" if args.dry_run else "small",
                    steps=2 if args.dry_run else args.train_steps,
                    batch_size=4 if args.dry_run else 16,
                    max_length=64 if args.dry_run else 512,
                    precision="bf16",
                    use_cpu=args.dry_run,
                )
            result["status"] = "ok" if result["finite"] else "non-finite loss or parameters"
        except Exception as err:  # noqa: BLE001 - one family's failure is a finding; the others still run
            result = {"family": family, "status": f"error: {type(err).__name__}: {err}"}
        print(json.dumps(result))
        results.append(result)
    return {"families": results, "passed": all(r["status"] == "ok" for r in results)}


def write_readme(out: Path, summary: dict[str, Any]) -> None:
    """The folder's `README.md`: device, every stage's outcome and the tables."""
    env = summary["environment"]
    lines = [
        f"# GPU validation: {env['device']}",
        "",
        f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, triton {env['triton']}, "
        f"attnzoo {env['attnzoo']}; commit {summary.get('commit') or '?'}; `bash scripts/run.sh gpu` "
        f"({'dry run on the CPU' if summary['dry_run'] else 'CUDA, bf16'}).",
        "",
    ]
    # A stage that crashed has no tables: it is listed with its error instead.
    stages = {name: stage for name, stage in summary["stages"].items() if "crashed" not in stage}
    crashed = [
        f"- stage `{name}` crashed: {stage['crashed']}"
        for name, stage in summary["stages"].items()
        if "crashed" in stage
    ]
    if crashed:
        lines += [*crashed, ""]
    if "tests" in stages:
        tests = stages["tests"]
        if "collected" in tests:
            lines += [f"## pytest -m gpu\n\ncollected {tests['collected']} GPU tests (dry run: not executed).", ""]
        else:
            lines += [
                "## pytest -m gpu",
                "",
                f"{tests['tests']} tests, {tests['failed']} failed, {tests['skipped']} skipped "
                f"({tests['seconds']:.0f} s); modules not importable here: {len(tests['collection_errors'])}.",
                *[f"- FAILED {failure}" for failure in tests["failures"]],
                "",
            ]
    for size in ("small", "base"):
        bench = stages.get(f"bench-{size}")
        if bench is None:
            continue
        lines += [
            f"## benchmark, {size} size",
            "",
            f"Tables: [{bench['files']['markdown']}]({bench['files']['markdown']})",
        ]
        if bench["files"].get("plot"):
            lines.append(f"\n![{size}]({bench['files']['plot']})")
        if bench["equivalence_failed"]:
            lines.append(f"\nfast path != reference: {', '.join(bench['equivalence_failed'])}")
        if bench.get("raised"):  # older summaries have no such entry
            lines += [
                "",
                "Rows that raised (not out of memory):",
                *[f"- {k}: {v}" for k, v in bench["raised"].items()],
            ]
        if bench.get("goals"):
            lines += ["", *goals_markdown(bench["goals"])]
        lines.append("")
    if "train" in stages:
        lines += [
            "## bf16 Trainer fine-tune (IMDB slice, small config)",
            "",
            "| family | steps | first loss | last loss | eval accuracy | samples/s | peak MB | status |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in stages["train"]["families"]:
            lines.append(
                f"| {r['family']} | {r.get('steps', '–')} | {_fmt(r.get('first_loss'), 3)} | "
                f"{_fmt(r.get('last_loss'), 3)} | {_fmt(r.get('eval_accuracy'), 3)} | "
                f"{_fmt(r.get('train_samples_per_second'), 1)} | {_fmt(r.get('peak_memory_mb'), 0)} | {r['status']} |"
            )
        lines.append("")
    lines += gpu_speed.readme_sections(stages)
    if stages.get("bench-speed", {}).get("goals"):
        lines += [*goals_markdown(stages["bench-speed"]["goals"]), ""]
    (out / "README.md").write_text("\n".join(lines))


def _budget(stage: str, stages: list[str], deadline: float) -> float:
    return gpu_speed.stage_budget(stage, stages, deadline)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _yes(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "**no**")


def _git_commit() -> str | None:
    try:  # the GPU machine's copy of the tree may come without git or without its history
        process = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return process.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    print(f"attnzoo from {Path(attnzoo.__file__).parent}, {versions}")
    if not args.dry_run and not torch.cuda.is_available():
        print("No CUDA device: run on a GPU machine, or pass --dry-run to check this program on the CPU.")
        return 2
    if args.dry_run and not torch.cuda.is_available():
        # The proxies take the Triton kernels' code path under the interpreter, chosen when the kernels are first
        # imported (nothing has imported them yet).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    date = datetime.date.today().isoformat()
    out = Path(
        args.output_dir
        or REPO / "scripts" / "experiments" / "speed-memory" / "results" / f"gpu-{date}-{device_name(args.dry_run)}"
    )
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"stages": {}}
    summary.update(environment=environment(), dry_run=args.dry_run, commit=_git_commit())
    # Leave a minute of the usual 10-minute command limit for writing the results; the speed plan takes 8 minutes.
    speed_plan = set(args.stages) & set(gpu_speed.SPEED_STAGES)
    default_budget = "450" if speed_plan else "540"
    budget_s = float(os.environ.get("ATTNZOO_GPU_BUDGET_S", default_budget))
    budget_end = time.perf_counter() + budget_s
    deadline = time.monotonic() + budget_s
    speed_stages = [stage for stage in args.stages if stage in gpu_speed.SPEED_STAGES]
    base, dry = SIZES["base"], DRY_SIZE
    for stage in args.stages:
        print(f"== {stage}", flush=True)
        try:
            if stage == "tests":
                result = run_tests(out, args.dry_run)
            elif stage in ("bench-small", "bench-base"):
                result = run_bench(stage.removeprefix("bench-"), out, args)
            elif stage == "train":
                result = run_train(out, args, budget_end)
            elif stage == "sanity":
                result = gpu_speed.run_sanity(out, args.dry_run, base, dry, _budget(stage, speed_stages, deadline))
            elif stage == "proxies":
                result = gpu_speed.run_proxies_stage(out, args.dry_run, dry)
            elif stage == "kernels":
                result = gpu_speed.run_kernels(out, args.dry_run)
            elif stage == "bench-speed":
                budget = _budget(stage, speed_stages, deadline)
                result, report = gpu_speed.run_bench_speed(out, args.dry_run, base, dry, budget, args.lengths)
                result["goals"] = goals(report)
                result["raised"] = raised_rows(report)
                result["passed"] = not (result["equivalence_failed"] or result["raised"] or result["interrupted"])
            else:
                result = gpu_speed.run_profile(out, args.dry_run, base, dry, _budget(stage, speed_stages, deadline))
        except Exception as err:  # noqa: BLE001 - a stage that crashes must not cost the later ones (scarce GPU time)
            traceback.print_exc()
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
            result = {"passed": False, "crashed": f"{type(err).__name__}: {first_line}"}
        except KeyboardInterrupt:  # `timeout -s INT` before the device call's limit: keep what the run has
            result = {"passed": False, "crashed": "interrupted (the command's time limit)", "interrupted": True}
        summary["stages"][stage] = result
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        write_readme(out, summary)
        if result.get("interrupted"):  # the stage's, or the benchmark's lengths not run
            break  # the command's time limit is near: what ran is written
    print(f"wrote {out}")
    return 0 if all(summary["stages"].get(stage, {}).get("passed") for stage in args.stages) else 1


if __name__ == "__main__":
    sys.exit(main())

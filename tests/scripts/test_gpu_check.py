"""`scripts/tools/gpu_check.py` (`bash scripts/run.sh gpu`): its dry run on the CPU, its summaries and the shell
glue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from source_checkout import REPO_ROOT


@pytest.fixture
def gpu_check(load_script):
    module = load_script("tools/gpu_check")
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)  # the benchmark pins one thread; later tests keep theirs


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU stand-in of the GPU run")
def test_dry_run_benchmarks_and_fine_tunes_and_writes_the_results_folder(gpu_check, tmp_path):
    argv = ["bench-small", "train", "--dry-run", "--output-dir", str(tmp_path), "--lengths", "64"]
    argv += [
        "--rows",
        "dense_transformer",
        "sparse_transformer:strided_merged",
        "hf:longformer",
        "--families",
        "dense_transformer",
        "sbm",
    ]
    assert gpu_check.main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dry_run"] and summary["environment"]["torch"] == torch.__version__
    bench = summary["stages"]["bench-small"]
    assert bench["passed"] and bench["equivalence_failed"] == [] and bench["raised"] == {}
    report = json.loads((tmp_path / bench["files"]["json"]).read_text())
    timed = {r["model"] for r in report["results"] if r["status"] == "ok"}
    assert timed == {"dense_transformer", "sparse_transformer:strided_merged", "hf:longformer"}
    assert (tmp_path / "bench-small" / "benchmark.png").exists()
    runs = summary["stages"]["train"]["families"]
    assert [r["family"] for r in runs] == ["dense_transformer", "sbm"]
    assert all(r["status"] == "ok" and r["steps"] == 2 and r["precision"] == "bf16" for r in runs)
    readme = (tmp_path / "README.md").read_text()
    assert "bench-small/benchmark.md" in readme and "| sbm | 2 |" in readme
    # A second invocation adds its stage to the same folder instead of replacing the earlier ones.
    assert (
        gpu_check.main(["train", "--dry-run", "--output-dir", str(tmp_path), "--families", "dense_transformer"]) == 0
    )
    assert set(json.loads((tmp_path / "summary.json").read_text())["stages"]) == {"bench-small", "train"}


def test_junit_summary_tells_collection_errors_from_failures(gpu_check, tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.kernels.test_x" name="test_ok"/>'
        '<testcase classname="tests.kernels.test_x" name="test_bad"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="tests.a" name="test_skip"><skipped message="no"/></testcase>'
        '<testcase classname="" name="tests.scripts.test_run_glue"><error message="collection failure"/></testcase>'
        "</testsuite></testsuites>"
    )
    summary = gpu_check._junit_summary(xml)
    assert summary["tests"] == 4 and summary["skipped"] == 1 and summary["failed"] == 1
    assert summary["failures"] == ["tests.kernels.test_x::test_bad: assert 1 == 2"]
    assert len(summary["collection_errors"]) == 1


def test_goals_are_the_issue_targets_at_16384_and_the_baselines_at_16384_and_65536(gpu_check):
    def result(model, ms, ratio, memory_ratio=None, length=16384):
        memory = None if memory_ratio is None else {"fwd_bwd_ratio": memory_ratio}
        timing = {"ms": ms, "ratio": ratio}
        return {"model": model, "length": length, "status": "ok", "fwd_bwd": timing, "memory": memory}

    report = {
        "results": [
            result("dense_transformer", 100.0, 1.0, 1.0),
            result("a2former", 30.0, 0.3, 1.05),
            result("fsat", 60.0, 0.6, 1.4),
            result("smart_bird", 85.0, 0.85, 1.0),
            result("sbm:fastrg-2%", 200.0, 2.0, 1.2),
            result("hf:bigbird", 80.0, 0.8),
            result("hf:longformer", 120.0, 1.2),
            result("a2former", 400.0, 0.25, length=65536),
            result("hf:bigbird", 300.0, 0.2, length=65536),
            result("hf:longformer", 900.0, 0.6, length=65536),
        ]
    }
    goals = {goal["model"]: goal for goal in gpu_check.goals(report)}
    assert goals["a2former"]["time_met"] and goals["a2former"]["memory_met"]
    assert goals["a2former"]["beats_bigbird_and_longformer"] == {16384: True, 65536: False}
    # FSAT's memory goal is 1.5x; SBM's time goal at 2% density is 2.5x, its memory goal 1.1x.
    assert not goals["fsat"]["time_met"] and goals["fsat"]["memory_met"]
    assert goals["sbm:fastrg-2%"]["time_met"] and not goals["sbm:fastrg-2%"]["memory_met"]
    # Faster than dense, slower than BigBird; not run at 65536: nothing said there.
    assert goals["smart_bird"]["beats_bigbird_and_longformer"] == {16384: False, 65536: None}
    assert not goals["smart_bird"]["time_met"]
    assert goals["sparse_transformer"]["time_ratio"] is None and goals["sparse_transformer"]["time_met"] is None
    # A baseline that ran out of memory is beaten; one that was not run says nothing.
    report["results"][-1] = {"model": "hf:longformer", "length": 65536, "status": "oom"}
    report["results"][-2] = {"model": "hf:bigbird", "length": 65536, "status": "oom"}
    assert {g["model"]: g for g in gpu_check.goals(report)}["a2former"]["beats_bigbird_and_longformer"][65536]
    report["results"].pop()
    assert {g["model"]: g for g in gpu_check.goals(report)}["a2former"]["beats_bigbird_and_longformer"][65536] is None
    table = "\n".join(gpu_check.goals_markdown(gpu_check.goals(report)))
    assert "| a2former | 0.30 | ≤ 0.35 | yes | 1.05 | ≤ 1.1 | yes | yes | – |" in table


def test_a_row_that_raises_fails_the_stage_but_out_of_memory_does_not(gpu_check):
    def result(model, length, status):
        return {"model": model, "length": length, "status": status}

    report = {
        "results": [
            result("dense_transformer", 1024, "ok"),
            result(
                "dense_transformer", 32768, "error: OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB"
            ),
            result("hf:bigbird", 32768, "skipped: too slow"),
            result("a2former", 1024, "error: RuntimeError: triton launch failed"),
            result("a2former", 2048, "error: RuntimeError: triton launch failed"),
        ]
    }
    assert gpu_check.raised_rows(report) == {"a2former": "error: RuntimeError: triton launch failed (N = 1024)"}


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU stand-in of the GPU run")
def test_dry_run_of_the_speed_plan_runs_every_stage_and_writes_its_files(gpu_check, tmp_path):
    """`bash scripts/run.sh gpu speed` on the CPU at toy sizes: sanity, proxies, kernels, the benchmark with the
    floor and the peers, and the profiles, each summarised in summary.json and README.md."""
    assert gpu_check.main(["speed", "--dry-run", "--output-dir", str(tmp_path), "--lengths", "64", "128"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    stages = summary["stages"]
    assert list(stages) == ["sanity", "proxies", "kernels", "profile", "bench-speed"]
    assert all(stage["passed"] for stage in stages.values()), {k: v for k, v in stages.items() if not v["passed"]}
    # sanity: SDPA's kernel for each head dim and mask; every family's step checked
    assert {(c["head_dim"], c["mask"]) for c in stages["sanity"]["sdpa"]} == {
        (d, m) for d in (64, 8, 4) for m in (False, True)
    }
    assert [c["row"] for c in stages["sanity"]["syncs"]][:2] == ["dense_transformer", "null_attention"]
    # proxies and kernels: their tables, every benchmark ran
    proxies = json.loads((tmp_path / "proxies.json").read_text())
    assert proxies["errors"] == {} and "sparse_transformer" in proxies["summaries"]
    kernels = json.loads((tmp_path / "kernels.json").read_text())
    assert kernels["results"][0]["name"] == "sdpa" and all(r["error"] is None for r in kernels["results"])
    # the benchmark: the floor and the four peers beside every family, the crossover table, the goals
    report = json.loads((tmp_path / stages["bench-speed"]["files"]["json"]).read_text())
    timed = {r["model"] for r in report["results"] if r["status"] == "ok"}
    assert {"null_attention", "hf:bert-sdpa", "hf:longformer", "hf:bigbird", "hf:modernbert"} <= timed
    assert {"sbm:fastrg-60/query", "smart_bird"} <= timed
    assert {goal["model"] for goal in stages["bench-speed"]["goals"]} == set(gpu_check.TIME_GOALS)
    # the profiles: a trace and a table per family
    assert all(p["error"] is None for p in stages["profile"]["profiles"])
    assert (tmp_path / "profile" / "fsat.json.gz").stat().st_size > 0 and (tmp_path / "profile" / "fsat.txt").exists()
    readme = (tmp_path / "README.md").read_text()
    for heading in (
        "## sanity",
        "## CPU proxies",
        "## kernel micro-benchmarks",
        "faster than dense from",
        "## profile",
    ):
        assert heading in readme


def test_a_crashed_stage_costs_no_other_and_an_interrupt_keeps_what_ran(gpu_check, tmp_path, monkeypatch):
    """One device call is all a GPU session may get: a stage that raises is recorded and the next runs; `timeout -s
    INT` ends the run with the stages so far written."""
    ran = []

    def crash(*args, **kwargs):
        ran.append("kernels")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def interrupted(*args, **kwargs):
        ran.append("profile")
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check.gpu_speed, "run_kernels", crash)
    monkeypatch.setattr(gpu_check.gpu_speed, "run_profile", interrupted)
    argv = ["kernels", "profile", "bench-speed", "--dry-run", "--output-dir", str(tmp_path)]
    assert gpu_check.main(argv) == 1
    assert ran == ["kernels", "profile"], "the crash did not stop the run; the interrupt did"
    stages = json.loads((tmp_path / "summary.json").read_text())["stages"]
    assert stages["kernels"]["crashed"].startswith("RuntimeError: CUDA error")
    assert stages["profile"]["crashed"].startswith("interrupted") and "bench-speed" not in stages
    readme = (tmp_path / "README.md").read_text()
    assert "stage `kernels` crashed: RuntimeError" in readme and "stage `profile` crashed: interrupted" in readme


def test_stage_budgets_leave_the_later_stages_their_time(gpu_check):
    speed = list(gpu_check.PLANS["speed"])
    deadline = time.monotonic() + 450
    assert gpu_check.gpu_speed.stage_budget("sanity", speed, deadline) == pytest.approx(90, abs=1)
    # Late: the profile gets what is left after the benchmark's reserve; the benchmark, last, all that is left.
    assert gpu_check.gpu_speed.stage_budget("profile", speed, time.monotonic() + 250) == pytest.approx(40, abs=1)
    assert gpu_check.gpu_speed.stage_budget("bench-speed", speed, time.monotonic() + 300) == pytest.approx(300, abs=1)
    assert gpu_check.gpu_speed.stage_budget("profile", speed, time.monotonic() - 5) == 0
    assert gpu_check.parse_args(["speed", "tests"]).stages == [*speed, "tests"]


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_run_sh_gpu_puts_attnzoo_on_the_path_and_refuses_without_cuda():
    env = {**os.environ, "PYTHON": sys.executable}
    process = subprocess.run(
        ["bash", "scripts/run.sh", "gpu", "tests"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert process.returncode == 2, process.stderr[-2000:]
    assert "attnzoo from" in process.stdout and "--dry-run" in process.stdout

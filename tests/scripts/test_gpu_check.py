"""`scripts/tools/gpu_check.py` (`bash scripts/run.sh gpu`): its dry run on the CPU, its summaries and the shell
glue."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from source_checkout import REPO_ROOT


@pytest.fixture
def gpu_check(load_script):
    module = load_script("tools/gpu_check")
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)  # the benchmark pins one thread; later tests keep theirs


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


def test_goals_compare_each_method_at_16384_with_dense_bigbird_and_longformer(gpu_check):
    def result(model, ms, ratio, memory_ratio=None):
        memory = None if memory_ratio is None else {"fwd_bwd_ratio": memory_ratio}
        timing = {"ms": ms, "ratio": ratio}
        return {"model": model, "length": 16384, "status": "ok", "fwd_bwd": timing, "memory": memory}

    report = {
        "results": [
            result("dense_transformer", 100.0, 1.0, 1.0),
            result("a2former", 40.0, 0.4, 1.2),
            result("fsat", 60.0, 0.6, 1.5),
            result("smart_bird", 90.0, 0.9, 1.0),
            result("hf:bigbird", 80.0, 0.8),
            result("hf:longformer", 120.0, 1.2),
        ]
    }
    goals = {goal["model"]: goal for goal in gpu_check.goals(report)}
    assert goals["a2former"]["time_met"] and goals["a2former"]["memory_met"]
    assert goals["a2former"]["beats_bigbird_and_longformer"]
    assert not goals["fsat"]["time_met"] and not goals["fsat"]["memory_met"]
    # Faster than dense, but slower than BigBird.
    assert goals["smart_bird"]["time_met"] and not goals["smart_bird"]["beats_bigbird_and_longformer"]
    assert goals["sparse_transformer"]["time_ratio"] is None and goals["sparse_transformer"]["time_met"] is None
    # A baseline that ran out of memory is beaten; one that was not run says nothing.
    report["results"][-1] = {"model": "hf:longformer", "length": 16384, "status": "oom"}
    assert {goal["model"]: goal for goal in gpu_check.goals(report)}["a2former"]["beats_bigbird_and_longformer"]
    report["results"].pop()
    assert {goal["model"]: goal for goal in gpu_check.goals(report)}["a2former"][
        "beats_bigbird_and_longformer"
    ] is None


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_run_sh_gpu_puts_attnzoo_on_the_path_and_refuses_without_cuda():
    env = {**os.environ, "PYTHON": sys.executable}
    process = subprocess.run(
        ["bash", "scripts/run.sh", "gpu", "tests"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert process.returncode == 2, process.stderr[-2000:]
    assert "attnzoo from" in process.stdout and "--dry-run" in process.stdout

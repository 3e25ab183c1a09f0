"""End-to-end and unit tests of the benchmark harness (`scripts/benchmark.py`, `attnzoo.benchmarking`).

Timing numbers are noise on a shared CI machine, so the tests check the plumbing (schema, files, finite positive
ratios, skipping) and only the deterministic quantities (saved-for-backward bytes) for values.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

import attnzoo.fsat.attention_fsat as fsat_attention
from attnzoo.benchmarking import (
    LEVELS,
    MAX_DEFAULT_CHECK_LENGTH,
    MODES,
    REFERENCE_MODEL,
    SCHEMA_VERSION,
    BenchmarkSettings,
    ModelSize,
    benchmark_models,
    check_equivalence,
    crossover_table,
    markdown_report,
    run_benchmark,
    runner,
    summarize,
    timing,
    timing_sweep,
)
from attnzoo.benchmarking.variants import VARIANTS
from attnzoo.benchmarking.workload import Workload
from session_once import once_per_session
from source_checkout import load_script

TINY = ModelSize(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One end-to-end run of the script: dense family and BERT (sdpa), N=64/128, memory subprocesses at N=64.

    About 30 s of memory subprocesses: under pytest-xdist it runs once per test session (`session_once`), not once
    in each process that gets one of these tests."""
    output_dir = once_per_session(tmp_path_factory, "benchmark-tiny-run", _run_tiny_benchmark)
    return json.loads((output_dir / "benchmark.json").read_text()), output_dir


def _run_tiny_benchmark(output_dir: Path) -> None:
    script = load_script("benchmark")
    argv = [
        "--families", "dense_transformer", "--hf-baselines", "bert-sdpa", "--lengths", "64", "128", "--rounds", "1",
        "--warmup", "1", "--level", "both", "--memory", "--memory-lengths", "64", "--memory-jobs", "2",
        "--vocab-size", "512", "--hidden-size", "64", "--intermediate-size", "128",
        "--output-dir", str(output_dir), "--quiet",
    ]  # fmt: skip
    assert script.main(argv) == 0


def test_json_schema(tiny_run: tuple[dict, Path]) -> None:
    report, _ = tiny_run
    assert report["schema_version"] == SCHEMA_VERSION
    assert report["reference"] == REFERENCE_MODEL
    machine = report["machine"]
    for key in ("cpu_model", "threads", "torch", "transformers", "git_commit", "date_start", "date_end"):
        assert key in machine
    assert machine["threads"] == 1
    assert len(machine["loadavg_start"]) == 3 and len(machine["loadavg_end"]) == 3
    assert report["settings"]["lengths"] == [64, 128]
    assert [m["name"] for m in report["models"]] == ["dense_transformer", "null_attention", "hf:bert-sdpa"]
    assert report["models"][0]["equivalence"]["passed"] is True
    assert report["models"][1]["equivalence"] is None and report["models"][2]["equivalence"] is None
    keys = {(r["model"], r["level"], r["length"]) for r in report["results"]}
    assert keys == {
        (m, level, n)
        for m in ("dense_transformer", "null_attention", "hf:bert-sdpa")
        for level in LEVELS
        for n in (64, 128)
    }


def test_ratios_positive_and_finite(tiny_run: tuple[dict, Path]) -> None:
    report, _ = tiny_run
    for result in report["results"]:
        assert result["status"] == "ok", result
        for mode in MODES:
            timing = result[mode]
            assert timing["ms"] > 0 and math.isfinite(timing["ms"])
            assert timing["ratio"] > 0 and math.isfinite(timing["ratio"])
            assert timing["ratio_iqr"][0] <= timing["ratio"] <= timing["ratio_iqr"][1]
            if result["model"] == REFERENCE_MODEL:
                assert timing["ratio"] == pytest.approx(1.0)
        assert result["saved_for_backward_mb"] > 0 and math.isfinite(result["saved_ratio"])


def test_memory_only_where_asked(tiny_run: tuple[dict, Path]) -> None:
    report, _ = tiny_run
    for result in report["results"]:
        if result["length"] != 64:
            assert result["memory"] is None
            continue
        memory = result["memory"]
        assert memory["method"] == "cpu_vmhwm"
        assert memory["fwd_bwd_mb"] >= 0 and memory["fwd_bwd_ratio"] is not None
        assert math.isfinite(memory["fwd_bwd_ratio"])


def test_saved_bytes_match_bert(tiny_run: tuple[dict, Path]) -> None:
    """Deterministic fairness check: our dense family and BERT-sdpa of the same size save the same activations."""
    report, _ = tiny_run
    for result in report["results"]:
        if result["model"] == "hf:bert-sdpa":
            assert 0.8 < result["saved_ratio"] < 1.25, result


def test_the_floor_row_keeps_less_than_dense(tiny_run: tuple[dict, Path]) -> None:
    """The null attention keeps only the values for its attention, so it saves less for backward than dense at
    every level and length (its time is noise on a shared machine)."""
    report, _ = tiny_run
    floor = [r for r in report["results"] if r["model"] == "null_attention"]
    assert len(floor) == 4  # two levels, two lengths
    for result in floor:
        assert result["saved_ratio"] < 1.0, result


def test_report_files(tiny_run: tuple[dict, Path]) -> None:
    report, output_dir = tiny_run
    assert (output_dir / "benchmark.png").stat().st_size > 0
    table = (output_dir / "benchmark.md").read_text()
    assert "| 128 | hf:bert-sdpa |" in table and "one encoder layer" in table
    # two lengths: the crossover table, one line per row but dense
    assert "| model | N = 64 | N = 128 | faster than dense from |" in table
    assert sum(line.startswith("| null_attention | ") for line in table.splitlines()) == 2  # model and layer


def test_failed_equivalence_is_flagged(tiny_run: tuple[dict, Path]) -> None:
    report = copy.deepcopy(tiny_run[0])
    report["models"][0]["equivalence"].update(passed=False, output_error=3.0)
    table = markdown_report(report)
    assert "⚠ **dense_transformer: fast path ≠ reference path**" in table
    assert "| 64 | dense_transformer † |" in table


def test_too_slow_lengths_are_skipped() -> None:
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=[], lengths=[32, 64], rounds=1, warmup=0, levels=["layer"],
        max_seconds_per_step=1e-9, size=TINY, check_equivalence=False,
    )  # fmt: skip
    entries = {e["length"]: e for e in timing_sweep(settings)["entries"]}
    assert entries[32]["status"] == "ok" and "longer lengths skipped" in entries[32]["notes"][0]
    assert entries[64]["status"] == "skipped: too slow"


def test_a_slow_warm_up_alone_does_not_skip_the_longer_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first step that compiles (Triton, FlexAttention) takes seconds; the timed steps decide."""
    steps = iter([5.0] + [1e-3] * 100)  # the first warm-up step, then every other one
    monkeypatch.setattr(timing, "timed", lambda step, device: (step(), next(steps))[1])
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=[], rows=["dense_transformer"], lengths=[32, 64], rounds=2,
        warmup=1, levels=["layer"], max_seconds_per_step=1.0, size=TINY, check_equivalence=False,
    )  # fmt: skip
    entries = {e["length"]: e for e in timing_sweep(settings)["entries"]}
    assert entries[32]["warmup_s"]["fwd"] == 5.0 and not entries[32]["notes"]
    assert entries[64]["status"] == "ok"


def test_the_equivalence_checks_spend_from_the_benchmarks_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 s of budget, 30 s of them taken by the equivalence check: at the first length's pace (10 s for 32 tokens)
    the 20 s that 64 tokens need are no longer there."""
    now = [0.0]
    monkeypatch.setattr(timing, "_clock", lambda: now[0])

    def slow_check(*args, **kwargs):
        now[0] += 30.0
        return {"passed": True}

    def ten_seconds(rows, length, *args):
        now[0] += 10.0
        return measure(rows, length, *args)

    measure = timing._length_entries
    monkeypatch.setattr(runner, "check_equivalence", slow_check)
    monkeypatch.setattr(timing, "_length_entries", ten_seconds)
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=[], rows=["dense_transformer"], lengths=[32, 64], rounds=1,
        warmup=0, levels=["layer"], size=TINY, time_budget_s=40.0,
    )  # fmt: skip
    statuses = {r["length"]: r["status"] for r in run_benchmark(settings, log=lambda message: None)["results"]}
    assert statuses == {32: "ok", 64: "skipped: time budget"}


def test_an_interrupted_sweep_reports_the_lengths_it_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C, or `timeout -s INT` ahead of a device call's limit, during N=64: N=32 is a result, the rest marked."""
    measure = timing._length_entries

    def interrupted_at_64(rows, length, *args):
        if length == 64:
            raise KeyboardInterrupt
        return measure(rows, length, *args)

    monkeypatch.setattr(timing, "_length_entries", interrupted_at_64)
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=[], rows=["dense_transformer"], lengths=[32, 64, 128], rounds=1,
        warmup=0, levels=["layer"], size=TINY, check_equivalence=False,
    )  # fmt: skip
    entries = {e["length"]: e["status"] for e in timing_sweep(settings)["entries"]}
    assert entries == {32: "ok", 64: "skipped: interrupted", 128: "skipped: interrupted"}


def test_an_interrupt_while_memory_is_measured_closes_every_workload_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workload being measured is still closed by the cleanup, and none is closed twice."""
    closed: list[int] = []
    close = Workload.close

    def counted_close(self) -> None:
        closed.append(id(self))
        close(self)

    def interrupted(workload, settings):
        if workload.level == "model":
            raise KeyboardInterrupt
        return {}

    monkeypatch.setattr(Workload, "close", counted_close)
    monkeypatch.setattr(timing, "in_process_memory", interrupted)
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=[], rows=["dense_transformer"], lengths=[32], rounds=1,
        warmup=0, levels=["layer", "model"], size=TINY, check_equivalence=False,
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        rows = benchmark_models(settings.families, settings.hf_baselines, errors={}, keep=settings.rows)
        timing._length_entries(rows, 32, settings, set(), lambda message: None)
    assert len(closed) == 2 and len(set(closed)) == 2


def test_extra_lengths_only_for_families() -> None:
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=["bert-sdpa"], lengths=[32], extra_lengths=[64], rounds=1,
        warmup=0, levels=["model"], size=TINY, check_equivalence=False,
    )  # fmt: skip
    ran = {(e["model"], e["length"]) for e in timing_sweep(settings)["entries"]}
    assert ran == {
        ("dense_transformer", 32),
        ("null_attention", 32),
        ("hf:bert-sdpa", 32),
        ("dense_transformer", 64),
        ("null_attention", 64),
    }


def test_rows_and_errors() -> None:
    rows = benchmark_models(["dense_transformer"], ["longformer", "bert-sdpa"])
    assert [row.name for row in rows] == ["dense_transformer", "null_attention", "hf:longformer", "hf:bert-sdpa"]
    assert rows[2].global_first_token
    with pytest.raises(ValueError, match="Unknown family"):
        benchmark_models(["no_such_family"], [])
    errors: dict[str, str] = {}
    assert [row.name for row in benchmark_models(["no_such_family", "dense_transformer"], [], errors)] == [
        "dense_transformer",
        "null_attention",
    ]
    assert "no_such_family" in errors
    with pytest.raises(ValueError, match="Unknown level or HF baseline"):
        BenchmarkSettings(hf_baselines=["gpt2"])


def test_default_check_length_is_capped() -> None:
    # The check's reference path is dense: a run of only 32768-token rows once went out of memory in it.
    assert BenchmarkSettings(lengths=[1024, 512]).default_check_length() == 512
    assert BenchmarkSettings(lengths=[32768]).default_check_length() == MAX_DEFAULT_CHECK_LENGTH
    assert BenchmarkSettings(lengths=[32768], check_length=8192).default_check_length() == 8192


def test_summarize() -> None:
    assert summarize([2.0]) == (2.0, [2.0, 2.0])
    median, (q1, q3) = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (median, q1, q3) == (3.0, 2.0, 4.0)


@pytest.mark.slow
def test_repeated_runs_in_subprocesses(tmp_path: Path) -> None:
    """`--runs 2` times in two fresh processes and reports both runs' median ratios."""
    script = load_script("benchmark")
    argv = [
        "--families", "dense_transformer", "--hf-baselines", "bert-sdpa", "--lengths", "64", "--rounds", "3",
        "--runs", "2", "--level", "model", "--vocab-size", "512", "--hidden-size", "64", "--intermediate-size", "128",
        "--output-dir", str(tmp_path), "--quiet",
    ]  # fmt: skip
    assert script.main(argv) == 0
    report = json.loads((tmp_path / "benchmark.json").read_text())
    bert = next(r for r in report["results"] if r["model"] == "hf:bert-sdpa")
    assert len(bert["fwd_bwd"]["run_ratios"]) == 2 and bert["fwd_bwd"]["rounds"] == 6
    assert len(report["machine"]["runs"]) == 2


def test_benchmark_variants_are_extra_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(VARIANTS, "dense_transformer", {"pre-norm": {"pre_norm": True}})
    rows = benchmark_models(["dense_transformer"], [])
    assert [row.name for row in rows] == ["dense_transformer", "null_attention", "dense_transformer:pre-norm"]
    assert rows[2].overrides == {"pre_norm": True} and rows[2].variant == "pre-norm"
    model = rows[2].build(TINY, 32)
    assert model.config.pre_norm and model.config.max_position_embeddings == 34 and not model.training
    # `keep` (the `--rows` option) times one variant next to the dense family and names unknown rows.
    assert [
        row.name
        for row in benchmark_models(
            ["dense_transformer"], ["bert-sdpa"], keep=["dense_transformer:pre-norm", "dense_transformer"]
        )
    ] == [
        "dense_transformer",
        "dense_transformer:pre-norm",
    ]
    with pytest.raises(ValueError, match=r"Unknown benchmark rows \['dense_transformer:post-norm'\]"):
        benchmark_models(["dense_transformer"], [], keep=["dense_transformer", "dense_transformer:post-norm"])


def test_benchmark_variant_settings_can_follow_the_length(monkeypatch: pytest.MonkeyPatch) -> None:
    def heads_by_length(length: int) -> dict:
        """one head up to 32 tokens, two beyond"""
        return {"num_attention_heads": 1 if length <= 32 else 2}

    monkeypatch.setitem(VARIANTS, "dense_transformer", {"by-length": heads_by_length})
    row = benchmark_models(["dense_transformer"], [])[2]
    assert row.build(TINY, 32).config.num_attention_heads == 1
    assert row.build(TINY, 64).config.num_attention_heads == 2
    assert row.describe()["overrides"] == {"per_length": "one head up to 32 tokens, two beyond"}


def test_equivalence_check_is_not_fooled_by_a_moved_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """FSAT's fast and reference paths agree on the same input, but in a 2-layer model the first layer's round-off
    moves a few predicted positions of the second one (with a 2-layer check: 1.3x the tolerance at this length,
    15x at 8192, in a handful of outputs): the check must compare the kernels, not that chaotic dependence, and
    must still catch a wrong kernel."""
    (row,) = benchmark_models(["fsat"], [], {}, keep=["fsat"])
    settings = BenchmarkSettings(lengths=[2048], levels=["model"])
    assert settings.size.num_hidden_layers == 2
    result = check_equivalence(row, settings, 2048)
    assert result["passed"] is True and result["output_error"] < 0.1, result

    # A fast path 10% off is caught (the reference backend goes through the same dispatch: leave it alone).
    kernel = fsat_attention.key_slot_attention

    def ten_percent_off(*args, **kwargs):
        out, pairs = kernel(*args, **kwargs)
        return (out, pairs) if kwargs["backend"] == "reference" else (out * 1.1, pairs)

    monkeypatch.setattr(fsat_attention, "key_slot_attention", ten_percent_off)
    wrong = check_equivalence(row, settings, 2048)
    assert wrong["passed"] is False, wrong


def test_crossover_is_the_shortest_length_from_which_a_row_stays_faster() -> None:
    def result(model: str, length: int, ratio: float | None, status: str = "ok") -> dict:
        return {"model": model, "level": "model", "length": length, "status": status, "fwd_bwd": {"ratio": ratio}}

    report = {
        "results": [
            *(result("dense_transformer", n, 1.0) for n in (1024, 4096, 16384, 65536)),
            # slower, faster, slower again, faster: the crossover is where it stays faster
            *(result("a", n, r) for n, r in ((1024, 1.4), (4096, 0.9), (16384, 1.1), (65536, 0.5))),
            # faster everywhere it ran; out of memory at the longest length does not undo that
            *(result("b", n, r) for n, r in ((1024, 0.8), (4096, 0.7), (16384, 0.6))),
            result("b", 65536, None, "error: OutOfMemoryError: CUDA out of memory"),
            # never faster
            *(result("c", n, 1.5) for n in (1024, 4096, 16384, 65536)),
        ]
    }
    table = crossover_table(report)
    assert set(table) == {"a", "b", "c"}
    assert (table["a"]["crossover"], table["b"]["crossover"], table["c"]["crossover"]) == (65536, 1024, None)
    assert table["b"]["ratios"][65536] is None and table["b"]["faster_at_longest"]
    assert not table["c"]["faster_at_longest"]


@pytest.mark.parametrize("budget,ran", [(0.0, {32}), (25.0, {32}), (40.0, {32, 64}), (None, {32, 64})])
def test_a_length_runs_only_while_the_time_budget_holds_it(monkeypatch: pytest.MonkeyPatch, budget, ran) -> None:
    """At the pace of the previous length (10 s for 32 tokens here), 64 tokens need 20 s more: a budget of 25 s
    skips them, one of 40 s does not; the first length runs whatever is left (the equivalence checks spend from the
    same budget)."""
    ticks = iter([0.0, 0.0, 10.0, 10.0, 30.0])  # budget start, N=32 start and end, N=64 start and end
    monkeypatch.setattr(timing, "_clock", lambda: next(ticks))
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=[], rows=["dense_transformer"], lengths=[32, 64], rounds=1,
        warmup=0, levels=["layer"], size=TINY, check_equivalence=False, time_budget_s=budget,
    )  # fmt: skip
    entries = {e["length"]: e["status"] for e in timing_sweep(settings)["entries"]}
    assert {n for n, status in entries.items() if status == "ok"} == ran
    assert all(status == "skipped: time budget" for n, status in entries.items() if n not in ran)

"""`scripts/experiments/warm-start/run.py`: the table it writes into the study's README, and its parallel runner."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest


@pytest.fixture
def evidence(load_script):
    return load_script("experiments/warm-start/run")


def test_the_committed_table_is_the_one_the_results_give(evidence):
    # The study's README must hold what the committed step JSONs render: a hand edit, or results committed without
    # `run.py table`, leaves it out of step.
    placed = evidence.tables()
    assert placed, "scripts/experiments/warm-start/results/convert.json is missing: the study's table has no source"
    # One file holds the table, the study's write-up: the cards go to the Hub and the front-door README links here.
    readme = evidence.ROOT / "scripts" / "experiments" / "warm-start" / "README.md"
    assert list(placed) == [readme]
    table = placed[readme]
    for family in evidence.ALL_FAMILIES:
        assert f"\n| {family} | " in table, f"the table has no row for {family}"
    text = readme.read_text(encoding="utf-8")
    assert evidence.with_table(text, table, readme) == text, f"{readme}: run `run.py table`"


def test_with_table_replaces_only_between_the_markers(evidence):
    begin, end = evidence.TABLE_BEGIN, evidence.TABLE_END
    text = f"intro\n{begin}\n| old |\n{end}\nafter\n"
    assert evidence.with_table(text, "| new |", Path("x.md")) == f"intro\n{begin}\n| new |\n{end}\nafter\n"
    with pytest.raises(ValueError, match="x.md has no warm-start table markers"):
        evidence.with_table("intro\n| old |\n", "| new |", Path("x.md"))


def test_in_parallel_runs_side_by_side_and_keeps_the_tasks_order(evidence, monkeypatch):
    monkeypatch.setattr(evidence, "JOBS", 2)
    both_running = threading.Barrier(2, timeout=10)

    def task(name: str, delay: float):
        def run() -> str:
            both_running.wait()  # fails (BrokenBarrierError) unless the two tasks run at the same time
            time.sleep(delay)
            return name

        return run

    assert evidence.in_parallel({"slow": task("slow", 0.2), "fast": task("fast", 0.0)}) == {
        "slow": "slow",
        "fast": "fast",
    }
    assert list(evidence.in_parallel({"b": lambda: 2, "a": lambda: 1})) == ["b", "a"]


def test_mcnemar_is_the_exact_two_sided_binomial_tail(evidence):
    assert evidence.mcnemar(0, 0) == 1.0
    assert evidence.mcnemar(10, 0) == pytest.approx(2 / 2**10)  # all ten discordant examples on one side
    assert evidence.mcnemar(3, 7) == evidence.mcnemar(7, 3) == pytest.approx(2 * (1 + 10 + 45 + 120) / 2**10)
    assert evidence.mcnemar(5, 5) == 1.0  # an even split is no evidence either way (the tail is capped at 1)


def test_a_rerun_for_some_families_replaces_their_records_and_keeps_the_others(evidence):
    previous = {
        "ran_on": {"commit": "a"},
        "budget": {"steps": 60},
        "source": {"eval_128": {"seconds": 3.0}},
        "fsat-512": {"eval_128": {"eval_loss": 6.6}, "note": "old"},
        "sbm-512": {"eval_128": {"eval_loss": 5.8}},
    }
    rerun = {
        "budget": {"steps": 60},
        "source": {"eval_128": {"reused": True}},
        "fsat-512": {"eval_128": {"eval_loss": 6.1}},
    }
    merged = evidence.merge_rerun(previous, rerun, {"commit": "b", "jobs": 2})
    # the rerun family's record is replaced whole (no stale field survives) and says where it ran
    assert merged["fsat-512"] == {"eval_128": {"eval_loss": 6.1}, "rerun": {"commit": "b", "jobs": 2}}
    # the other families and the shared records (which the rerun only reused) are kept as they were
    assert merged["sbm-512"] == previous["sbm-512"] and merged["source"] == previous["source"]
    assert merged["ran_on"] == {"commit": "a"}
    # per-task results (`paired`) are merged one level down
    paired = {"sst2": {"sbm": {"p": 0.1}, "fsat": {"p": 0.7}}}
    nested = evidence.merge_rerun(paired, {"sst2": {"fsat": {"p": 0.2}}}, {"commit": "b"})
    assert nested == {"sst2": {"sbm": {"p": 0.1}, "fsat": {"p": 0.2, "rerun": {"commit": "b"}}}}
    with pytest.raises(ValueError, match="budget changed"):
        evidence.merge_rerun(previous, {"budget": {"steps": 120}}, {"commit": "b"})

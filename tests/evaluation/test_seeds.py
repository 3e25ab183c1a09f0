"""A seed sweep read together (`attnzoo.evaluation.seeds`, `scripts/experiments/long-inputs/seeds.py`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attnzoo.evaluation.report import save_results
from attnzoo.evaluation.seeds import (
    find_row,
    load_seed_rows,
    paired_difference,
    seeds_markdown,
    seeds_records,
)
from source_checkout import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
SIZE = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512}


def write_folder(
    path: Path,
    seed: int,
    accuracies: dict[tuple[str, int], float],
    *,
    settings: dict[str, Any] | None = None,
    task_info: dict[str, dict[str, dict[str, Any]]] | None = None,
    task: str = "text",
    **budget,
) -> Path:
    """A results folder as `run_long_eval.py` leaves it: one seed, runs of `task` with the given accuracies, further
    `settings` (e.g. `validation_size`) and `task_info` when given (older files have neither)."""
    runs = [
        {"task": task, "label": label, "length": length, "accuracy": accuracy, "device": "cpu"}
        for (label, length), accuracy in accuracies.items()
    ]
    results: dict[str, Any] = {
        "settings": {"size": SIZE, "budget": {"steps": 1500, "seed": seed, **budget}, **(settings or {})},
        "runs": runs,
    }
    if task_info is not None:
        results["task_info"] = task_info
    save_results(path / "long_eval.json", results)
    return path


def text_info(pooling: str | None, lengths: tuple[int, ...] = (1024,), truncated: int = 0) -> dict[str, Any]:
    """Text's `task_info` as `run_long_eval` writes it (`pooling=None`: a file from before the task had overrides);
    `truncated` stands for the counts that describe the data without choosing it."""
    overrides = {} if pooling is None else {"model_overrides": {"classifier_pooling": pooling}}
    info = {"train_truncated": truncated, "split_seed": 0, "tokenizer": "bytes", **overrides}
    return {"text": {str(length): dict(info) for length in lengths}}


def test_rows_pair_by_seed_and_are_split_by_what_differs_between_folders(tmp_path):
    folders = [
        # an older folder without `pretrain_steps` reads as its default, 0: the same protocol as the explicit 0
        write_folder(tmp_path / "a0", 0, {("dense", 1024): 0.60, ("a2", 4096): 0.62}),
        write_folder(tmp_path / "a1", 1, {("dense", 1024): 0.58, ("a2", 4096): 0.62}, pretrain_steps=0),
        write_folder(tmp_path / "a2", 2, {("a2", 4096): 0.50}, pretrain_steps=0),
        write_folder(tmp_path / "b0", 0, {("dense", 1024): 0.55}, pretrain_steps=900),
    ]
    rows = load_seed_rows(folders)
    assert [row.name for row in rows] == [
        "a2@4096 (pretrain_steps=0)",
        "dense@1024 (pretrain_steps=0)",
        "dense@1024 (pretrain_steps=900)",
    ]
    a2, dense = rows[0], rows[1]
    assert a2.accuracies == {0: 0.62, 1: 0.62, 2: 0.50}
    assert math.isclose(a2.mean, 0.58) and math.isclose(a2.sd, math.sqrt(((0.04**2) * 2 + 0.08**2) / 2))

    # seed 2 has no dense run: the pairing uses seeds 0 and 1 only (differences 0.02 and 0.04)
    diff = paired_difference(a2, dense)
    assert diff.seeds == (0, 1) and (diff.ahead, diff.behind) == (2, 0)
    assert math.isclose(diff.mean, 0.03) and math.isclose(diff.standard_error, 0.01)

    # with only seed-varying folders there is no protocol in the names
    assert [row.name for row in load_seed_rows(folders[:2])] == ["a2@4096", "dense@1024"]


def test_rows_are_split_by_task_settings_that_differ_between_folders(tmp_path):
    accuracies = {("dense", 1024): 0.60, ("a2", 4096): 0.62}
    lengths = (1024, 4096)

    def names(*folders: Path) -> list[str]:
        return [row.name for row in load_seed_rows(folders)]

    # The same task settings, whatever the counts that describe the data and the threads: one row per model.
    same = [
        write_folder(
            tmp_path / f"same{seed}",
            seed,
            accuracies,
            settings={"validation_size": 500, "reviews": "sha256:aa", "torch_threads": seed + 1},
            task_info=text_info("mean", lengths, truncated=seed),
        )
        for seed in range(2)
    ]
    assert names(*same) == ["a2@4096", "dense@1024"]
    assert load_seed_rows(same)[1].accuracies == {0: 0.60, 1: 0.60}

    def seed1(name: str, pooling: str = "mean", **settings) -> Path:
        """Seed 1 in its own folder, with the given Text pooling and settings."""
        return write_folder(tmp_path / name, 1, accuracies, settings=settings, task_info=text_info(pooling, lengths))

    # Another Text pooling (the task's config override): the seeds are two protocols, not two draws of one.
    cls = seed1("cls", "cls", validation_size=500, reviews="sha256:aa")
    assert names(same[0], cls) == [
        "a2@4096 (task.classifier_pooling=cls)",
        "dense@1024 (task.classifier_pooling=cls)",
        "a2@4096 (task.classifier_pooling=mean)",
        "dense@1024 (task.classifier_pooling=mean)",
    ]
    # A file from before the task had overrides ran with the family's own pooling: another protocol too.
    before = write_folder(tmp_path / "before", 1, accuracies, task_info=text_info(None, lengths))
    assert "dense@1024 (task.classifier_pooling=default)" in names(same[0], before)

    # Another validation set size, or another reviews file: two rows.
    small = seed1("small", validation_size=100, reviews="sha256:aa")
    assert names(same[0], small) == [
        "a2@4096 (validation_size=100)",
        "dense@1024 (validation_size=100)",
        "a2@4096 (validation_size=500)",
        "dense@1024 (validation_size=500)",
    ]
    other_reviews = seed1("other_reviews", validation_size=500, reviews="sha256:bb")
    assert names(same[0], other_reviews)[:2] == ["a2@4096 (reviews=sha256:aa)", "dense@1024 (reviews=sha256:aa)"]

    # A file that does not record the reviews (written before they were) is not set apart by that alone.
    unrecorded = seed1("unrecorded", validation_size=500)
    assert names(same[0], unrecorded) == ["a2@4096", "dense@1024"]


def test_listops_rows_are_split_by_tree_generator_and_not_by_other_tasks_settings(tmp_path):
    def listops_info(max_length: int) -> dict[str, Any]:
        generator = {"min_length": 10, "max_length": max_length, "max_depth": 10}
        info = {"validation_seed": 1_000_003, "generator": generator, "model_overrides": {"classifier_pooling": "cls"}}
        return {"listops": {"512": info}}

    short, long = (
        write_folder(tmp_path / f"s{seed}", seed, {("dense", 512): 0.3}, task="listops", task_info=listops_info(n))
        for seed, n in ((0, 100), (1, 500))
    )
    assert [row.name for row in load_seed_rows([short, long])] == [
        "dense@512 (generator.max_length=100)",
        "dense@512 (generator.max_length=500)",
    ]
    # A Text pooling that differs between two other folders does not rename the ListOps rows.
    texts = [
        write_folder(tmp_path / f"t{seed}", seed, {("dense", 1024): 0.6}, task_info=text_info(pooling))
        for seed, pooling in ((0, "cls"), (1, "mean"))
    ]
    rows = load_seed_rows([short, *texts])
    assert [(row.task, row.name) for row in rows] == [
        ("listops", "dense@512"),
        ("text", "dense@1024 (task.classifier_pooling=cls)"),
        ("text", "dense@1024 (task.classifier_pooling=mean)"),
    ]


def test_markdown_and_records_carry_the_paired_difference(tmp_path):
    folders = [
        write_folder(tmp_path / "s0", 0, {("dense", 1024): 0.60, ("a2", 4096): 0.62}),
        write_folder(tmp_path / "s1", 1, {("dense", 1024): 0.58, ("a2", 4096): 0.62, ("st", 4096): 0.57}),
    ]
    rows = load_seed_rows(folders)
    baselines = {"text": find_row(rows, "text", "dense@1024")}
    markdown = seeds_markdown(rows, baselines)
    assert "| a2@4096 | 62.0 | 62.0 | 62.0 ± 0.0 | +3.0 ± 1.0 | 2 of 2 | cpu |" in markdown
    assert "| st@4096 | – | 57.0 | 57.0 ± – | -1.0 ± – | 0 of 1 | cpu |" in markdown
    records = {record["row"]: record for record in seeds_records(rows, baselines)}
    assert records["st@4096"]["sd"] is None and records["st@4096"]["paired_difference"]["standard_error"] is None
    assert "paired_difference" not in records["dense@1024"]
    json.dumps(list(records.values()), allow_nan=False)  # no NaN reaches the JSON


def test_a_seed_twice_and_an_unknown_baseline_are_refused(tmp_path):
    first = write_folder(tmp_path / "x", 0, {("dense", 1024): 0.60})
    copy = write_folder(tmp_path / "y", 0, {("dense", 1024): 0.61})
    with pytest.raises(ValueError, match="seed 0 of dense@1024 on text is already in another folder"):
        load_seed_rows([first, copy])
    with pytest.raises(ValueError, match="holds no runs"):
        load_seed_rows([tmp_path / "empty"])
    rows = load_seed_rows([first])
    with pytest.raises(ValueError, match=r"No 'text' row named 'dense@512'\. The rows are:\n  dense@1024"):
        find_row(rows, "text", "dense@512")


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_script_writes_markdown_and_json_and_names_a_missing_row(tmp_path):
    folders = [
        str(write_folder(tmp_path / f"s{seed}", seed, {("dense", 1024): 0.6, ("a2", 4096): 0.6 + seed / 100}))
        for seed in range(3)
    ]
    script = [sys.executable, str(REPO_ROOT / "scripts" / "experiments" / "long-inputs" / "seeds.py"), *folders]
    output = tmp_path / "out" / "seeds.md"
    done = subprocess.run(
        [*script, "--baseline", "dense@1024", "--output", str(output)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "| a2@4096 | 60.0 | 61.0 | 62.0 | 61.0 ± 1.0 | +1.0 ± 0.6 | 2 of 3 | cpu |" in output.read_text()
    numbers = json.loads(output.with_suffix(".json").read_text())
    assert [record["row"] for record in numbers] == ["a2@4096", "dense@1024"]
    assert numbers[0]["paired_difference"]["seeds"] == [0, 1, 2]

    # A missing baseline ends the script with the message alone (SystemExit with a string: exit status 1, no
    # traceback); in-process, since a second child would pay the imports again.
    with pytest.raises(SystemExit, match="No 'text' row named 'dense@512'") as missing:
        load_script("experiments/long-inputs/seeds").main([*folders, "--baseline", "dense@512"])
    assert isinstance(missing.value.code, str)

"""The ListOps length curriculum: shorter trees first, then the task's own; validation never changes."""

from __future__ import annotations

import itertools

import pytest

from attnzoo.evaluation import Budget, ListOpsCurriculum, ModelSize, Row, TaskPlan, listops_task, run_long_eval
from attnzoo.training.data.listops import ListOpsSettings
from source_checkout import load_script

TINY = ModelSize(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
TREES = ListOpsSettings(min_length=60, max_length=120)
SHORT = ListOpsSettings(min_length=10, max_length=30)


def tree_length(example: tuple[list[int], int]) -> int:
    return len(example[0]) - 2  # without [CLS] and [SEP]


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_the_stream_starts_with_the_curriculum_trees_then_draws_the_task_s_own():
    curriculum = ListOpsCurriculum(SHORT, examples=7)
    task = listops_task(128, validation_size=6, settings=TREES, curriculum=curriculum)
    stream = list(itertools.islice(task.train_stream(3), 20))
    assert all(10 <= tree_length(example) <= 30 for example in stream[:7])
    assert all(60 <= tree_length(example) <= 120 for example in stream[7:])
    assert stream == list(itertools.islice(task.train_stream(3), 20))  # seeded
    # The task's own trees and its validation set are those of the task without a curriculum.
    plain = listops_task(128, validation_size=6, settings=TREES)
    assert task.validation == plain.validation
    assert stream[7:] == list(itertools.islice(plain.train_stream(3), 13))
    assert task.info["curriculum"] == {"examples": 7, "generator": {**vars(SHORT)}}
    assert "curriculum" not in plain.info


def test_curriculum_trees_must_fit_the_length_and_be_at_least_one():
    with pytest.raises(ValueError, match="do not fit length 128"):
        listops_task(128, validation_size=4, settings=TREES, curriculum=ListOpsCurriculum(ListOpsSettings(), 5))
    with pytest.raises(ValueError, match="must be >= 1"):
        ListOpsCurriculum(SHORT, examples=0)


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_the_curriculum_is_a_setting_of_the_folder(tmp_path):
    budget = Budget(steps=3, batch_size=2, warmup_steps=1, eval_batch_size=8)
    plans, rows = [TaskPlan("listops", (128,))], [Row("dense_transformer")]
    kwargs = {"size": TINY, "budget": budget, "validation_size": 8, "listops_settings": TREES}
    results = run_long_eval(tmp_path / "with", plans, rows, listops_curriculum=ListOpsCurriculum(SHORT, 4), **kwargs)
    assert results["task_info"]["listops"]["128"]["curriculum"]["examples"] == 4
    for other in (None, ListOpsCurriculum(SHORT, 2)):
        with pytest.raises(ValueError, match="with curriculum"):
            run_long_eval(tmp_path / "with", plans, [Row("sbm")], listops_curriculum=other, **kwargs)
    run_long_eval(tmp_path / "without", plans, rows, **kwargs)  # a folder of runs without one refuses one
    with pytest.raises(ValueError, match="with curriculum None"):
        run_long_eval(
            tmp_path / "without", plans, [Row("sbm")], listops_curriculum=ListOpsCurriculum(SHORT, 4), **kwargs
        )


def test_script_counts_curriculum_steps_in_examples_and_ends_on_the_task_s_trees():
    script = load_script("run_long_eval")
    base = ["--output_dir", "x", "--steps", "100", "--batch_size", "4"]
    assert script.listops_curriculum(script.parse_args(base)) is None
    args = script.parse_args(
        [*base, "--listops_curriculum_steps", "75", "--listops_curriculum_tree_lengths", "50", "90"]
    )
    assert script.listops_curriculum(args) == ListOpsCurriculum(ListOpsSettings(min_length=50, max_length=90), 300)
    for steps in ("100", "-1"):
        with pytest.raises(ValueError, match="listops_curriculum_steps must be in"):
            script.listops_curriculum(script.parse_args([*base, "--listops_curriculum_steps", steps]))

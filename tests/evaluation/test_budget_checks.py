"""A run's budget, lengths and training seed are checked before anything trains (`long_eval.runner`)."""

from __future__ import annotations

import itertools
import math
import re

import pytest

from attnzoo.evaluation import runner
from attnzoo.evaluation.evaluate import Row, TaskPlan, planned_runs
from attnzoo.evaluation.runner import Budget, ModelSize, RunSpec
from attnzoo.evaluation.tasks import listops_task
from attnzoo.training.data.listops import ListOpsSettings

TINY = ModelSize(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
#: The shortest length a run takes: [CLS], one token of the example and [SEP] (`runner.MIN_LENGTH`).
SHORTEST = 3


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # an untrained model would be recorded as a result
        ({"steps": 0, "warmup_steps": 0}, "`steps` must be >= 1, got 0."),
        ({"steps": -5, "warmup_steps": 0}, "`steps` must be >= 1, got -5."),
        # `max() arg is an empty sequence` at the first batch
        ({"batch_size": 0}, "`batch_size` must be >= 1, got 0."),
        ({"batch_size": -1}, "`batch_size` must be >= 1, got -1."),
        # `range() arg 3 must not be zero`, only after the training
        ({"eval_batch_size": 0}, "`eval_batch_size` must be >= 1, got 0."),
        # a warm-up that never ends: the recorded learning rate is never reached
        ({"steps": 3, "warmup_steps": 100}, "`warmup_steps` must be in [0, steps=3], got 100."),
        ({"warmup_steps": -1}, "`warmup_steps` must be in [0, steps=600], got -1."),
        ({"pretrain_steps": 30}, "`warmup_steps` must be <= pretrain_steps=30"),
        ({"learning_rate": 0.0}, "`learning_rate` must be a positive number, got 0.0."),
        ({"learning_rate": -1.0}, "`learning_rate` must be a positive number, got -1.0."),
        ({"learning_rate": math.nan}, "`learning_rate` must be a positive number, got nan."),
        ({"weight_decay": -0.01}, "`weight_decay` must be >= 0, got -0.01."),
        ({"max_grad_norm": 0.0}, "`max_grad_norm` must be > 0, got 0.0."),
        # numpy's range (`transformers.set_seed`); torch would overflow only at 2**64, after the data is built
        ({"seed": -1}, "`seed` must be in [0, 2**32), got -1."),
        ({"seed": 2**32}, f"`seed` must be in [0, 2**32), got {2**32}."),
    ],
)
def test_budget_names_the_field_and_value_out_of_range(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Budget(**fields)


def test_budget_accepts_the_edges_of_every_range():
    Budget(steps=1, batch_size=1, eval_batch_size=1, warmup_steps=0)
    Budget(steps=1, warmup_steps=1, weight_decay=0.0)
    Budget(steps=100, warmup_steps=60, pretrain_steps=60)
    Budget(max_grad_norm=math.inf)  # no clipping
    Budget(seed=2**32 - 1)


def test_lengths_too_short_for_cls_and_sep_are_refused_before_any_task_is_built():
    for length in (-3, 0, SHORTEST - 1):
        with pytest.raises(ValueError, match=re.escape(f"`length` must be >= {SHORTEST}")):
            RunSpec("dense_transformer", length)
        # a TaskPlan's lengths reach the runs through RunSpec
        with pytest.raises(ValueError, match=re.escape(f"got {length}.")):
            planned_runs([TaskPlan("imdb", (512, length))], [Row("dense_transformer")])
    assert RunSpec("dense_transformer", SHORTEST).key == f"dense_transformer@{SHORTEST}"


def test_a_training_seed_equal_to_the_listops_validation_seed_is_refused_before_training(monkeypatch):
    settings = ListOpsSettings(min_length=10, max_length=30)
    task = listops_task(64, validation_size=8, settings=settings)
    spec = RunSpec("dense_transformer", 64)

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(runner, "optimize", no_training)
    colliding = Budget(steps=1, batch_size=8, warmup_steps=0, seed=task.info["validation_seed"])
    message = f"training seed {task.info['validation_seed']} is the listops task's validation seed"
    with pytest.raises(ValueError, match=message):
        runner.train_and_evaluate(task, spec, TINY, colliding)
    # `run_batches` is where every training stream is drawn (the pretraining and the neighbour probe too).
    with pytest.raises(ValueError, match=message):
        runner.run_batches(task, colliding)
    # It is the task's own validation seed that is refused, not a fixed number.
    other = listops_task(64, validation_size=8, validation_seed=7, settings=settings)
    with pytest.raises(ValueError, match="training seed 7 is the listops task's validation seed"):
        runner.run_batches(other, Budget(steps=1, batch_size=8, warmup_steps=0, seed=7))
    batch = next(runner.run_batches(other, colliding))
    assert len(batch) == 8 and batch != list(itertools.islice(other.validation, 8))

"""`TimeLimitCallback` and `--max_train_seconds`: every process of a distributed run stops at the same step, and the
limit must be positive (the programs' use of it: `tests/scripts/test_run_summarization.py`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import TrainerControl, TrainerState

from attnzoo.training import SummarizationDataArguments, TimeLimitCallback


def _args(world_size: int = 1, save_strategy: str = "no") -> SimpleNamespace:
    return SimpleNamespace(world_size=world_size, device=torch.device("cpu"), save_strategy=save_strategy)


def _state(step: int, max_steps: int) -> TrainerState:
    state = TrainerState()
    state.global_step, state.max_steps = step, max_steps
    return state


def _step(callback: TimeLimitCallback, args: SimpleNamespace, state: TrainerState) -> TrainerControl:
    callback.on_train_begin(args, state, TrainerControl())
    return callback.on_step_end(args, state, TrainerControl())


def _agree(rank: int, init_file: str, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # Rank 0 has run out of time, rank 1 has an hour left: both must stop after this step.
        callback = TimeLimitCallback(0.0 if rank == 0 else 3600.0)
        control = _step(callback, _args(world_size=2), _state(1, 10))
        stopped = (control.should_training_stop, callback.stopped)
        # Neither is out of time: both go on.
        callback = TimeLimitCallback(3600.0)
        going_on = not _step(callback, _args(world_size=2), _state(1, 10)).should_training_stop
        results[rank] = (*stopped, going_on)
    finally:
        dist.destroy_process_group()


def test_every_process_stops_when_one_runs_out_of_time(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_agree, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
        assert dict(results) == {0: (True, True, True), 1: (True, True, True)}


def test_the_limit_saves_a_checkpoint_where_the_run_saves_them_and_claims_no_last_step():
    out_of_time = TimeLimitCallback(0.0)
    control = _step(out_of_time, _args(save_strategy="steps"), _state(3, 10))
    assert control.should_training_stop and control.should_save and out_of_time.stopped
    assert not _step(out_of_time, _args(save_strategy="no"), _state(3, 10)).should_save  # no checkpoints: none now
    # Out of time on the step that completes the budget: the run ended on its own, not by the limit.
    assert not _step(out_of_time, _args(), _state(10, 10)).should_training_stop and not out_of_time.stopped


def test_a_time_limit_must_be_positive(data_dir):
    stories = str(data_dir / "cnn_dailymail/cnn_stories")
    with pytest.raises(ValueError, match="`max_train_seconds` must be a positive number, got 0"):
        SummarizationDataArguments(train_file=stories, max_train_seconds=0)

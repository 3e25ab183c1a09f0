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


def _agree(rank: int, init_file: str, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # Rank 0 has run out of time, rank 1 has an hour left: both must stop after this step.
        callback = TimeLimitCallback(0.0 if rank == 0 else 3600.0)
        args = SimpleNamespace(world_size=2, device=torch.device("cpu"))
        callback.on_train_begin(args, TrainerState(), TrainerControl())
        control = callback.on_step_end(args, TrainerState(), TrainerControl())
        results[rank] = (control.should_training_stop, callback.stopped)
    finally:
        dist.destroy_process_group()


def test_every_process_stops_when_one_runs_out_of_time(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_agree, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
        assert dict(results) == {0: (True, True), 1: (True, True)}


def test_a_time_limit_must_be_positive(data_dir):
    stories = str(data_dir / "cnn_dailymail/cnn_stories")
    with pytest.raises(ValueError, match="`max_train_seconds` must be a positive number, got 0"):
        SummarizationDataArguments(train_file=stories, max_train_seconds=0)

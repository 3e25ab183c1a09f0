"""`--max_train_seconds`: a training program stops on a wall-time budget, says so in its metrics, and every process of
a distributed run stops at the same step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import TrainerControl, TrainerState

from attnzoo.training import SummarizationDataArguments, TimeLimitCallback
from source_checkout import REPO_ROOT


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


def test_a_summarization_run_stops_on_its_time_limit_and_says_so(tmp_path, data_dir, load_script, quiet_args):
    stories = str(data_dir / "cnn_dailymail/cnn_stories")
    common = [
        *quiet_args,
        "--config_path", str(REPO_ROOT / "configs/models/dense_transformer/tiny.json"),
        "--train_file", stories,
        "--train_url_list", str(data_dir / "cnn_dailymail/url_lists/all_train.txt"),
        "--max_source_length", "64",
        "--max_target_length", "16",
        "--per_device_train_batch_size", "2",
        "--save_strategy", "no",
        "--max_steps", "3",
    ]  # fmt: skip
    script = load_script("run_summarization")
    limited = script.main([*common, "--max_train_seconds", "1e-6", "--output_dir", str(tmp_path / "limited")])
    # The budget is checked after each step: the first step ends it.
    assert (limited["global_step"], limited["metrics"]["train_time_limited"]) == (1, True)
    ample = script.main([*common, "--max_train_seconds", "3600", "--output_dir", str(tmp_path / "ample")])
    assert (ample["global_step"], ample["metrics"]["train_time_limited"]) == (3, False)
    plain = script.main([*common, "--output_dir", str(tmp_path / "plain")])
    assert plain["global_step"] == 3 and "train_time_limited" not in plain["metrics"]

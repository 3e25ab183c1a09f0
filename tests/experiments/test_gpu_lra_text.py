"""`scripts/experiments/long-inputs/gpu_lra_text.sh`: the job list and results folder each setting makes (its dry
run), and bad settings."""

from __future__ import annotations

import os
import subprocess

import pytest

from source_checkout import REPO_ROOT

SIN = "position_embedding_type=sinusoidal"


def dry_run(tmp_path, *seeds: str, **env: str) -> tuple[str, list[str]]:
    """The folder prefix and the "SEED LENGTH ROW" jobs the script would run."""
    process = subprocess.run(
        ["bash", "scripts/experiments/long-inputs/gpu_lra_text.sh", str(tmp_path / "out"), "1", "1", *seeds],
        cwd=REPO_ROOT,
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, process.stderr
    first, *jobs = process.stdout.splitlines()
    assert first.startswith("folder ")
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    return first.removeprefix("folder "), jobs


def test_default_jobs_pair_dense_at_1024_with_a2former_at_4096_for_every_seed(tmp_path):
    folder, jobs = dry_run(tmp_path, "3", "5")
    assert folder == "seed"
    assert jobs[:4] == [
        f"3 1024 dense_transformer:{SIN}",
        f"3 4096 a2former:{SIN}",
        f"5 1024 dense_transformer:{SIN}",
        f"5 4096 a2former:{SIN}",
    ]
    # then seed 3 of every other sparse family, then the learned-position pair for every seed
    assert f"3 4096 sbm:{SIN}" in jobs and "5 1024 dense_transformer" in jobs


def test_pretraining_and_steps_name_the_folder_and_rows_replace_the_jobs(tmp_path):
    folder, jobs = dry_run(tmp_path, "0", PRETRAIN_STEPS="900")
    assert folder == "spt900-seed" and len(jobs) == 3
    folder, jobs = dry_run(
        tmp_path, "1", "2", STEPS="2400", ROWS=f"1024 dense_transformer; 1024 dense_transformer:{SIN};"
    )
    assert folder == "steps2400-seed"
    assert jobs == [
        "1 1024 dense_transformer",
        f"1 1024 dense_transformer:{SIN}",
        "2 1024 dense_transformer",
        f"2 1024 dense_transformer:{SIN}",
    ]
    folder, _ = dry_run(tmp_path, PRETRAIN_STEPS="900", STEPS="600")
    assert folder == "spt900-steps600-seed"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STEPS": "2k"}, "take a step count, got '2k'"),
        ({"ROWS": "dense_transformer"}, "got 'dense_transformer'"),
        ({"ROWS": "1024 a2former:x=1 extra"}, "got '1024 a2former:x=1 extra'"),
        ({"ROWS": " ; "}, "names no job"),
    ],
)
def test_bad_settings_are_refused_before_any_job(tmp_path, env, message):
    process = subprocess.run(
        ["bash", "scripts/experiments/long-inputs/gpu_lra_text.sh", str(tmp_path / "out")],
        cwd=REPO_ROOT,
        env={**os.environ, **env},  # not a dry run: the refusal must come before the jobs start
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 2
    assert message in process.stderr
    assert not (tmp_path / "out").exists()

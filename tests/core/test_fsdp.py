"""FSDP2 on two CPU processes (gloo, `torchrun --nproc_per_node 2`) trains every family, and the gathered checkpoint
reloads with `from_pretrained` to the sharded model's outputs (see `fsdp_worker.py` for why on CPU the sharding is
torch's `fully_shard` rather than `Trainer(fsdp=...)`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnzoo.registry import FAMILIES

WORKER = Path(__file__).with_name("fsdp_worker.py")


@pytest.mark.slow
def test_fsdp2_trains_every_family_and_the_checkpoint_reloads(tmp_path):
    names = sorted(family.name for family in FAMILIES.values())
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(WORKER), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command + names, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    for name in names:
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["world_size"] == 2 and result["sharded_parameters"], result
        assert all(math.isfinite(loss) for loss in result["losses"]), result
        # Training moved every trainable parameter, and the reloaded checkpoint is the trained model.
        assert result["parameters_changed"] == result["trainable_parameters"], result
        assert result["max_abs_difference"] <= 1e-6, result

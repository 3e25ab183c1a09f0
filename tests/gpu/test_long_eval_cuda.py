"""The long-input evaluation on CUDA: every family trains a few bf16 steps of ListOps at LRA's length and records the
device (what `run_long_eval.py --device cuda --bf16` runs at LRA's budget). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from attnzoo.evaluation import Budget, ModelSize, RunSpec, listops_task, train_and_evaluate
from attnzoo.registry import FAMILIES

pytestmark = pytest.mark.gpu

SIZE = ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


@pytest.fixture(scope="module")
def listops():
    return listops_task(2048, validation_size=16)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_listops_trains_in_bf16_on_cuda(listops, family):
    budget = Budget(steps=4, batch_size=4, warmup_steps=2, eval_batch_size=8, schedule="rsqrt", bf16=True)
    record = train_and_evaluate(listops, RunSpec(family, 2048), SIZE, budget, device="cuda")
    assert record["device"].startswith("cuda:")
    assert all(torch.isfinite(torch.tensor(point["loss"])) for point in record["curve"])
    assert 0.0 <= record["accuracy"] <= 1.0 and record["validation_loss"] > 0

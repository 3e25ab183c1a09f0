"""Slow and GPU tests of SBM-Transformer: SST-2 fine-tuning against the dense family, the paper's synthetic
"find repeated tokens" task (§5.1, Figure 4), and bf16 autocast on CUDA."""

from __future__ import annotations

import functools
from types import ModuleType

import pytest
import torch

import attnzoo.sbm  # noqa: F401  (registers the family)
from attnzoo.sbm import SBMConfig, SBMForSequenceClassification
from source_checkout import SST2_SHORT_INPUTS, SST2_WIDTH, train_and_eval_sst2

# The short-input check (the sbm-short-inputs study, scaled to the bundled SST-2 slice: 4,000 training and 800
# held-out sentences; `SST2_SHORT_INPUTS`: width 128, 4 heads, 2 layers, 1,000 steps of batch 32 at AdamW 1e-3,
# clipping at 1.0, seed 0). Measured on CPU, seeds 0-2 (the study's results/regression_check.jsonl): dense 74.4 / 71.3
# / 72.8, SBM's default 74.1 / 73.3 / 73.3, paired differences -0.25 / +2.0 / +0.5 (standard deviation 1.1 points),
# largest gradient norms 14-17 for both. The bound is three of those standard deviations. attnzoo 0.2's unsampled-pair
# gradient (`ste_unsampled_gradient="derivative"`, the cause of issue 51's lost points) trails by 6.9 / 2.8 / 3.4
# points with largest gradient norms of 14,089 / 59,041 / 10,891: the accuracy bound alone catches seed 0 only, the
# gradient-norm ratio every seed.
SST2_BOUND = 0.035
#: SBM's largest pre-clip gradient norm over the run, at most this many times dense's (both ≈ 15 when it learns).
SST2_GRAD_NORM_RATIO = 4.0


@functools.cache
def dense_sst2() -> dict[str, float]:
    return train_and_eval_sst2("dense_transformer", SST2_WIDTH, **SST2_SHORT_INPUTS)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        pytest.param(
            {"ste_unsampled_gradient": "derivative"},
            marks=pytest.mark.xfail(strict=True, reason="attnzoo 0.2's estimator: the regression this test guards"),
        ),
    ],
    ids=["default", "0.2-estimator-fails"],
)
def test_sst2_sbm_learns_short_inputs_as_well_as_dense(overrides):
    torch.set_num_threads(1)
    dense = dense_sst2()
    sbm = train_and_eval_sst2("sbm", {**SST2_WIDTH, **overrides}, **SST2_SHORT_INPUTS)
    assert sbm["accuracy"] >= dense["accuracy"] - SST2_BOUND, (sbm, dense)
    assert sbm["max_grad_norm"] <= SST2_GRAD_NORM_RATIO * dense["max_grad_norm"], (sbm, dense)


SYNTHETIC_SETUP = {"length": 64, "batch": 64, "log_every": 100}


@functools.cache
def full_attention_log(script: ModuleType, seed: int) -> list[dict]:
    """Full attention on the synthetic task, trained once per seed (two SBM cases share seed 0)."""
    return script.train("dense", steps=3000, seed=seed, **SYNTHETIC_SETUP)["log"]


@pytest.mark.slow
@pytest.mark.timeout(5400)
@pytest.mark.parametrize(
    "seed,estimator",
    [(0, "paper"), (0, "paper+all-pairs"), (2, "paper+all-pairs"), (4, "paper+all-pairs"), (4, "default")],
    ids=["paper-ste-seed0", "all-pairs-seed0", "all-pairs-seed2", "all-pairs-seed4", "default-estimator-seed4"],
)
def test_repeated_tokens_sbm_approaches_full_attention_and_density_rises(synthetic_script, seed, estimator):
    # Paper §5.1 / Figure 4 reduced to a CPU budget: N=64 and batch 64 instead of 256 (one layer, one head, width
    # 32, k=128, lr 1e-3 as in the paper); see scripts/experiments/sbm-synthetic/run.py for the setup and the
    # full-size run.
    # With the paper's estimator alone the density collapses to δ in 3 of 5 seeds (2 and 4 among them); seed 0 is
    # one that solves it, pinned as a regression test. With `ste_all_pairs` every seed measured solves it, including
    # seeds 2 and 4; so does the model's default estimator (official variant, unsampled pairs included), which the
    # last case runs on seed 4. The runs are deterministic on CPU.
    torch.set_num_threads(1)
    script = synthetic_script
    overrides = {
        "paper": script.SBM_TASK_OVERRIDES,
        "paper+all-pairs": {**script.SBM_TASK_OVERRIDES, "ste_all_pairs": True},
        "default": {},
    }[estimator]
    dense = full_attention_log(script, seed)
    sbm_run = script.train("sbm", steps=3000, sbm_overrides=overrides, seed=seed, **SYNTHETIC_SETUP)
    sbm = sbm_run["log"]
    majority = 1 - (1 - 1 / 64) ** 63  # share of repeated positions (≈ 0.63): the majority-class accuracy
    assert dense[0]["eval_accuracy"] < majority + 0.05, dense[0]  # starts at the plateau ...
    assert dense[-1]["eval_accuracy"] > 0.95, dense[-1]  # ... and full attention solves the task
    assert sbm[-1]["eval_accuracy"] > 0.95, sbm[-1]
    # Figure 4 (right): SBM starts near 25% density and drives itself towards full attention.
    assert 0.2 < sbm_run["initial_density"] < 0.35, sbm_run["initial_density"]
    assert sbm[-1]["train_density"] > sbm_run["initial_density"] + 0.5, sbm[-1]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["bernoulli", "fastrg"])
def test_bf16_autocast_forward_backward_on_cuda(backend):
    config = SBMConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=1024, num_clusters=32, sampling_backend=backend,
    )  # fmt: skip
    model = SBMForSequenceClassification(config).cuda().train()
    ids = torch.randint(5, 500, (2, 512), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, 300:] = 0
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1], device="cuda"))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert 0.15 < out.attention_density.mean().item() < 0.35
    grad = model.model.encoder.layers[0].attention.clusters.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a = model(input_ids=ids, attention_mask=mask).logits
        b = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)

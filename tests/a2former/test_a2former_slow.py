"""Slow and GPU checks of A²-Former: SST-2 fine-tuning against the dense family, bf16 autocast on CUDA."""

from __future__ import annotations

import pytest
import torch

from attnzoo.a2former import A2FormerModel
from source_checkout import load_config, train_and_eval_sst2


@pytest.mark.slow
def test_sst2_accuracy_is_within_five_points_of_dense():
    a2 = train_and_eval_sst2("a2former", {}, steps=300, seed=0)["accuracy"]
    dense = train_and_eval_sst2("dense_transformer", {}, steps=300, seed=0)["accuracy"]
    assert a2 > 0.6, f"A²-Former accuracy {a2:.3f} is not well above chance"
    assert a2 >= dense - 0.05, f"A²-Former {a2:.3f} vs dense {dense:.3f}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_autocast_matches_fp32_and_trains_positions():
    torch.manual_seed(0)
    config = load_config("a2former", "tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = A2FormerModel(config).cuda().train()
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.attention.offset_weight.normal_(0.0, 0.5)
    ids = torch.randint(5, config.vocab_size, (2, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, 200:] = 0
    reference = model(input_ids=ids, attention_mask=mask).last_hidden_state
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), reference, atol=0.1, rtol=0.05)
    out.float().pow(2).mean().backward()
    grad = model.encoder.layers[0].attention.offset_weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0

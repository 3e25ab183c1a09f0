"""Slow and GPU checks of Smart Bird: SST-2 fine-tuning against the dense family, bf16 autocast on CUDA."""

from __future__ import annotations

import pytest
import torch

from attnzoo.smart_bird import SmartBirdConfig, SmartBirdForSequenceClassification, sample_keys
from source_checkout import train_and_eval_sst2


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_sst2_accuracy_is_within_five_points_of_dense():
    # K=8 keeps the attention sparse on most SST-2 sentences (the tiny config's K=20 would cover many of them).
    steps = 300
    smart = train_and_eval_sst2("smart_bird", {"num_samples": 8}, steps=steps, seed=0)["accuracy"]
    dense = train_and_eval_sst2("dense_transformer", {}, steps=steps, seed=0)["accuracy"]
    assert smart > 0.65, smart
    assert smart >= dense - 0.05, (smart, dense)


@pytest.mark.gpu
def test_bf16_autocast_training_step_on_cuda_is_finite():
    config = SmartBirdConfig(
        vocab_size=1000, hidden_size=64, num_attention_heads=4, intermediate_size=128, max_position_embeddings=2048
    )
    model = SmartBirdForSequenceClassification(config).cuda().train()
    ids = torch.randint(5, 1000, (2, 1024), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, 700:] = 0
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1], device="cuda"))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        first = model(input_ids=ids, attention_mask=mask).logits
        second = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(first, second, rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_sampler_never_selects_padding_and_matches_the_literal_sampler_for_given_noise():
    from attnzoo.smart_bird import sample_keys_reference
    from attnzoo.smart_bird.sampling import score_bounds, sketch_logits

    g = torch.Generator(device="cuda").manual_seed(0)
    q_s, k_s = (torch.randn(2, 4096, 4, device="cuda", generator=g) for _ in range(2))
    key_valid = torch.ones(2, 4096, dtype=torch.bool, device="cuda")
    key_valid[1, 3000:] = False
    idx, valid = sample_keys(q_s, k_s, key_valid, num_heads=4, num_samples=20, function="squared_inverse_log")
    assert not (valid & ~torch.gather(key_valid[:, None, None].expand(2, 4, 4096, 4096), 3, idx)).any()
    noise = torch.empty(2, 4, 256, 256, device="cuda").exponential_(generator=g)
    small = (q_s[:, :256].contiguous(), k_s[:, :256].contiguous())
    fast = sample_keys(*small, None, num_heads=4, num_samples=20, function="squared_inverse_log", noise=noise)
    z = sketch_logits(*small, None, 0, 256)
    ref = sample_keys_reference(
        score_bounds(z, torch.logsumexp(z, -1, keepdim=True), "squared_inverse_log"), 20, noise
    )
    assert torch.equal(fast[0], ref[0])

"""Smart Bird's counter sampler (the CUDA path): the sampling law, the choice of sampler per device and backend, and
evaluation draws that depend on the example alone.

The kernel itself is compared with the literal sampler and with this reference in
`tests/kernels/test_attentive_sampler.py`.
"""

from __future__ import annotations

import pytest
import torch

from attnzoo.smart_bird import SmartBirdAttention, SmartBirdConfig, sample_keys
from attnzoo.smart_bird.sampling import resolve_sampling_method


def _sketch(B: int, N: int, scale: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, 4, generator=g) * scale, torch.randn(B, N, 4, generator=g) * scale


def _frequencies(idx: torch.Tensor, valid: torch.Tensor, num_keys: int) -> torch.Tensor:
    """`(B, H, N, K)` keys -> `(N, N)`: the share of (example, head) draws that selected each key for each query."""
    B, H, N, _ = idx.shape
    per_query = torch.where(valid, idx, num_keys).permute(2, 0, 1, 3).reshape(N, -1)
    counts = torch.zeros(N, num_keys + 1).scatter_add_(1, per_query, torch.ones(per_query.shape))
    return counts[:, :num_keys] / (B * H)


@pytest.mark.parametrize("scale", [0.0, 0.7, 3.0])  # flat: proposals settle every row; 0.7: about half; 3.0: the scan
def test_counter_reference_has_the_literal_samplers_inclusion_frequencies(scale):
    # The heads are the repetitions: each draws its keys independently. The literal sampler draws torch noise.
    N, K, heads = 48, 4, 1000
    q_s, k_s = _sketch(1, N, scale, seed=3)
    key_valid = torch.ones(1, N, dtype=torch.bool)
    key_valid[0, 40:] = False
    kw = {"num_heads": heads, "num_samples": K, "function": "squared_inverse_log", "backend": "reference"}
    counter = sample_keys(q_s, k_s, key_valid, method="counter", seed=11, **kw)
    torch.manual_seed(0)
    literal = sample_keys(q_s, k_s, key_valid, method="literal", **kw)
    f_counter, f_literal = _frequencies(*counter, N)[:, :40], _frequencies(*literal, N)[:, :40]
    assert _frequencies(*counter, N)[:, 40:].sum() == 0  # padding is never drawn
    p = (f_counter + f_literal) / 2
    z = (f_counter - f_literal) / (2 * p * (1 - p) / heads).sqrt().clamp(min=1e-3)
    assert z.pow(2).mean() < 1.3  # ~1 for one law (a little less: pairs with p near 0 or 1)
    assert z.abs().max() < 6.0


def test_counter_reference_draws_exactly_k_distinct_real_keys():
    q_s, k_s = _sketch(3, 50, 1.0)
    key_valid = torch.ones(3, 50, dtype=torch.bool)
    key_valid[1, 5:] = False  # fewer real keys than K
    key_valid[2] = False  # no real key
    kw = {"num_heads": 4, "num_samples": 12, "function": "squared_inverse_log", "backend": "reference"}
    idx, valid = sample_keys(q_s, k_s, key_valid, method="counter", seed=3, **kw)
    picked = torch.gather(key_valid[:, None, None, :].expand(3, 4, 50, 50), 3, idx)
    assert not (valid & ~picked).any()
    assert valid[0].all() and valid[1].sum(-1).eq(5).all() and not valid[2].any()
    assert (torch.where(valid, idx, -torch.arange(1, 13)).sort(-1).values.diff(dim=-1) != 0).all()


def test_auto_method_is_the_counter_sampler_where_the_attention_runs_triton_and_thinning_on_the_cpu():
    cpu = torch.device("cpu")
    assert resolve_sampling_method("auto", cpu, "fast") == "thinning"
    assert resolve_sampling_method("auto", cpu, "reference") == "thinning"
    assert resolve_sampling_method("auto", cpu, "triton") == "counter"  # the CUDA code path, interpreted
    assert resolve_sampling_method("auto", torch.device("cuda"), "reference") == "counter"
    assert resolve_sampling_method("literal", cpu, "triton") == "literal"
    with pytest.raises(ValueError, match="method"):
        resolve_sampling_method("gumbel", cpu, "fast")


def _select(config: SmartBirdConfig, qk, key_valid, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    attn = SmartBirdAttention(config, layer_idx=1).train(train)
    attn.sketch = qk
    return attn.select(torch.zeros(qk[0].shape[0], config.num_attention_heads, qk[0].shape[1], 8), key_valid)


def test_counter_eval_keys_of_an_example_depend_neither_on_its_batch_nor_on_its_padding():
    config = SmartBirdConfig(
        vocab_size=100, hidden_size=32, num_attention_heads=4, num_samples=5, sampling_method="counter",
        attention_backend="reference",
    )  # fmt: skip
    q_s, k_s = _sketch(2, 30, 1.0, seed=4)
    alone_idx, alone_valid = _select(config, (q_s[:1, :20], k_s[:1, :20]), None, train=False)
    key_valid = torch.ones(2, 30, dtype=torch.bool)
    key_valid[0, 20:] = False  # example 0 padded to the batch's length
    idx, valid = _select(config, (q_s, k_s), key_valid, train=False)
    assert torch.equal(valid[:1, :, :20], alone_valid)
    assert torch.equal(torch.where(valid, idx, -1)[:1, :, :20], torch.where(alone_valid, alone_idx, -1))
    again, _ = _select(config, (q_s, k_s), key_valid, train=False)
    assert torch.equal(again, idx)  # evaluation is deterministic (sampling_seed + layer)


def test_counter_training_draws_follow_the_global_rng():
    config = SmartBirdConfig(
        vocab_size=100, hidden_size=32, num_attention_heads=4, num_samples=5, sampling_method="counter",
        attention_backend="reference",
    )  # fmt: skip
    qk = _sketch(1, 40, 0.5)
    draws = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        draws.append(_select(config, qk, None, train=True)[0].sort(-1).values)
    assert torch.equal(draws[0], draws[1])  # gradient checkpointing replays the RNG state: the same keys
    assert (draws[0] != draws[2]).any(-1).float().mean() > 0.9

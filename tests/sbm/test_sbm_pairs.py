"""SBM's pair counts without padding: computed on the host, equal to the device count over all-real masks."""

from __future__ import annotations

import pytest
import torch

from attnzoo.sbm import SBMAttention, SBMConfig


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n,m,offset", [(5, 8, 0), (8, 5, 0), (5, 8, 2), (3, 9, 6), (4, 6, 7), (1, 6, 5)])
def test_host_pair_counts_equal_the_masked_count(causal, n, m, offset):
    config = SBMConfig(vocab_size=50, hidden_size=16, num_attention_heads=2, num_hidden_layers=1, num_clusters=4)
    attn = SBMAttention(config, is_causal=causal)
    host = attn.count_pairs(None, None, 2, n, m, offset, "cpu")
    assert isinstance(host, float)
    masked = attn.count_pairs(
        torch.ones(2, m, dtype=torch.bool), torch.ones(2, n, dtype=torch.bool), 2, n, m, offset, "cpu"
    )
    assert torch.equal(masked, torch.full((2,), host))
    if not causal:
        assert host == n * m

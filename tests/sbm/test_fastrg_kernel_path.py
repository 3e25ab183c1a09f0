"""SBM attention on the CUDA code path (`attention_backend="triton"`, under Triton's interpreter on CPU) with the fused
fastRG sampler and with its torch reference: the same graph, so the same outputs, densities, auxiliary losses and
gradients, bit for bit (training with dropout, the sliding window, a global token and padding; causal decoding)."""

from __future__ import annotations

import pytest
import torch

import attnzoo.sbm.attention_sbm as attention_sbm
from attnzoo.sbm import SBMAttention, SBMConfig

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CUDA compiles the kernels)")


def _attention(causal: bool) -> SBMAttention:
    config = SBMConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        num_clusters=8, sampling_backend="fastrg", membership_logit_bias=-1.0, attention_probs_dropout_prob=0.1,
        local_window=2, sparsity_weight=0.3, num_global_tokens=1, attention_backend="triton", decoder_layers=1,
    )  # fmt: skip
    torch.manual_seed(0)
    attn = SBMAttention(config, is_causal=causal)
    attn.init_method_weights()
    return attn.train()


def _step(attn: SBMAttention):
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(3), requires_grad=True)
    key_valid = torch.tensor([[True] * 24, [True] * 17 + [False] * 7])
    torch.manual_seed(4)
    out = attn(x, key_valid)
    ((out.hidden_states * torch.linspace(-1, 1, 32)).sum() + out.aux_loss).backward()
    grads = {name: p.grad for name, p in attn.named_parameters()}
    return out.hidden_states.detach(), out.density, out.aux_loss.detach(), x.grad, grads


# The interpreter runs the edge kernels slowly (about 15-20 s of one core per case): long for the default suite's
# 8-minute budget. The default suite checks the same path through the model (`tests/core/test_triton_backend.py`,
# fused sampler against the reference backend) and the sampler's graph bit for bit (`tests/kernels`).
@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_the_fused_sampler_gives_the_reference_samplers_outputs_and_gradients(causal, monkeypatch):
    sampled = []
    original = attention_sbm.fastrg_edges

    def spy(*args, **kwargs):
        sampled.append(kwargs["kernels"] is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention_sbm, "fastrg_edges", spy)
    fused = _step(_attention(causal))
    monkeypatch.setattr(attention_sbm, "fastrg_sampler", lambda backend, device: None)
    reference = _step(_attention(causal))
    assert sampled == [True, False], "the Triton path took the fused sampler, the patched one the reference"
    for got, want in zip(fused[:4], reference[:4], strict=True):
        assert torch.equal(got, want)
    assert fused[4].keys() == reference[4].keys()
    for name, grad in reference[4].items():
        assert torch.equal(fused[4][name], grad), name

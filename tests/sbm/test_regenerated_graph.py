"""SBM on the CUDA code path (`attention_backend="triton"`, under Triton's interpreter on CPU) samples its fastRG graph
again in backward instead of keeping it: no per-edge tensor is kept for backward, and outputs, densities, auxiliary
losses and gradients are those of the layer that keeps its edges, bit for bit."""

from __future__ import annotations

import pytest
import torch

import attnzoo.sbm.attention_sbm as attention_sbm
from attnzoo.core.saved_tensors import observing_hooks
from attnzoo.sbm import SBMAttention, SBMConfig

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CUDA compiles the kernels)")


def _step(monkeypatch, regenerate: bool):
    """One training step of a small layer that reads every per-edge tensor in backward (the paper's STE scale, the
    regulariser's edge owners, dropout, a window, a global token, padding); the edge count and the shapes kept."""
    config = SBMConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        num_clusters=8, sampling_backend="fastrg", membership_logit_bias=-1.0, attention_probs_dropout_prob=0.1,
        local_window=2, sparsity_weight=0.3, num_global_tokens=1, attention_backend="triton", ste_variant="paper",
    )  # fmt: skip
    torch.manual_seed(0)
    attn = SBMAttention(config).train()
    attn.init_method_weights()
    edges = []
    sample = attention_sbm.fastrg_edges

    def spy(*args, **kwargs):
        graph = sample(*args, **kwargs)
        edges.append(graph.cols.shape)
        return graph

    monkeypatch.setattr(attention_sbm, "fastrg_edges", spy)
    if not regenerate:
        monkeypatch.setattr(attention_sbm, "other_saved_tensor_hooks", lambda: True)
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(3), requires_grad=True)
    key_valid = torch.tensor([[True] * 16, [True] * 11 + [False] * 5])
    kept = []
    torch.manual_seed(4)
    with observing_hooks(lambda t: kept.append(tuple(t.shape))):
        out = attn(x, key_valid)
    ((out.hidden_states * torch.linspace(-1, 1, 32)).sum() + out.aux_loss).backward()
    grads = {name: p.grad for name, p in attn.named_parameters()}
    results = (out.hidden_states.detach(), out.density, out.aux_loss.detach(), x.grad)
    return results, grads, edges, kept


def test_backward_samples_the_graph_again_instead_of_keeping_its_edges(monkeypatch):
    results, grads, edges, kept = _step(monkeypatch, regenerate=True)
    assert len(edges) == 2, "sampled in forward, and again in backward"
    assert edges[0] == edges[1]
    assert edges[0] not in kept, "a per-edge tensor was kept for backward"

    monkeypatch.undo()
    expected, expected_grads, edges_kept, kept_edges = _step(monkeypatch, regenerate=False)
    assert len(edges_kept) == 1 and edges_kept[0] in kept_edges, "the comparison keeps its edges"
    for got, want in zip(results, expected, strict=True):
        assert torch.equal(got, want)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        assert torch.equal(grads[name], grad), name

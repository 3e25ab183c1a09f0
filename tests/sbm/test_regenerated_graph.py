"""SBM on the CUDA code path (`attention_backend="triton"`) samples its fastRG graph again in backward instead of
keeping it: no per-edge tensor is kept for backward, and outputs, densities, auxiliary losses and gradients are those
of the layer that keeps its edges (bit for bit under Triton's interpreter on CPU; on CUDA, where the keys' and
values' gradients are atomic sums in any order, to round-off; `-m gpu`)."""

from __future__ import annotations

import pytest
import torch

import attnzoo.sbm.attention_sbm as attention_sbm
from attnzoo.core.saved_tensors import observing_hooks
from attnzoo.sbm import SBMAttention, SBMConfig
from triton_devices import TRITON_DEVICES

pytest.importorskip("triton")


def _step(monkeypatch, regenerate: bool, device: str, compiled_autograd: bool = False):
    """One training step of a small layer that reads every per-edge tensor in backward (the paper's STE scale, the
    regulariser's edge owners, dropout, a window, a global token, padding); the edge count and the shapes kept.
    `compiled_autograd`: the backward traced by compiled autograd (dynamo's eager backend)."""
    config = SBMConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        num_clusters=8, sampling_backend="fastrg", membership_logit_bias=-1.0, attention_probs_dropout_prob=0.1,
        local_window=2, sparsity_weight=0.3, num_global_tokens=1, attention_backend="triton", ste_variant="paper",
    )  # fmt: skip
    torch.manual_seed(0)
    attn = SBMAttention(config).to(device).train()
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
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(3)).to(device).requires_grad_()
    key_valid = torch.tensor([[True] * 16, [True] * 11 + [False] * 5], device=device)
    kept = []
    torch.manual_seed(4)
    with observing_hooks(lambda t: kept.append(tuple(t.shape))):
        out = attn(x, key_valid)
    loss = (out.hidden_states * torch.linspace(-1, 1, 32, device=device)).sum() + out.aux_loss
    if compiled_autograd:
        torch._dynamo.reset()
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="eager")):
            loss.backward()
    else:
        loss.backward()
    grads = {name: p.grad for name, p in attn.named_parameters()}
    results = (out.hidden_states.detach(), out.density, out.aux_loss.detach(), x.grad)
    return results, grads, edges, kept


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_backward_samples_the_graph_again_instead_of_keeping_its_edges(monkeypatch, device):
    results, grads, edges, kept = _step(monkeypatch, regenerate=True, device=device)
    assert len(edges) == 2, "sampled in forward, and again in backward"
    assert edges[0] == edges[1]
    (num_edges,) = edges[0]
    assert not [shape for shape in kept if num_edges in shape], "a per-edge tensor was kept for backward"

    monkeypatch.undo()
    expected, expected_grads, edges_kept, kept_edges = _step(monkeypatch, regenerate=False, device=device)
    assert len(edges_kept) == 1 and edges_kept[0] in kept_edges, "the comparison keeps its edges"
    exact = device == "cpu"
    for got, want in zip(results[:3], expected[:3], strict=True):
        assert torch.equal(got, want)  # the forward: the same graph
    assert grads.keys() == expected_grads.keys()
    for name, grad in [("input", expected[3]), *expected_grads.items()]:
        got = results[3] if name == "input" else grads[name]
        if exact:
            assert torch.equal(got, grad), name
        else:
            torch.testing.assert_close(got, grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the interpreter's kernels cannot be traced)")
def test_under_compiled_autograd_the_graph_is_sampled_again_with_the_same_gradients(monkeypatch):
    expected, expected_grads, _, _ = _step(monkeypatch, regenerate=True, device="cuda")
    monkeypatch.undo()
    results, grads, edges, _ = _step(monkeypatch, regenerate=True, device="cuda", compiled_autograd=True)
    assert len(edges) == 2, "sampled in forward, and again in backward"
    assert torch.equal(results[0], expected[0])
    for name, grad in [("input", expected[3]), *expected_grads.items()]:
        got = results[3] if name == "input" else grads[name]
        torch.testing.assert_close(got, grad, rtol=1e-5, atol=1e-6, msg=name)

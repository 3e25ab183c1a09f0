"""Key-slot attention (FSAT's edges in fixed slots per key): the CSR path and the Triton kernels (under the interpreter
on CPU) equal the plain-autograd reference on outputs, pair counts and the gradients of q, k, v and the predictions,
with duplicates, dropped slots, empty rows, padding, both global softmaxes, dropout and the truncation; and the Triton
path issues no host sync."""

from __future__ import annotations

import pytest
import torch

from attnzoo.benchmarking.recorder import OpRecorder
from attnzoo.kernels import key_slot_attention
from attnzoo.kernels.key_slots import gaussian_confidence, key_slot_edges, key_slot_pair_count

pytest.importorskip("triton")

from key_slot_cases import finish_slots, run  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests (CUDA: tests/gpu)")

B, H, N, D, S, M = 2, 3, 11, 8, 5, 3


def make_slots(seed: int = 0, padded: bool = False):
    """Random slots with duplicates (one key names query 2 in every slot), dropped slots and a query no slot names;
    with `padded`, the slots of padded keys and those naming padded queries are dropped as FSAT drops them."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g, requires_grad=True) for _ in range(3))
    query = torch.randint(-1, N, (B, H, N, S), generator=g, dtype=torch.int32)
    query[0, 0, 3] = 2  # duplicates of the pair (2, 3)
    query[query == 5] = 6  # query 5 has no slot
    valid = None
    if padded:
        valid = torch.ones(B, N, dtype=torch.bool)
        valid[1, 7:] = False
        valid[0, 0] = False  # a hole at a global position
    return finish_slots(q, k, v, query, valid, g)


CASES = [
    pytest.param({}, False, id="graph-only"),
    pytest.param({"num_global": 2}, True, id="own-global-padded"),
    pytest.param({"num_global": 2, "global_softmax": "shared"}, True, id="shared-global-padded"),
    pytest.param({"num_global": 1, "truncate": True, "normalized": True}, False, id="truncated-normalised"),
    pytest.param({"num_global": 2, "dropout_p": 0.3, "training": True, "truncate": True}, True, id="dropout"),
]


@pytest.mark.parametrize("overrides,padded", CASES)
@pytest.mark.parametrize("backend", ["fast", "triton"])
def test_key_slot_attention_equals_the_reference_forward_and_backward(backend, overrides, padded):
    slots = make_slots(padded=padded)
    kwargs = {"num_graph_slots": M, "variance": 4.0, "scale": 0.4, **overrides}
    out, pairs, grads = run(backend, slots, **kwargs)
    expected, expected_pairs, expected_grads = run("reference", slots, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(pairs, expected_pairs)
    for name, grad, expected_grad in zip(["q", "k", "v", "mean"], grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6, msg=name)
    assert expected_grads[3].abs().sum() > 0  # the predictions do get a gradient
    dropped = slots[3] < 0
    assert torch.equal(grads[3][dropped], torch.zeros_like(grads[3][dropped]))


def test_reference_is_the_softmax_of_each_group_times_the_confidences():
    # One query, written out: graph slots {key 1, key 4 twice}, an exploration slot on key 2, own global key 0.
    q, k, v = (torch.randn(1, 1, 5, 4, dtype=torch.float64) for _ in range(3))
    query = torch.full((1, 1, 5, 3), -1, dtype=torch.int32)
    query[0, 0, 1, 0] = query[0, 0, 4, 0] = query[0, 0, 4, 1] = query[0, 0, 2, 2] = 3
    mean = torch.rand(1, 1, 5, 3, dtype=torch.float64) * 5
    out, pairs = key_slot_attention(
        q, k, v, query, mean, num_graph_slots=2, variance=2.0, num_global=1, scale=0.5, backend="reference"
    )
    qi = q[0, 0, 3]
    conf = gaussian_confidence(torch.tensor(3.0, dtype=torch.float64), mean[0, 0], 2.0, False)
    graph = [(1, conf[1, 0]), (4, conf[4, 0]), (4, conf[4, 1])]
    logits = torch.stack([0.5 * qi @ k[0, 0, j] for j, _ in graph]).softmax(0)
    expected = sum(p * c * v[0, 0, j] for p, (j, c) in zip(logits, graph, strict=True))
    expected = expected + conf[2, 2] * v[0, 0, 2] + v[0, 0, 0]  # one-edge softmaxes: probability 1
    torch.testing.assert_close(out[0, 0, 3], expected)
    assert pairs.item() == 3 + 5  # (3, 1), (3, 4), (3, 2) and every query's global pair


def test_bf16_triton_path_stays_close_to_the_fp32_reference():
    q, k, v, query, mean, valid = make_slots(padded=True)
    kwargs = {"num_graph_slots": M, "variance": 4.0, "num_global": 1, "key_valid": valid}
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    out, _ = key_slot_attention(*low, query, mean, backend="triton", **kwargs)
    expected, _ = key_slot_attention(q, k, v, query, mean, backend="reference", **kwargs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.detach(), rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert all(t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all() for t in low)


def test_pair_count_counts_each_joined_pair_once():
    query = torch.tensor([[[[2, 2, -1], [2, 0, 0], [-1, -1, -1]]]], dtype=torch.int32)  # (1, 1, 3, 3)
    assert key_slot_pair_count(query, None, 0).item() == 3  # (2, 0), (2, 1), (0, 1)
    # Key 0 global: its slots are ignored, every query reads it.
    assert key_slot_pair_count(query, None, 1).item() == 2 + 3
    valid = torch.tensor([[True, True, False]])
    assert key_slot_pair_count(query, valid, 1).item() == 2 + 2
    live, rows, cols, slot = key_slot_edges(query)
    assert live.sum() == 5 and rows.tolist() == [2, 2, 2, 0, 0] and cols.tolist() == [0, 0, 1, 1, 1]
    assert slot.tolist() == [0, 1, 0, 1, 2]
    live, rows, cols, slot = key_slot_edges(query, num_global=1)
    assert live.sum() == 3 and rows.tolist() == [2, 0, 0] and cols.tolist() == [1, 1, 1]


def test_triton_path_issues_no_host_sync_forward_or_backward(monkeypatch):
    from attnzoo.kernels import dispatch

    # The CPU-only range check reads the slots on the host; on CUDA it issues nothing.
    monkeypatch.setattr(dispatch, "check_key_slots", lambda *args: None)
    q, k, v, query, mean, valid = make_slots(padded=True)
    kwargs = {"num_graph_slots": M, "variance": 4.0, "num_global": 2, "key_valid": valid, "truncate": True}
    with OpRecorder() as recorder:
        out, pairs = key_slot_attention(q, k, v, query, mean, backend="triton", dropout_p=0.1, training=True, **kwargs)
        (out.sum() + pairs.sum()).backward()
    assert not recorder.total().syncs, dict(recorder.total().syncs)
    with OpRecorder() as recorder:
        key_slot_attention(q, k, v, query, mean, backend="fast", **kwargs)
    assert recorder.total().syncs  # the CPU path compacts (the recorder does see syncs)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"query": lambda t: t.long()}, "int32"),
        ({"query": lambda t: torch.where(t == 3, 11, t)}, "query positions"),
        ({"mean": lambda t: t[..., :2]}, "mean"),
        ({"num_graph_slots": 6}, "num_graph_slots"),
        ({"global_softmax": "separate"}, "global_softmax"),
        ({"num_global": 12}, "num_global"),
    ],
)
def test_bad_key_slot_arguments_raise_errors_naming_the_problem(change, message):
    q, k, v, query, mean, _ = make_slots()
    kwargs = {"num_graph_slots": M, "variance": 4.0}
    for name, value in change.items():
        if name == "query":
            query = value(query)
        elif name == "mean":
            mean = value(mean)
        else:
            kwargs[name] = value
    with pytest.raises((ValueError, TypeError, IndexError), match=message):
        key_slot_attention(q, k, v, query, mean, backend="reference", **kwargs)

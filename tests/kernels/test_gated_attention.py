"""Gated attention (`attnzoo.kernels.gated`): the fused function against its plain autograd reference, forward and
backward, and the gate gradient against its definition and against the masked softmax's logit gradient."""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import dense_masked_attention, gated_attention, gated_attention_reference


def _case(seed: int = 0, dropout: bool = False, dtype=torch.float64, B=2, H=3, n=7, m=9, d=5):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, length, d, generator=g, dtype=dtype) for length in (n, m, m))
    gate = (torch.rand(B, H, n, m, generator=g) < 0.4).to(dtype)
    gate[0, 1, 3] = 0.0  # a row without an open pair
    gate[1, 0, 2] = 1.0  # a row with every pair open
    keep = None
    if dropout:
        keep = (torch.rand(B, H, n, m, generator=g) < 0.8).to(dtype) / 0.8
    grad_out = torch.randn(B, H, n, d, generator=g, dtype=dtype)
    return q, k, v, gate, keep, grad_out


def _run(fn, q, k, v, gate, keep, grad_out, scale, **kwargs):
    inputs = [t.clone().requires_grad_() for t in (q, k, v, gate)]
    out, weights = fn(*inputs, keep=keep, scale=scale, **kwargs)
    out.backward(grad_out)
    return out.detach(), weights, [t.grad for t in inputs]


@pytest.mark.parametrize("closed_gradient", ["derivative", "opening"])
@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("scale", [0.4, 3.0])  # 3.0: logits tens apart, closed pairs far above the open maximum
def test_fused_equals_reference_forward_and_backward(dropout, scale, closed_gradient):
    case = _case(dropout=dropout)
    out, weights, grads = _run(gated_attention, *case, scale, closed_gradient=closed_gradient)
    ref_out, _, ref_grads = _run(gated_attention_reference, *case, scale, closed_gradient=closed_gradient)
    assert weights is None
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    for name, a, b in zip(["q", "k", "v", "gate"], grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9, msg=name)
    assert torch.all(out[0, 1, 3] == 0) and torch.all(grads[3][0, 1, 3] == 0), "a row without an open pair is 0"
    closed = case[3] == 0
    assert grads[3][closed].abs().sum() > 0, "closed pairs must get a gate gradient"


def test_reference_backend_runs_the_reference():
    q, k, v, gate, keep, grad_out = _case()
    q.requires_grad_()
    out, _ = gated_attention(q, k, v, gate, scale=0.5, backend="reference")
    assert out.grad_fn is not None and "GatedAttention" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, gated_attention_reference(q, k, v, gate, scale=0.5)[0])


def test_gate_gradient_is_its_definition_and_the_logit_gradient_on_open_pairs():
    q, k, v, gate, keep, grad_out = _case(dropout=True)
    out, _, grads = _run(gated_attention, q, k, v, gate, keep, grad_out, 0.5)
    # Definition: (e^{s_ij} / Z_i) (ρ_ij ∂L/∂o_i · v_j - ∂L/∂o_i · o_i), Z_i over the open pairs of row i.
    logits = q @ k.transpose(-1, -2) * 0.5
    exp = logits.exp()
    norm = (exp * gate).sum(-1, keepdim=True)
    empty = norm == 0
    expected = (
        exp
        / norm.masked_fill(empty, 1.0)
        * (keep * (grad_out @ v.transpose(-1, -2)) - (grad_out * out).sum(-1, keepdim=True))
    )
    torch.testing.assert_close(grads[3], expected.masked_fill(empty, 0.0), atol=1e-10, rtol=1e-9)
    # On an open pair the gate gradient is the gradient of a zero added to its logit (the masked softmax's).
    zero = torch.zeros_like(gate, requires_grad=True)
    masked = torch.softmax((logits + zero).masked_fill(gate == 0, float("-inf")), -1).nan_to_num(0.0)
    ((masked * keep) @ v).backward(grad_out)
    open_pairs = gate == 1
    torch.testing.assert_close(grads[3][open_pairs], zero.grad[open_pairs], atol=1e-10, rtol=1e-9)


def test_opening_gradient_is_the_change_of_a_linear_loss_when_a_closed_pair_opens():
    # For L = <c, o>, opening pair (i, j) moves o_i by e^{s_ij} / (Z_i + e^{s_ij}) (ρ_ij v_j - o_i) exactly, so the
    # "opening" gradient of a closed pair is the change of L itself; open pairs keep the derivative.
    q, k, v, gate, keep, grad_out = _case(dropout=True, n=5, m=6)
    out, _, opening = _run(gated_attention, q, k, v, gate, keep, grad_out, 0.7, closed_gradient="opening")
    _, _, derivative = _run(gated_attention, q, k, v, gate, keep, grad_out, 0.7)
    base = (grad_out * out).sum()
    checked = 0
    for index in (gate == 0).nonzero().tolist():
        if gate[tuple(index[:3])].sum() == 0:
            continue  # a row without an open pair has no output to move
        opened = gate.clone()
        opened[tuple(index)] = 1.0
        moved = (grad_out * gated_attention(q, k, v, opened, keep=keep, scale=0.7)[0]).sum()
        torch.testing.assert_close(opening[3][tuple(index)], moved - base, atol=1e-10, rtol=1e-9)
        checked += 1
    assert checked > 20
    open_pairs = gate == 1
    torch.testing.assert_close(opening[3][open_pairs], derivative[3][open_pairs], atol=0, rtol=0)
    # The derivative at g = 0 overshoots wherever the closed key outscores the row's open keys: |w| > |w / (1 + w)|.
    closed = (gate == 0) & (derivative[3] != 0)
    assert torch.all(opening[3][closed].abs() < derivative[3][closed].abs())


def test_an_unknown_closed_gradient_is_refused():
    q, k, v, gate, _, _ = _case()
    with pytest.raises(ValueError, match="`closed_gradient` must be one of"):
        gated_attention(q, k, v, gate, closed_gradient="secant")


def test_weights_are_the_masked_softmax_and_differentiable():
    q, k, v, gate, _, _ = _case(dtype=torch.float32)
    q.requires_grad_()
    out, weights = gated_attention(q, k, v, gate, scale=0.5, return_weights=True)
    expected_out, expected = dense_masked_attention(q, k, v, gate.bool(), scale=0.5, return_weights=True)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, expected_out)
    assert weights.requires_grad, "transformers' tests retain the attentions' gradient"


def test_fused_runs_in_its_inputs_dtype_under_autocast():
    """Under autocast the fused matmuls would run in bf16, and its backward (no autocast) then on mixed dtypes."""
    case = _case(dtype=torch.float32)
    out, _, grads = _run(gated_attention, *case, 0.4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto_out, _, auto_grads = _run(gated_attention, *case, 0.4)
    assert auto_out.dtype == torch.float32
    torch.testing.assert_close(auto_out, out, atol=0, rtol=0)
    for a, b in zip(auto_grads, grads, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_half_precision_stays_finite_when_a_closed_pair_is_far_above_the_open_maximum():
    """e^(s - max) of a closed pair 39 logits above the open maximum overflows fp16 (max e^11.1); inf x 0 is NaN."""
    logits = torch.tensor([[1.0, 40.0, 0.5], [0.2, 0.1, 0.3]])  # (n, m); pair (0, 1) is closed
    gate = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])[None, None]
    q = torch.eye(2, 3)[None, None]  # (1, 1, 2, 3): q kᵀ = logits with k_j = (logits[0, j], logits[1, j], 0)
    k = torch.cat([logits.t(), torch.zeros(3, 1)], -1)[None, None]  # (1, 1, 3, 3)
    v = torch.randn(1, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    grad_out = torch.ones(1, 1, 2, 3)
    results = {}
    for name, fn in (("fast", gated_attention), ("reference", gated_attention_reference)):
        half = [t.half() for t in (q, k, v, gate, grad_out)]
        out, _, grads = _run(fn, *half[:4], None, half[4], 1.0)
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), name
        results[name] = (out.float(), [g.float() for g in grads])
    torch.testing.assert_close(results["fast"][0], results["reference"][0], atol=2e-3, rtol=2e-3)
    for a, b in zip(results["fast"][1], results["reference"][1], strict=True):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_fused_backward_runs_under_non_reentrant_activation_checkpointing():
    """Non-reentrant checkpointing (transformers' gradient_checkpointing_enable default) lets the backward read each
    saved tensor once; SBM's training attention runs here."""
    case = _case(dtype=torch.float32)
    out, _, grads = _run(gated_attention, *case, 0.4)
    q, k, v, gate, keep, grad_out = case
    inputs = [t.clone().requires_grad_() for t in (q, k, v, gate)]

    def attend(*tensors):
        return gated_attention(*tensors, keep=keep, scale=0.4)[0]

    checkpointed = torch.utils.checkpoint.checkpoint(attend, *inputs, use_reentrant=False)
    checkpointed.backward(grad_out)
    torch.testing.assert_close(checkpointed.detach(), out, atol=0, rtol=0)
    for grad, want in zip((t.grad for t in inputs), grads, strict=True):
        torch.testing.assert_close(grad, want, atol=0, rtol=0)

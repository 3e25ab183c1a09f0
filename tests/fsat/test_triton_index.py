"""FSAT's index prediction and slot selection on the Triton path (`attnzoo.kernels.triton.fsat_index`: one kernel
from the pooled cross to the slots, one back) equal `predict_indices` + `select_slots`: the same slots, the
predictions and the gradients of the cross, the predictor's weight and bias within fp32 round-off, in every
configuration (shared predictor, padding, exploration slots, both scales, with and without the key-position prior,
bf16)."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnzoo.benchmarking.recorder import OpRecorder
from attnzoo.fsat import FSATConfig
from attnzoo.fsat.attention_fsat import FSATAttention

pytest.importorskip("triton")
from triton_devices import TRITON_DEVICES as DEVICES  # noqa: E402

B, N, D, H = 2, 13, 40, 4  # 40 channels: two steps of the products, a masked tail


def module(device: str, **overrides) -> FSATAttention:
    torch.manual_seed(0)
    fields = {"vocab_size": 100, "hidden_size": D, "num_attention_heads": H, "intermediate_size": 2 * D}
    fields |= {"num_dominant_indices": 3, "num_random_indices": 5, "index_scale": "sequence_length", **overrides}
    attention = FSATAttention(FSATConfig(**fields))
    # Larger weights spread the predictions over the sequence (some out of range, dropped).
    torch.nn.init.normal_(attention.index_predictor.weight, std=0.5)
    torch.nn.init.normal_(attention.index_predictor.bias, std=0.5)
    return attention.to(device)


def padding(device: str) -> torch.Tensor:
    valid = torch.arange(N)[None] < torch.tensor([N, 9])[:, None]
    valid[0, 3] = False  # a hole
    return valid.to(device)


def reference_slots(attention: FSATAttention, cross: torch.Tensor, valid: torch.Tensor | None):
    lengths = None if valid is None else valid.sum(-1)
    slots = attention.select_slots(attention.predict_indices(cross, lengths), valid)
    return slots.query, slots.mean


def triton_slots(attention: FSATAttention, cross: torch.Tensor, valid: torch.Tensor | None):
    from attnzoo.kernels.triton import fsat_index as triton_index

    lengths = None if valid is None else valid.sum(-1)
    scale, prior = attention.index_scale_and_prior(N, lengths, cross.device)
    random = attention.num_random if attention.training else 0
    predictor = attention.index_predictor
    return triton_index.fsat_index_slots_triton(
        cross, predictor.weight, predictor.bias, prior, scale, valid, H, attention.num_predicted, random
    )


CASES = list(itertools.product([False, True], [False, True], [False, True], ["sequence_length", "max_length"]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared,padded,train,scale", CASES)
def test_the_kernel_equals_predict_and_select_forward_and_backward(device, shared, padded, train, scale):
    # The key-position prior with the sequence length's scale, none with the fixed one (the paper's predictor).
    prior = "key_position" if scale == "sequence_length" else "none"
    attention = module(device, shared_index_predictor=shared, index_scale=scale, index_prior=prior).train(train)
    valid = padding(device) if padded else None
    cross = torch.randn(B, N, D, device=device, requires_grad=True)
    results = []
    for select in (reference_slots, triton_slots):
        torch.manual_seed(5)  # the same exploration draws
        query, mean = select(attention, cross, valid)
        probe = torch.randn(mean.shape, generator=torch.Generator().manual_seed(1)).to(device)
        inputs = (cross, attention.index_predictor.weight, attention.index_predictor.bias)
        results.append((query, mean, torch.autograd.grad((mean * probe).sum(), inputs)))
    (want_query, want_mean, want_grads), (query, mean, grads) = results
    assert query.dtype == torch.int32 and mean.dtype == torch.float32 and query.is_contiguous()
    assert torch.equal(query, want_query)
    if train and not padded:
        assert bool((query[..., 3:] >= 0).all())  # every exploration slot live
    scale_value = float(attention.config.fsat_index_length) if scale == "max_length" else float(N)
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-6 * scale_value)
    for grad, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("device", DEVICES)
def test_the_kernel_in_bf16_equals_the_fp32_prediction_of_the_bf16_inputs(device):
    """bf16 cross and predictor: the products are exact in fp32, as those of the reference's fp32 copies."""
    attention = module(device).train().bfloat16()
    cross = torch.randn(B, N, D, device=device).bfloat16().requires_grad_()
    torch.manual_seed(5)
    want_query, want_mean = reference_slots(attention, cross, None)
    torch.manual_seed(5)
    query, mean = triton_slots(attention, cross, None)
    assert torch.equal(query, want_query) and mean.dtype == torch.float32
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-5)
    grads = [torch.autograd.grad(m.sum(), (cross, attention.index_predictor.weight)) for m in (mean, want_mean)]
    for grad, want in zip(*grads, strict=True):
        assert grad.dtype == torch.bfloat16
        torch.testing.assert_close(grad, want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))


def test_the_kernel_replaces_the_prediction_and_selection_glue():
    """One launch forward (and the exploration draws in training), two backward, and no other op."""
    from attnzoo.benchmarking.recorder import stubbed_triton_launches

    attention = module("cpu").train().bfloat16()
    cross = torch.randn(1, N, D).bfloat16().requires_grad_()
    _, mean = triton_slots(attention, cross, None)  # the cached prior built
    grad = torch.ones_like(mean)
    recorder = OpRecorder()
    with stubbed_triton_launches(recorder), recorder:
        _, mean = triton_slots(attention, cross, None)
        forward = dict(recorder.total().ops)
        mean.backward(grad)
    assert forward == {"rand": 1}
    total = recorder.total()
    assert dict(total.launches) == {"_index_fwd": 1, "_index_bwd": 1, "_index_dweight": 1}
    assert dict(total.ops) == {"rand": 1}

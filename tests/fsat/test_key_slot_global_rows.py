"""Key-slot attention with `global_rows=True` (FSAT's global queries' dense rows inside the primitive): the Triton
kernels (under the interpreter on CPU) compute those rows themselves and equal the reference (the method's rows, then
`replace_global_rows`) on outputs, pair counts and the gradients of q, k, v and the predictions, with one and three
global tokens, padding (a padded global position included), both global softmaxes, fp32 and bf16, in training with
attention dropout (the rows' hashed mask regenerated in forward and in both backward passes); the fallback beyond 16
global tokens too. A replaced row's slots get no prediction gradient."""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import key_slot_attention
from attnzoo.kernels.global_rows import replace_global_rows

pytest.importorskip("triton")

from key_slot_cases import finish_slots, run  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests (CUDA: tests/gpu)")

B, H, N, D, S, M = 2, 2, 13, 8, 4, 3


def make_slots(seed: int = 0, padded: bool = False, dtype: torch.dtype = torch.float32, length: int = N):
    """Random slots (dropped ones included); with `padded`, example 1 ends in padding and example 0 has a hole at
    position 0 (a padded global position), and the slots of padded keys or naming padded queries are dropped."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, length, D, generator=g).to(dtype).requires_grad_() for _ in range(3))
    query = torch.randint(-1, length, (B, H, length, S), generator=g, dtype=torch.int32)
    query[:, :, 5, :2] = 1  # edges into global query 1 (replaced when g >= 2)
    query[:, :, 7, 0] = 0  # and into query 0 (padded in example 0 with `padded`)
    valid = None
    if padded:
        valid = torch.ones(B, length, dtype=torch.bool)
        valid[1, 9:] = False
        valid[0, 0] = False
    return finish_slots(q, k, v, query, valid, g)


CASES = [
    pytest.param({"num_global": 1}, False, torch.float32, id="g1"),
    pytest.param({"num_global": 1}, True, torch.float32, id="g1-padded"),
    pytest.param({"num_global": 3}, True, torch.float32, id="g3-padded"),
    pytest.param({"num_global": 3, "global_softmax": "shared", "truncate": True}, False, torch.float32, id="shared"),
    pytest.param({"num_global": 3}, True, torch.bfloat16, id="g3-padded-bf16"),
    pytest.param({"num_global": 1}, False, torch.bfloat16, id="g1-bf16"),
    pytest.param({"num_global": 2, "dropout_p": 0.3, "training": True}, True, torch.float32, id="dropout"),
]


@pytest.mark.parametrize("overrides,padded,dtype", CASES)
def test_triton_global_rows_equal_the_reference_forward_and_backward(overrides, padded, dtype, length=N):
    slots = make_slots(padded=padded, dtype=dtype, length=length)
    kwargs = {"num_graph_slots": M, "variance": 4.0, "scale": 0.4, "global_rows": True, **overrides}
    out, pairs, grads = run("triton", slots, **kwargs)
    expected, expected_pairs, expected_grads = run("reference", slots, **kwargs)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(out, expected, **tolerance)
    assert torch.equal(pairs, expected_pairs)
    for name, grad, expected_grad in zip(["q", "k", "v", "mean"], grads, expected_grads, strict=True):
        assert grad.dtype == expected_grad.dtype, name
        torch.testing.assert_close(grad, expected_grad, **tolerance, msg=name)


def test_more_than_16_global_rows_fall_back_to_the_torch_rows_after_the_kernel():
    test_triton_global_rows_equal_the_reference_forward_and_backward({"num_global": 17}, True, torch.float32, 19)


@pytest.mark.parametrize("num_global", [1, 3])
def test_the_reference_replaces_the_real_global_rows_and_their_slots_get_no_gradient(num_global):
    q, k, v, query, mean, valid = slots = make_slots(padded=True)
    kwargs = {"num_graph_slots": M, "variance": 4.0, "scale": 0.4, "num_global": num_global}
    plain, _, _ = run("reference", slots, **kwargs)
    out, _, grads = run("reference", slots, global_rows=True, **kwargs)
    rows = {"scale": 0.4, "dropout_p": 0.0, "training": False}
    torch.testing.assert_close(out, replace_global_rows(plain, q, k, v, valid, num_global, **rows), rtol=0, atol=0)
    replaced = (
        (query >= 0)
        & (query < num_global)
        & valid[:, None, None, :].expand(B, H, N, N).gather(3, query.clamp(min=0).long())
    )
    assert bool(replaced.any())
    assert torch.equal(grads[3][replaced], torch.zeros_like(grads[3][replaced]))
    # A padded global position (position 0 of example 0) keeps the method's row.
    torch.testing.assert_close(out[0, :, 0], plain[0, :, 0], rtol=0, atol=0)
    assert not torch.equal(out[1, :, 0], plain[1, :, 0])


def test_global_rows_must_be_a_bool():
    q, k, v, query, mean, valid = make_slots()
    with pytest.raises(ValueError, match="global_rows"):
        key_slot_attention(q, k, v, query, mean, num_graph_slots=M, variance=4.0, num_global=1, global_rows=1)

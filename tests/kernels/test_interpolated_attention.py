"""Interpolated attention (A²-Former's primitive): the fused Triton kernel == the torch reference, outputs, density
and the gradients of q, k, v, the offsets and the point logits; on CPU under Triton's interpreter, and on CUDA (gpu).

The reference materialises the selection (positions, neighbours, weights) and runs gathered attention; the kernel
recomputes it from the offsets in registers. The cases cover what the selection does: padding on either side, holes
bridged between real keys, padded and real global keys, causal queries after cached keys (and queries before the
first real key, which have none), reflection at the ends, learned point logits and dropout.
"""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import interpolated_attention
from attnzoo.kernels.interpolated import check_interpolated, real_neighbours
from triton_devices import TRITON_DEVICES as DEVICES

pytest.importorskip("triton")

B, H, NK, D, K = 2, 2, 14, 8, 3


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def _key_valid() -> torch.Tensor:
    """Sample 0: a 3-token hole, a 1-token hole and right padding; sample 1: left padding (key 0, a global
    position, is padding) and a long hole."""
    key_valid = torch.ones(B, NK, dtype=torch.bool)
    key_valid[0, [4, 5, 6, 9, 12, 13]] = False
    key_valid[1, [0, 1, 5, 6, 7, 8]] = False
    return key_valid


CASES = {
    # The global queries' rows: dense in the kernels (sample 0's are real, sample 1's padding keeps the method's).
    "holes-globals": {"num_global": 2, "global_rows": True},
    "global-slots-only": {"num_global": 2},
    "causal-after-cache": {"causal": True, "num_queries": 9},  # queries 5..13; sample 1's query 5 sees keys 2..4
    "causal-no-key-yet": {"causal": True, "num_queries": NK},  # sample 1's queries 0 and 1 have no key at all
    "reflect": {"position_bound": "reflect", "num_global": 1, "global_rows": True},
    "linear-logits": {"point_logits": True, "num_global": 1, "global_rows": True},  # only the global rows take q
    # Dropout in training: the global rows' mask comes from the global RNG, as the reference draws it.
    "linear-logits-dropout": {"point_logits": True, "dropout": True, "num_global": 1, "global_rows": True},
    "no-mask-many-blocks": {"mask": False, "num_queries": 37, "num_keys": 70, "num_global": 1, "global_rows": True},
}


def _case(name: str, device: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """Inputs of one case: tensors, keyword arguments and the gradient of the output."""
    spec = dict(CASES[name])
    num_keys = spec.pop("num_keys", NK)
    num_queries = spec.pop("num_queries", num_keys)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, num_queries, D, generator=g)
    k, v = (torch.randn(B, H, num_keys, D, generator=g) for _ in range(2))
    # Fractional points around the query, many beyond the ends of the span (bounded there); point 0 on whole tokens
    # (as at initialisation), where one neighbour has weight 0 but still carries the position gradient.
    offsets = torch.randn(B, H, num_queries, K, generator=g) * 5
    offsets[..., 0] = offsets[..., 0].round()
    logits = torch.randn(B, H, num_queries, K, generator=g) if spec.pop("point_logits", False) else None
    num_global = spec.get("num_global", 0)
    keep = None
    if spec.pop("dropout", False):
        keep = torch.rand(B, H, num_queries, K + num_global, generator=g) > 0.3
        spec.update(dropout_p=0.3, training=True)
    grad_out = torch.randn(B, H, num_queries, D, generator=g)
    if spec.pop("mask", True):
        spec["key_valid"] = _key_valid().to(device)
    if spec.get("causal"):
        spec["query_offset"] = num_keys - num_queries
    tensors = [t if t is None else t.to(device) for t in (q, k, v, offsets, logits)]
    tensors[:3] = [t.to(dtype) for t in tensors[:3]]
    leaves = [t if t is None else t.requires_grad_() for t in tensors]
    spec.update(keep=None if keep is None else keep.to(device), scale=0.6)
    return leaves, spec, grad_out.to(device=device, dtype=dtype)


def _run(leaves, kwargs, grad_out, backend: str):
    """Output, density and the gradient of every input that takes one (`leaves`: q, k, v, offsets, point logits)."""
    q, k, v, offsets, point_logits = leaves
    torch.manual_seed(0)  # the same dropout on the global rows in every implementation
    out, density = interpolated_attention(q, k, v, offsets, point_logits=point_logits, backend=backend, **kwargs)
    inputs = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
    return out, density, grads


def _assert_close(actual, expected, tol):
    """Within `tol` of the expected tensor's largest magnitude (at least 1)."""
    if expected is None:
        assert actual is None or not actual.any()
        return
    assert actual.dtype == expected.dtype and torch.isfinite(actual).all()
    scale = max(float(expected.detach().abs().max()), 1.0)
    torch.testing.assert_close(actual, expected, atol=tol * scale, rtol=0)


@pytest.mark.parametrize("name", list(CASES))
def test_fused_kernel_matches_reference(device, name):
    leaves, kwargs, grad_out = _case(name, device)
    out, density, grads = _run(leaves, kwargs, grad_out, "triton")
    detached = [t if t is None else t.detach().clone().requires_grad_() for t in leaves]
    expected_out, expected_density, expected_grads = _run(detached, kwargs, grad_out, "reference")
    _assert_close(out, expected_out, 2e-5)
    torch.testing.assert_close(density, expected_density, atol=1e-6, rtol=1e-6)
    for got, want in zip(grads, expected_grads, strict=True):
        _assert_close(got, want, 2e-5)
    offsets_grad = grads[3]
    assert offsets_grad.abs().sum() > 0  # the positions learn
    if name == "causal-no-key-yet":
        # Queries before the first real key read nothing: zero output, and no gradient reaches their inputs.
        assert not out[1, :, :2].any() and not offsets_grad[1, :, :2].any() and not grads[0][1, :, :2].any()


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 5e-2), (torch.float16, 6e-3)], ids=["bf16", "fp16"])
def test_fused_kernel_in_half_precision_matches_fp32_reference(device, dtype, tol):
    leaves, kwargs, grad_out = _case("holes-globals", device, dtype, seed=1)
    out, _, grads = _run(leaves, kwargs, grad_out, "triton")
    assert out.dtype == dtype and grads[0].dtype == dtype and grads[3].dtype == torch.float32
    # The reference runs in fp32 on the same (rounded) inputs: only the kernel's own rounding remains.
    exact = [t if t is None else t.detach().float().requires_grad_() for t in leaves]
    expected_out, _, expected_grads = _run(exact, kwargs, grad_out.float(), "reference")
    _assert_close(out.float(), expected_out, tol)
    for got, want in zip(grads, expected_grads, strict=True):
        _assert_close(got.float(), want, tol)


def test_cpu_torch_path_matches_reference():
    leaves, kwargs, grad_out = _case("linear-logits-dropout", "cpu", torch.float64)
    leaves[3:] = [t.detach().double().requires_grad_() for t in leaves[3:]]
    fast = _run(leaves, kwargs, grad_out, "fast")
    reference = _run(leaves, kwargs, grad_out, "reference")
    for got, want in zip([fast[0], fast[1], *fast[2]], [reference[0], reference[1], *reference[2]], strict=True):
        _assert_close(got, want, 1e-10)


def test_key_tables_match_the_torch_neighbours_across_chunks(device):
    from attnzoo.kernels.triton.global_rows import key_tables

    key_valid = torch.rand(3, 45, generator=torch.Generator().manual_seed(2)) < 0.4
    key_valid[1] = False  # a sample without any real key
    key_valid[2, :40] = False  # only the last chunk holds real keys
    before, after = real_neighbours(key_valid)
    for block in (16, 1024):  # chunks of 16 carry the running nearest key from chunk to chunk
        got_before, got_after, real = key_tables(key_valid.to(device), block=block)
        assert torch.equal(got_before.cpu().long(), before) and torch.equal(got_after.cpu().long(), after)
        assert real.cpu().tolist() == key_valid.sum(-1).clamp(min=1).tolist()


def test_density_counts_distinct_keys_with_weight_and_skips_padded_global_keys(device):
    """Every point on the query's own key: a query reads itself and the global key 0, once if it is key 0."""
    N = 6
    q = torch.randn(2, 1, N, D, device=device)
    offsets = torch.zeros(2, 1, N, 2, device=device)  # two points, both on the query itself: one distinct key
    key_valid = torch.ones(2, N, dtype=torch.bool, device=device)
    key_valid[1, 0] = False  # sample 1: the global position is padding (and so is query 0)
    expected = torch.tensor([[(1 + 2 * (N - 1)) / N / N], [1 / (N - 1)]], device=device)
    for backend in ("triton", "reference"):
        _, density = interpolated_attention(q, q, q, offsets, key_valid=key_valid, num_global=1, backend=backend)
        torch.testing.assert_close(density, expected)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"offsets": torch.zeros(B, H, 5, K)}, "offsets must be floating point of shape"),
        ({"offsets": torch.zeros(B, H, NK, K, dtype=torch.long)}, "offsets must be floating point"),
        ({"point_logits": torch.zeros(B, H, NK, K + 1)}, "point_logits must have the shape"),
        ({"key_valid": torch.ones(B, NK + 1, dtype=torch.bool)}, "key_valid must be bool of shape"),
        ({"num_global": NK + 1}, "num_global must be in"),
        ({"position_bound": "wrap"}, "position_bound must be one of"),
        ({"query_offset": -1}, "query_offset must be non-negative"),
        ({"keep": torch.ones(B, H, NK, K, dtype=torch.bool), "num_global": 1}, r"keep must be bool of shape"),
        ({"global_rows": True, "num_global": 1, "causal": True}, "global_rows needs non-causal queries"),
        ({"global_rows": True, "num_global": 1, "query_offset": 2}, "global_rows needs non-causal queries"),
    ],
)
def test_bad_inputs_raise_naming_the_problem(change, match):
    q = torch.randn(B, H, NK, D)
    args = {"offsets": torch.zeros(B, H, NK, K), "point_logits": None, "key_valid": None, "num_global": 0}
    args.update(position_bound="clamp", query_offset=0, keep=None, causal=False, global_rows=False)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        check_interpolated(q, q, q, **args)


def test_fused_kernel_refuses_offsets_it_would_round(device):
    q = torch.randn(1, 1, 4, D, device=device)
    with pytest.raises(ValueError, match="fp32 offsets"):
        interpolated_attention(q, q, q, torch.zeros(1, 1, 4, 2, dtype=torch.float64, device=device), backend="triton")

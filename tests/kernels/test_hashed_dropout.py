"""Attention dropout from a hashed seed (`kernels.dropout`, `kernels.hashing`): the Triton kernels regenerate each
decision from the position they read and equal the reference, which materialises the same mask, forward and
backward; that mask is `grid_keep`'s over (batch * heads + head, query or key, slot); one seed gives different
decisions from another. (SBM's edge lists: `test_padded_edges.py`; the global rows: `test_global_rows.py`.)"""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import gathered_attention, interpolated_attention, key_slot_attention
from attnzoo.kernels.hashing import grid_keep

pytest.importorskip("triton")

from key_slot_cases import finish_slots  # noqa: E402

from triton_devices import TRITON_DEVICES as DEVICES  # noqa: E402

B, H, N, D, K = 2, 2, 12, 8, 4
P = 0.3


def _key_valid() -> torch.Tensor:
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[1, 8:] = False
    return key_valid


def _gathered(device: str, backend: str, seed: torch.Tensor | None, keep: torch.Tensor | None):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(device).requires_grad_() for _ in range(3))
    idx = torch.randint(0, N, (B, H, N, K), generator=g).to(device)
    out = gathered_attention(
        q, k, v, idx, scale=0.5, dropout_p=P, training=True, keep=keep, keep_seed=seed, global_rows=1,
        key_valid=_key_valid().to(device), global_seed=torch.tensor(5, device=device), backend=backend,
    )  # fmt: skip
    return out, (q, k, v), (B, H, N, K)


def _interpolated(device: str, backend: str, seed: torch.Tensor | None, keep: torch.Tensor | None):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(device).requires_grad_() for _ in range(3))
    offsets = (torch.randn(B, H, N, K, generator=g) * 3).to(device).requires_grad_()
    out, _ = interpolated_attention(
        q, k, v, offsets, num_global=2, global_rows=True, key_valid=_key_valid().to(device), scale=0.5,
        dropout_p=P, training=True, keep=keep, keep_seed=seed, global_seed=torch.tensor(5, device=device),
        backend=backend,
    )  # fmt: skip
    return out, (q, k, v, offsets), (B, H, N, K + 2)


def _key_slots(device: str, backend: str, seed: torch.Tensor | None, keep: torch.Tensor | None):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, N, D, generator=g).requires_grad_() for _ in range(3))
    query = torch.randint(-1, N, (B, H, N, K), generator=g, dtype=torch.int32)
    q, k, v, query, mean, valid = finish_slots(q, k, v, query, _key_valid(), g)
    q, k, v, mean = (t.detach().to(device).requires_grad_() for t in (q, k, v, mean))
    masks = {} if keep is None else {"slot_keep": keep[..., :K], "global_keep": keep[..., K:]}
    out, _ = key_slot_attention(
        q, k, v, query.to(device), mean, num_graph_slots=2, variance=4.0, num_global=2, global_rows=True,
        key_valid=valid.to(device), scale=0.5, dropout_p=P, training=True, keep_seed=seed,
        global_seed=torch.tensor(5, device=device), backend=backend, **masks,
    )  # fmt: skip
    return out, (q, k, v, mean), (B, H, N, K + 2)


PRIMITIVES = {"gathered": _gathered, "interpolated": _interpolated, "key_slots": _key_slots}


def _forward_backward(primitive: str, device: str, backend: str, seed=None, keep=None):
    out, leaves, shape = PRIMITIVES[primitive](device, backend, seed, keep)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
    grads = torch.autograd.grad(out, leaves, grad)
    return out.detach().cpu(), [t.cpu() for t in grads], shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("primitive", list(PRIMITIVES))
def test_hashed_dropout_in_the_kernels_equals_the_reference(primitive, device):
    seed = torch.tensor(2**40 + 17)
    out, grads, shape = _forward_backward(primitive, device, "triton", seed.to(device))
    expected, expected_grads, _ = _forward_backward(primitive, "cpu", "reference", seed)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-5)
    # the reference's mask is grid_keep's: fed explicitly, it gives the same output
    explicit, _, _ = _forward_backward(primitive, "cpu", "reference", keep=grid_keep(seed, shape, P))
    torch.testing.assert_close(explicit, expected, atol=0, rtol=0)
    # and another seed drops other entries
    other, _, _ = _forward_backward(primitive, "cpu", "reference", torch.tensor(3))
    assert not torch.allclose(other, expected)


def test_a_mask_and_a_seed_together_are_refused():
    keep = torch.ones(B, H, N, K, dtype=torch.bool)
    with pytest.raises(ValueError, match="not both"):
        _gathered("cpu", "reference", torch.tensor(1), keep)

"""Second derivatives through the hand-written backwards (gradient penalties, Hessian-vector products).

The fused kernels' backwards are not themselves differentiable: a second derivative through them must stop with
PyTorch's `once_differentiable` error, not come out wrong (the gather / index_add fallback returned wrong numbers)
or stop on an unrelated shape error. The references differentiate twice.
"""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import edge_attention, gathered_attention
from attnzoo.kernels.edgelist import edge_attention_with_mask
from attnzoo.kernels.gathered import gathered_attention_with_mask

R, C, D = 5, 4, 3


def _edges() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, R, (12,), generator=g), torch.randint(0, C, (12,), generator=g)


def _edge_fn(kind: str):
    rows, cols = _edges()
    if kind in ("csr", "fallback"):
        options = {"logit_bias": None, "edge_weight": None, "scale": None, "keep": None, "dropout_p": 0.0}
        return lambda q, k, v: edge_attention_with_mask(
            q, k, v, rows, cols, **options, sorted_rows=False, use_sparse=kind == "csr"
        )
    return lambda q, k, v: edge_attention(q, k, v, rows, cols, backend=kind)


def _gathered_fn(kind: str, mixed: bool):
    g = torch.Generator().manual_seed(1)
    shape = (1, 1, R, 3, 2) if mixed else (1, 1, R, 3)
    idx = torch.randint(0, C, shape, generator=g)
    weight = torch.rand(shape, generator=g) if mixed else None
    if kind in ("csr", "fallback"):
        return lambda q, k, v: gathered_attention_with_mask(
            q, k, v, idx, None, scale=None, keep=None, dropout_p=0.0, weight=weight, use_sparse=kind == "csr"
        )
    return lambda q, k, v: gathered_attention(q, k, v, idx, weight=weight, backend=kind)


def _penalty_backward(fn, shapes, dtype) -> None:
    """`(|dL/dq|^2).backward()` with `L = |fn(q, k, v)|^2`, the gradient-penalty pattern."""
    q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for shape in shapes)
    (grad_q,) = torch.autograd.grad(fn(q, k, v).pow(2).sum(), q, create_graph=True)
    grad_q.pow(2).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


EDGE_SHAPES = ((R, D), (C, D), (C, D))
GATHERED_SHAPES = ((1, 1, R, D), (1, 1, C, D), (1, 1, C, D))


@pytest.mark.parametrize("kind", ["csr", "fallback", "triton"])
def test_edge_attention_refuses_a_second_derivative_through_its_kernels(kind):
    if kind == "triton":
        pytest.importorskip("triton")
    dtype = torch.float32 if kind == "triton" else torch.float64
    with pytest.raises(RuntimeError, match="differentiate twice"):
        _penalty_backward(_edge_fn(kind), EDGE_SHAPES, dtype)


@pytest.mark.parametrize("mixed", [False, True], ids=["slots", "mixed_slots"])
@pytest.mark.parametrize("kind", ["csr", "fallback", "triton"])
def test_gathered_attention_refuses_a_second_derivative_through_its_kernels(kind, mixed):
    if kind == "triton":
        pytest.importorskip("triton")
    dtype = torch.float32 if kind == "triton" else torch.float64
    with pytest.raises(RuntimeError, match="differentiate twice"):
        _penalty_backward(_gathered_fn(kind, mixed), GATHERED_SHAPES, dtype)


def test_the_references_differentiate_twice():
    _penalty_backward(_edge_fn("reference"), EDGE_SHAPES, torch.float64)
    _penalty_backward(_gathered_fn("reference", mixed=True), GATHERED_SHAPES, torch.float64)

"""Fixed-size edge lists whose tail is padding (row `R`): `edge_attention(padded=True)` on every backend and the CSR
products (`CSRPattern` with `padded`, and its Triton kernels) equal the same computations on the real edges alone,
forward and backward, and the padding gets zero gradient. On CPU the Triton kernels run under the interpreter."""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import CSRPattern, edge_attention
from attnzoo.kernels.csr import row_pointers

R, C, D, K = 9, 7, 8, 5
PADDING = 6


def _padded_graph(seed: int = 0):
    """Row-sorted edges with empty rows and a repeated pair, then `PADDING` padding edges `(R, 0)`."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(R, C, generator=g) < 0.45
    mask[[2, 6]] = False  # empty rows
    flat = mask.reshape(-1).nonzero().squeeze(1)
    rows, cols = flat // C, flat % C
    rows, cols = torch.cat([rows, rows[:1]]), torch.cat([cols, cols[:1]])  # a repeated pair (counts twice)
    order = torch.argsort(rows, stable=True)
    rows, cols = rows[order], cols[order]
    real = rows.shape[0]
    rows = torch.cat([rows, torch.full((PADDING,), R)])
    cols = torch.cat([cols, torch.zeros(PADDING, dtype=torch.long)])
    return rows, cols, real


def _inputs(dtype=torch.float32, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype).requires_grad_() for shape in ((R, D), (C, D), (C, D))]


INTERPRETER = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CUDA: tests/gpu)")


def _needs_triton(implementation: str) -> None:
    if implementation == "triton":
        pytest.importorskip("triton")


@pytest.mark.parametrize("indices", ["int64", "int32-crow"])
@pytest.mark.parametrize("backend", ["reference", "fast", pytest.param("triton", marks=INTERPRETER)])
def test_padded_edge_attention_equals_the_real_edges(backend, indices):
    """Also with int32 indices and the caller's row pointers (SBM's fused sampler hands both to the kernel)."""
    _needs_triton(backend)
    rows, cols, real = _padded_graph()
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(rows.shape, generator=g).requires_grad_()
    grad_out = torch.randn(R, D, generator=g)
    results = []
    for padded in (True, False):
        q, k, v = _inputs()
        b = bias.detach().clone().requires_grad_()
        keep = slice(None) if padded else slice(0, real)
        edges, options = (rows[keep], cols[keep]), {}
        if padded and indices == "int32-crow":
            edges, options = (rows.int(), cols.int()), {"crow": row_pointers(rows, R)}
        out = edge_attention(
            q, k, v, *edges, logit_bias=b[keep], sorted_rows=True, padded=padded, backend=backend, **options
        )
        (out * grad_out).sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad, b.grad))
    (out_p, *grads_p), (out_r, *grads_r) = results
    torch.testing.assert_close(out_p, out_r)
    for got, want in zip(grads_p[:3], grads_r[:3], strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads_p[3][:real], grads_r[3][:real])
    assert torch.all(grads_p[3][real:] == 0), "padding edges get no gradient"
    assert torch.all(out_p[[2, 6]] == 0), "empty rows stay zero"


def test_padding_is_refused_where_not_declared_and_bounded_where_declared():
    rows, cols, _ = _padded_graph()
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="crow must come with sorted_rows=True"):
        edge_attention(q, k, v, rows, cols, padded=True, crow=row_pointers(rows, R))
    with pytest.raises(TypeError, match="int64 or int32"):
        edge_attention(q, k, v, rows.short(), cols, sorted_rows=True, padded=True)
    with pytest.raises(IndexError, match="rows out of range"):
        edge_attention(q, k, v, rows, cols, sorted_rows=True)
    beyond = rows.clone()
    beyond[-1] = R + 1
    with pytest.raises(IndexError, match="rows out of range"):
        edge_attention(q, k, v, beyond, cols, sorted_rows=True, padded=True)


def _products(pattern: CSRPattern, values, a, x, y):
    scores = pattern.sddmm(a, x, 0.5)
    gx, gy = pattern.spmm_pair(values, x, y)
    return scores, gx, gy, pattern.spmm(values, x), pattern.spmm_t(values, y)


@pytest.mark.parametrize("implementation", ["sparse", "gather", pytest.param("triton", marks=INTERPRETER)])
def test_csr_products_of_a_padded_pattern_equal_those_of_its_real_edges(implementation):
    _needs_triton(implementation)
    rows, cols, real = _padded_graph(seed=3)
    g = torch.Generator().manual_seed(4)
    values = torch.randn(rows.shape, generator=g)
    a = torch.randn(R, K, generator=g)  # rows' factor of the SDDMM, and `y` of Gᵀ @ y
    x = torch.randn(C, K, generator=g)
    crow = row_pointers(rows, R)
    assert int(crow[-1]) == real
    padded = CSRPattern(
        rows, cols, crow, R, C, None, implementation == "sparse", padded=True, triton=implementation == "triton"
    )
    scores, gx, gy, spmm, spmm_t = _products(padded, values, a, x, a)
    # Definition on the real edges: dense matrices.
    dense = torch.zeros(R, C).index_put_((rows[:real], cols[:real]), values[:real], accumulate=True)
    torch.testing.assert_close(gx, dense @ x)
    torch.testing.assert_close(spmm, dense @ x)
    torch.testing.assert_close(gy, dense.t() @ a)
    torch.testing.assert_close(spmm_t, dense.t() @ a)
    torch.testing.assert_close(scores[:real], 0.5 * (a[rows[:real]] * x[cols[:real]]).sum(-1))
    assert scores.shape == rows.shape and torch.all(scores[real:] == 0)


@pytest.mark.parametrize("implementation", ["sparse", "gather", pytest.param("triton", marks=INTERPRETER)])
def test_spmm_pair_masks_and_clips_the_values(implementation):
    """SBM's estimator sends `clamp(g * sampled, -clip, clip)` through the products: the Triton kernel makes these
    entries as it loads them; every path equals the products of the explicit entries."""
    _needs_triton(implementation)
    rows, cols, _ = _padded_graph(seed=6)
    g = torch.Generator().manual_seed(7)
    values = 3 * torch.randn(rows.shape, generator=g)
    mask = torch.rand(rows.shape, generator=g) < 0.6
    x, y = torch.randn(C, K, generator=g), torch.randn(R, K, generator=g)
    pattern = CSRPattern(
        rows, cols, row_pointers(rows, R), R, C, None, implementation == "sparse", padded=True,
        triton=implementation == "triton",
    )  # fmt: skip
    gx, gy = pattern.spmm_pair(values, x, y, mask=mask, clip=1.5)
    want_x, want_y = pattern.spmm_pair((values * mask).clamp(-1.5, 1.5), x, y)
    torch.testing.assert_close(gx, want_x)
    torch.testing.assert_close(gy, want_y)
    assert not torch.allclose(gx, pattern.spmm_pair(values, x, y)[0])  # the mask and the clip matter here


@INTERPRETER
def test_triton_products_skip_an_absent_factor():
    _needs_triton("triton")
    rows, cols, _ = _padded_graph(seed=5)
    pattern = CSRPattern(rows, cols, row_pointers(rows, R), R, C, None, False, padded=True, triton=True)
    values, x = torch.randn(rows.shape), torch.randn(C, K)
    gx, gy = pattern.spmm_pair(values, x, None)
    assert gy is None and gx.shape == (R, K)
    assert pattern.spmm_pair(values, None, None) == (None, None)


@pytest.mark.parametrize("backend", ["reference", "fast", pytest.param("triton", marks=INTERPRETER)])
def test_hashed_edge_dropout_equals_its_materialised_mask(backend):
    """`keep_seed` (SBM's dropout): each edge's decision is the counter hash of the seed and its position in the
    padded list, which the Triton kernels regenerate in forward and backward and the other backends materialise;
    all equal the reference fed that mask explicitly (the real edges' part of it)."""
    _needs_triton(backend)
    from attnzoo.kernels.hashing import position_keep

    rows, cols, real = _padded_graph()
    g = torch.Generator().manual_seed(3)
    bias = torch.randn(rows.shape, generator=g)
    grad_out = torch.randn(R, D, generator=g)
    seed = torch.tensor(2024)
    keep = position_keep(seed, rows.shape[0], 0.4)
    assert keep[:real].any() and not keep[:real].all()
    results = []
    for options in (
        {"keep_seed": seed, "backend": backend, "padded": True, "rows": rows, "cols": cols},
        {"keep": keep[:real], "backend": "reference", "padded": False, "rows": rows[:real], "cols": cols[:real]},
    ):
        q, k, v = _inputs()
        b = bias[: options["rows"].shape[0]].clone().requires_grad_()
        edges = options.pop("rows"), options.pop("cols")
        out = edge_attention(q, k, v, *edges, logit_bias=b, dropout_p=0.4, training=True, sorted_rows=True, **options)
        out.backward(grad_out)
        results.append((out.detach(), q.grad, k.grad, v.grad, b.grad[:real]))
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        edge_attention(*_inputs(), rows, cols, keep=keep, keep_seed=seed, dropout_p=0.4, training=True, padded=True)

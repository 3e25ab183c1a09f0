from __future__ import annotations

import functools

import pytest
import torch

from attnzoo.kernels import dense_masked_attention, edge_attention, edge_attention_reference
from attnzoo.kernels.edgelist import edge_attention_reference_with_mask, edge_attention_with_mask

TOLERANCES = [(torch.float64, 1e-10), (torch.float32, 1e-5)]
R, C, D = 11, 13, 8
EMPTY_ROWS = (3, 7)


def _fast(use_sparse: bool):
    """Fast edge attention forced onto the CSR kernels or onto the gather/index_add fallback."""

    def run(q, k, v, rows, cols, *, logit_bias=None, edge_weight=None, scale=None, keep=None, dropout_p=0.0):
        return edge_attention_with_mask(
            q,
            k,
            v,
            rows,
            cols,
            logit_bias=logit_bias,
            edge_weight=edge_weight,
            scale=scale,
            keep=keep,
            dropout_p=dropout_p,
            sorted_rows=False,
            use_sparse=use_sparse,
        )

    return run


def _reference(q, k, v, rows, cols, *, logit_bias=None, edge_weight=None, scale=None, keep=None, dropout_p=0.0):
    return edge_attention_reference_with_mask(
        q,
        k,
        v,
        rows,
        cols,
        logit_bias=logit_bias,
        edge_weight=edge_weight,
        scale=scale,
        keep=keep,
        dropout_p=dropout_p,
    )


FAST = [pytest.param(_fast(True), id="csr"), pytest.param(_fast(False), id="fallback")]


def _graph(seed: int, *, unique: bool, duplicates: int = 0):
    """Unsorted random edges over an (R, C) pattern leaving EMPTY_ROWS without edges."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(R, C, generator=g) < 0.4
    mask[list(EMPTY_ROWS)] = False
    rows, cols = mask.nonzero(as_tuple=True)
    if not unique:
        pick = torch.randint(0, rows.numel(), (duplicates,), generator=g)
        rows, cols = torch.cat([rows, rows[pick]]), torch.cat([cols, cols[pick]])
    perm = torch.randperm(rows.numel(), generator=g)
    return rows[perm], cols[perm], mask


def _tensors(dtype, num_edges: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(R, D, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(C, D, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(C, D, generator=g, dtype=dtype, requires_grad=True)
    bias = torch.randn(num_edges, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.rand(num_edges, generator=g, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(R, D, generator=g, dtype=dtype)
    return q, k, v, bias, weight, grad_out


def _out_and_grads(fn, inputs, grad_out, **kwargs):
    out = fn(*inputs, **kwargs)
    return [out, *torch.autograd.grad(out, inputs, grad_out)]


def _assert_all_close(actual, expected, atol):
    for a, b in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


@pytest.mark.parametrize("fast", FAST)
@pytest.mark.parametrize("dtype,atol", TOLERANCES)
def test_matches_reference_and_dense_mask(fast, dtype, atol):
    rows, cols, mask = _graph(0, unique=True)
    q, k, v, _, _, grad_out = _tensors(dtype, rows.numel())
    fns = [
        functools.partial(fast, rows=rows, cols=cols),
        functools.partial(_reference, rows=rows, cols=cols),
        functools.partial(_dense_as_edges, mask=mask),
    ]
    fast_res, ref_res, dense_res = (_out_and_grads(fn, (q, k, v), grad_out, scale=0.4) for fn in fns)
    _assert_all_close(fast_res, ref_res, atol)
    _assert_all_close(ref_res, dense_res, atol)


def _dense_as_edges(q, k, v, *, mask, scale):
    out, _ = dense_masked_attention(q[None, None], k[None, None], v[None, None], mask, scale=scale)
    return out[0, 0]


@pytest.mark.parametrize("fast", FAST)
@pytest.mark.parametrize("dtype,atol", TOLERANCES)
def test_bias_and_weight_match_reference_and_dense_formula(fast, dtype, atol):
    rows, cols, mask = _graph(1, unique=True)
    q, k, v, bias, weight, grad_out = _tensors(dtype, rows.numel(), seed=1)
    inputs = (q, k, v, bias, weight)
    kwargs = {"rows": rows, "cols": cols}

    def call(fn):
        out = fn(q, k, v, logit_bias=bias, edge_weight=weight, **kwargs)
        return [out, *torch.autograd.grad(out, inputs, grad_out)]

    def dense_formula(q, k, v, *, rows, cols, logit_bias, edge_weight):
        # Independent check of the definition: bias inside the softmax, weight after it without renormalising.
        scores = q @ k.T * D**-0.5 + torch.zeros(R, C, dtype=q.dtype).index_put((rows, cols), logit_bias)
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)
        return (probs * torch.zeros(R, C, dtype=q.dtype).index_put((rows, cols), edge_weight)) @ v

    fast_res, ref_res, dense_res = call(fast), call(_reference), call(dense_formula)
    _assert_all_close(fast_res, ref_res, atol)
    _assert_all_close(ref_res, dense_res, atol)


@pytest.mark.parametrize("fast", FAST)
@pytest.mark.parametrize("dtype,atol", TOLERANCES)
def test_duplicates_count_twice_like_reference(fast, dtype, atol):
    rows, cols, _ = _graph(2, unique=False, duplicates=15)
    q, k, v, bias, weight, grad_out = _tensors(dtype, rows.numel(), seed=2)
    kwargs = {"rows": rows, "cols": cols, "logit_bias": bias, "edge_weight": weight}
    results = []
    for fn in (fast, _reference):
        out = fn(q, k, v, **kwargs)
        results.append([out, *torch.autograd.grad(out, (q, k, v, bias, weight), grad_out)])
    _assert_all_close(*results, atol)
    # A duplicated edge really has more weight than without duplication.
    single = _reference(q, k, v, rows=rows[:-15], cols=cols[:-15], logit_bias=bias[:-15])
    assert not torch.allclose(_reference(q, k, v, rows=rows, cols=cols, logit_bias=bias), single)


@pytest.mark.parametrize("dtype,atol", TOLERANCES)
def test_public_api_sorted_and_unsorted_agree(dtype, atol):
    rows, cols, _ = _graph(3, unique=False, duplicates=5)
    q, k, v, bias, weight, grad_out = _tensors(dtype, rows.numel(), seed=3)
    order = torch.argsort(rows, stable=True)
    unsorted = edge_attention(q, k, v, rows, cols, logit_bias=bias, edge_weight=weight)
    presorted = edge_attention(
        q, k, v, rows[order], cols[order], logit_bias=bias[order], edge_weight=weight[order], sorted_rows=True
    )
    reference = edge_attention_reference(q, k, v, rows, cols, logit_bias=bias, edge_weight=weight)
    torch.testing.assert_close(unsorted, reference, atol=atol, rtol=0)
    torch.testing.assert_close(presorted, reference, atol=atol, rtol=0)
    grads = torch.autograd.grad(unsorted, (bias, weight), grad_out)
    expected = torch.autograd.grad(reference, (bias, weight), grad_out)
    _assert_all_close(grads, expected, atol)


@pytest.mark.parametrize("fast", FAST)
def test_empty_rows_give_exact_zeros_and_zero_grads(fast):
    rows, cols, _ = _graph(4, unique=True)
    q, k, v, bias, weight, grad_out = _tensors(torch.float32, rows.numel(), seed=4)
    out = fast(q, k, v, rows, cols, logit_bias=bias, edge_weight=weight)
    grads = torch.autograd.grad(out, (q, k, v, bias, weight), grad_out)
    assert torch.all(out[list(EMPTY_ROWS)] == 0)
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[0][list(EMPTY_ROWS)] == 0)


@pytest.mark.parametrize("fast", FAST)
def test_rows_with_only_minus_inf_logits_give_zeros(fast):
    rows, cols, _ = _graph(5, unique=True)
    q, k, v, _, _, grad_out = _tensors(torch.float64, rows.numel(), seed=5)
    bias = torch.zeros(rows.numel(), dtype=torch.float64).masked_fill(rows == 0, float("-inf"))
    out = fast(q, k, v, rows, cols, logit_bias=bias)
    assert torch.all(out[0] == 0)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    assert all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out, _reference(q, k, v, rows, cols, logit_bias=bias), atol=1e-12, rtol=0)


def test_no_edges_at_all():
    q, k, v, _, _, _ = _tensors(torch.float32, 0)
    empty = torch.zeros(0, dtype=torch.int64)
    out = edge_attention(q, k, v, empty, empty)
    assert out.shape == (R, D) and torch.all(out == 0)
    out.sum().backward()
    assert torch.all(q.grad == 0) and torch.all(v.grad == 0)


@pytest.mark.parametrize("use_sparse", [True, False], ids=["csr", "fallback"])
def test_gradcheck(use_sparse):
    g = torch.Generator().manual_seed(6)
    rows = torch.tensor([2, 0, 0, 3, 2, 0, 3, 3, 0])  # row 1 empty, row 0 has a duplicate
    cols = torch.tensor([1, 4, 2, 0, 3, 4, 1, 1, 0])
    inputs = [torch.randn(n, 3, generator=g, dtype=torch.float64, requires_grad=True) for n in (4, 5, 5)]
    inputs += [torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    keep = torch.tensor([True, False, True, True, True, True, False, True, True])

    def fn(q, k, v, bias, weight):
        return edge_attention_with_mask(
            q,
            k,
            v,
            rows,
            cols,
            logit_bias=bias,
            edge_weight=weight,
            scale=0.7,
            keep=keep,
            dropout_p=0.25,
            sorted_rows=False,
            use_sparse=use_sparse,
        )

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("fast", FAST)
def test_same_keep_mask_matches_reference(fast):
    rows, cols, _ = _graph(7, unique=False, duplicates=4)
    q, k, v, bias, weight, grad_out = _tensors(torch.float64, rows.numel(), seed=7)
    keep = torch.rand(rows.numel(), generator=torch.Generator().manual_seed(7)) > 0.3
    kwargs = {"rows": rows, "cols": cols, "logit_bias": bias, "edge_weight": weight, "keep": keep, "dropout_p": 0.3}
    results = []
    for fn in (fast, _reference):
        out = fn(q, k, v, **kwargs)
        results.append([out, *torch.autograd.grad(out, (q, k, v, bias, weight), grad_out)])
    _assert_all_close(*results, 1e-10)
    no_dropout = _reference(q, k, v, rows, cols, logit_bias=bias, edge_weight=weight)
    assert not torch.allclose(results[1][0], no_dropout)


def test_public_dropout_is_reproducible_with_generator():
    rows, cols, _ = _graph(8, unique=True)
    q, k, v, _, _, _ = _tensors(torch.float64, rows.numel(), seed=8)
    kwargs = {"dropout_p": 0.5, "training": True}
    fast = edge_attention(q, k, v, rows, cols, generator=torch.Generator().manual_seed(3), **kwargs)
    ref = edge_attention_reference(q, k, v, rows, cols, generator=torch.Generator().manual_seed(3), **kwargs)
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=0)
    # Not training, or p == 0: no mask is drawn at all (the generator is not advanced).
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    plain = edge_attention(q, k, v, rows, cols)
    for extra in ({"dropout_p": 0.5}, {"dropout_p": 0.0, "training": True}):
        torch.testing.assert_close(edge_attention(q, k, v, rows, cols, generator=gen, **extra), plain)
    assert torch.equal(gen.get_state(), state)


@pytest.mark.parametrize("dropout_p", [0.5, 0.95])
def test_dropout_preserves_expectation(dropout_p):
    # One row with many equally weighted edges and unit values: out = mean over edges of keep / (1 - p).
    num_edges = 100_000
    q, k, v = torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1, 4)
    zeros = torch.zeros(num_edges, dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    out = edge_attention(q, k, v, zeros, zeros, dropout_p=dropout_p, training=True, generator=gen)
    std = (dropout_p / (1 - dropout_p) / num_edges) ** 0.5
    assert abs(out[0, 0].item() - 1.0) < 6 * std
    assert torch.all(edge_attention(q, k, v, zeros, zeros, dropout_p=1.0, training=True) == 0)


def test_bfloat16_inputs_compute_in_fp32_and_return_bf16():
    rows, cols, _ = _graph(9, unique=True)
    q, k, v, bias, _, _ = _tensors(torch.float32, rows.numel(), seed=9)
    q16, k16, v16 = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = edge_attention(q16, k16, v16, rows, cols, logit_bias=bias)
    assert out.dtype == torch.bfloat16
    expected = edge_attention(q16.float(), k16.float(), v16.float(), rows, cols, logit_bias=bias)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=0)
    out.float().sum().backward()
    assert q16.grad.dtype == torch.bfloat16 and bias.grad is not None


def test_out_of_range_indices_raise():
    q, k, v, _, _, _ = _tensors(torch.float32, 1)
    with pytest.raises(IndexError):
        edge_attention(q, k, v, torch.tensor([0]), torch.tensor([C]))
    with pytest.raises(IndexError):
        edge_attention(q, k, v, torch.tensor([-1]), torch.tensor([0]))


@pytest.mark.parametrize("fast", FAST)
def test_more_edges_than_pattern_cells(fast):
    # nnz > R * C is only possible with duplicates; torch's sampled_addmm rejects it, the kernel must not.
    g = torch.Generator().manual_seed(10)
    rows, cols = torch.randint(0, 2, (9,), generator=g), torch.randint(0, 3, (9,), generator=g)
    inputs = [torch.randn(n, 4, generator=g, dtype=torch.float64, requires_grad=True) for n in (2, 3, 3)]
    inputs.append(torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True))
    grad_out = torch.randn(2, 4, generator=g, dtype=torch.float64)
    results = []
    for fn in (fast, _reference):
        out = fn(*inputs[:3], rows, cols, logit_bias=inputs[3])
        results.append([out, *torch.autograd.grad(out, inputs, grad_out)])
    _assert_all_close(*results, 1e-10)


def test_values_of_another_width_are_refused():
    """The Triton kernel sized its output by the queries' width: it cut wider values and read past narrower ones."""
    q, k, v, _, _, _ = _tensors(torch.float32, 1)
    for width in (v.shape[1] + 2, v.shape[1] - 2):
        with pytest.raises(ValueError, match="share their width"):
            edge_attention(q, k, torch.randn(v.shape[0], width), torch.tensor([0]), torch.tensor([0]))


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_mixed_input_dtypes_are_refused_on_every_backend(backend):
    """The reference returned v's dtype and the torch path fp32 for q bf16: one dtype is required, as in SDPA."""
    q, k, v, _, _, _ = _tensors(torch.float32, 1)
    rows, cols = torch.tensor([0, 1]), torch.tensor([1, 0])
    for args in ((q, k.bfloat16(), v.bfloat16()), (q.bfloat16(), k, v), (q, k, v.double())):
        with pytest.raises(ValueError, match="q, k and v must share one dtype"):
            edge_attention(*args, rows, cols, backend=backend)

"""Triton kernels == plain references, forward and backward: on CPU under Triton's interpreter, and on CUDA (gpu).

`tests/conftest.py` sets `TRITON_INTERPRET=1` on machines without CUDA before anything imports the kernels; the
shapes are tiny because the interpreter executes every program in numpy. With CUDA the same cases run compiled.
"""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import edge_attention, edge_attention_reference, gathered_attention, gathered_attention_reference
from triton_devices import TRITON_DEVICES as DEVICES

pytest.importorskip("triton")

B, H, NQ, NK, D, K = 2, 2, 9, 11, 12, 4
R, C = 13, 10
HALF = [(torch.bfloat16, 5e-2), (torch.float16, 6e-3)]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def _leaf(t: torch.Tensor, device: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t` on `device` (and `dtype`) as a fresh leaf that requires grad."""
    return t.detach().to(device=device, dtype=dtype or t.dtype).requires_grad_()


def _slots(g: torch.Generator, entries: int | None):
    shape = (B, H, NQ, K) if entries is None else (B, H, NQ, K, entries)
    idx = torch.randint(0, 3, shape, generator=g)  # few distinct keys: duplicates in most rows
    valid = torch.rand(B, H, NQ, K, generator=g) < 0.75
    valid[0, 1, 2] = False  # a row without any slot
    padding = ~valid & (torch.rand(B, H, NQ, K, generator=g) < 0.5)
    idx = idx.masked_fill(padding if entries is None else padding[..., None], -1)  # padding in invalid slots
    return idx, valid


def _grads(out: torch.Tensor, inputs, grad_out):
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    return [out, *torch.autograd.grad(out, wanted, grad_out, allow_unused=True)]


def _assert_close(actual, expected, tol):
    """Every tensor within `tol` of the expected one's largest magnitude: half-precision rounding (of the results and
    of the saved output that backward's `rowsum(dO * O)` reads, as in FlashAttention) scales with the tensor, not
    with each element."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        if e is None:
            assert a is None or not a.any()
            continue
        assert a.dtype == e.dtype and torch.isfinite(a).all()
        torch.testing.assert_close(a, e, atol=tol * max(float(e.detach().abs().max()), 1.0), rtol=0)


def _gathered_case(seed: int, device: str, entries: int | None, *, bias: bool, dot_product: bool, dropout: bool):
    g = torch.Generator().manual_seed(seed)
    q = _leaf(torch.randn(B, H, NQ, D, generator=g), device)
    k, v = (_leaf(torch.randn(B, H, NK, D, generator=g), device) for _ in range(2))
    idx, valid = _slots(g, entries)
    weight = None if entries is None else _leaf(torch.rand(idx.shape, generator=g), device)
    logit_bias = None
    if bias:
        logit_bias = torch.randn(B, H, NQ, K, generator=g)
        logit_bias[1, 0, 4] = float("-inf")  # a row whose every logit is -inf
        logit_bias = _leaf(logit_bias, device)
    keep = (torch.rand(B, H, NQ, K, generator=g) > 0.3).to(device) if dropout else None
    kwargs = {"weight": weight, "logit_bias": logit_bias, "dot_product": dot_product, "keep": keep}
    kwargs.update(scale=0.7, dropout_p=0.3 if dropout else 0.0)
    grad_out = torch.randn(B, H, NQ, D, generator=g).to(device)
    return (q, k, v, idx.to(device), valid.to(device)), kwargs, grad_out


@pytest.mark.parametrize(
    "entries,bias,dot_product,dropout",
    [
        pytest.param(None, False, True, False, id="plain-slots"),
        pytest.param(None, True, True, True, id="slots-bias-dropout"),
        pytest.param(2, True, True, True, id="two-entries-interpolation"),
        pytest.param(2, True, False, False, id="two-entries-linear-logits"),
    ],
)
def test_gathered_kernel_matches_reference_in_fp32(device, entries, bias, dot_product, dropout):
    flags = {"bias": bias, "dot_product": dot_product, "dropout": dropout}
    (q, k, v, idx, valid), kwargs, grad_out = _gathered_case(0, device, entries, **flags)
    inputs = (q, k, v, kwargs["weight"], kwargs["logit_bias"])
    triton = _grads(gathered_attention(q, k, v, idx, valid, backend="triton", **kwargs), inputs, grad_out)
    reference = _grads(gathered_attention_reference(q, k, v, idx, valid, **kwargs), inputs, grad_out)
    _assert_close(triton, reference, 2e-5)
    # Rows without a usable slot are exact zeros, and so are their query gradients.
    zeros = torch.zeros(D, device=device)
    assert torch.equal(triton[0][0, 1, 2], zeros)
    if dot_product:
        assert torch.equal(triton[1][0, 1, 2], zeros)
    if bias:
        assert torch.equal(triton[0][1, 0, 4], zeros)


@pytest.mark.parametrize("dtype,tol", HALF, ids=["bf16", "fp16"])
def test_gathered_kernel_in_half_precision_matches_fp32_reference(device, dtype, tol):
    (q, k, v, idx, valid), kwargs, grad_out = _gathered_case(1, device, 2, bias=True, dot_product=True, dropout=False)
    half = [_leaf(t, device, dtype) for t in (q, k, v)]
    out = gathered_attention(*half, idx, valid, backend="triton", **kwargs)
    assert out.dtype == dtype
    triton = _grads(out, (*half, kwargs["weight"], kwargs["logit_bias"]), grad_out.to(dtype))
    # The reference runs in fp32 on the same (rounded) inputs: only the kernel's own rounding remains.
    exact = [_leaf(t, device, torch.float32) for t in half]
    reference = _grads(
        gathered_attention_reference(*exact, idx, valid, **kwargs),
        (*exact, kwargs["weight"], kwargs["logit_bias"]),
        grad_out.to(dtype).float(),
    )
    _assert_close([t.float() for t in triton], reference, tol)


def test_gathered_kernel_reads_strided_head_views(device):
    # Projections are split into heads by a transpose: the kernel takes those views without copying them.
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, NQ, H, D, generator=g).to(device).transpose(1, 2)
    assert not q.is_contiguous()
    idx, valid = _slots(g, None)
    idx, valid = idx.clamp(max=NQ - 1).to(device), valid.to(device)
    out = gathered_attention(q, q, q, idx, valid, backend="triton")
    expected = gathered_attention_reference(q.contiguous(), q.contiguous(), q.contiguous(), idx, valid)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=0)


def _gathered_against_reference(q, k, v, idx, valid, seed: int, atol: float) -> None:
    """Triton == reference, output and the gradients of q, k and v."""
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device)
    inputs = (q, k, v)
    triton = _grads(gathered_attention(q, k, v, idx, valid, backend="triton"), inputs, grad_out)
    detached = [t.detach().contiguous().requires_grad_() for t in inputs]
    reference = _grads(gathered_attention_reference(*detached, idx, valid), detached, grad_out)
    _assert_close(triton, reference, atol)


@pytest.mark.parametrize(
    "nq,head_dim",
    [pytest.param(37, D, id="3-blocks-of-16-last-partial"), pytest.param(32, 100, id="4-full-blocks-of-8")],
)
def test_gathered_kernel_maps_every_query_block_of_every_head(device, nq, head_dim):
    """Several blocks of queries per (batch, head): each program of the 1-D grid must find its own rows."""
    g = torch.Generator().manual_seed(4)
    q = _leaf(torch.randn(2, 3, nq, head_dim, generator=g), device)
    k, v = (_leaf(torch.randn(2, 3, NK, head_dim, generator=g), device) for _ in range(2))
    idx = torch.randint(0, NK, (2, 3, nq, K), generator=g).to(device)
    valid = (torch.rand(2, 3, nq, K, generator=g) < 0.8).to(device)
    _gathered_against_reference(q, k, v, idx, valid, 4, 2e-5)


def test_gathered_kernel_takes_head_size_one_views(device):
    """A (B, H, N, 1) head view keeps its transposed strides through `.contiguous()` (a size-1 axis counts as
    contiguous); the launch refused it."""
    g = torch.Generator().manual_seed(5)
    # (B, H, NQ, 1) views with strides (.., NQ)
    q, k, v = (_leaf(torch.randn(B, H, 1, NQ, generator=g), device).transpose(2, 3) for _ in range(3))
    assert q.stride(-1) != 1
    idx, valid = _slots(g, None)
    _gathered_against_reference(q, k, v, idx.clamp(max=NQ - 1).to(device), valid.to(device), 5, 2e-5)


@pytest.mark.gpu
def test_gathered_kernel_runs_more_than_65535_batch_heads():
    """CUDA caps a grid's second axis at 65,535; the launch used it for B * H."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(6)
    shape = (8200, 8, 3, 16)  # B * H = 65,600
    q, k, v = (_leaf(torch.randn(shape, generator=g), "cuda") for _ in range(3))
    idx = torch.randint(0, 3, (*shape[:3], 2), generator=g).to("cuda")
    _gathered_against_reference(q, k, v, idx, None, 6, 2e-5)


def _edge_case(seed: int, device: str, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, R, (60,), generator=g)
    rows = rows[(rows != 3) & (rows != 8)]  # two empty rows
    cols = torch.randint(0, 4, rows.shape, generator=g)  # few keys: many duplicate edges
    q = _leaf(torch.randn(R, D, generator=g), device, dtype)
    k, v = (_leaf(torch.randn(C, D, generator=g), device, dtype) for _ in range(2))
    bias = torch.randn(rows.shape, generator=g)
    bias[rows == 5] = float("-inf")  # a row whose every logit is -inf
    weight = torch.rand(rows.shape, generator=g)
    keep = (torch.rand(rows.shape, generator=g) > 0.25).to(device)
    grad_out = torch.randn(R, D, generator=g).to(device=device, dtype=dtype)
    kwargs = {"logit_bias": _leaf(bias, device), "edge_weight": _leaf(weight, device), "keep": keep}
    kwargs.update(dropout_p=0.25, scale=0.6)
    return (q, k, v, rows.to(device), cols.to(device)), kwargs, grad_out


def test_edge_kernel_matches_reference_in_fp32_with_unsorted_duplicate_edges(device):
    (q, k, v, rows, cols), kwargs, grad_out = _edge_case(0, device)
    inputs = (q, k, v, kwargs["logit_bias"], kwargs["edge_weight"])
    triton = _grads(edge_attention(q, k, v, rows, cols, backend="triton", **kwargs), inputs, grad_out)
    reference = _grads(edge_attention_reference(q, k, v, rows, cols, **kwargs), inputs, grad_out)
    _assert_close(triton, reference, 2e-5)
    zeros = torch.zeros(D, device=device)
    for row in (3, 8, 5):  # empty rows and the -inf row: zeros, with zero query gradients
        assert torch.equal(triton[0][row], zeros) and torch.equal(triton[1][row], zeros)


def test_edge_kernel_sorted_rows_skip_the_sort_and_agree(device):
    (q, k, v, rows, cols), kwargs, _ = _edge_case(1, device)
    order = torch.argsort(rows, stable=True)
    sorted_kwargs = {**kwargs, **{name: kwargs[name][order] for name in ("logit_bias", "edge_weight", "keep")}}
    presorted = edge_attention(q, k, v, rows[order], cols[order], sorted_rows=True, backend="triton", **sorted_kwargs)
    torch.testing.assert_close(presorted, edge_attention(q, k, v, rows, cols, backend="triton", **kwargs))


@pytest.mark.parametrize("dtype,tol", HALF, ids=["bf16", "fp16"])
def test_edge_kernel_in_half_precision_matches_fp32_reference(device, dtype, tol):
    (q, k, v, rows, cols), kwargs, grad_out = _edge_case(2, device, dtype)
    inputs = (q, k, v, kwargs["logit_bias"], kwargs["edge_weight"])
    out = edge_attention(q, k, v, rows, cols, backend="triton", **kwargs)
    assert out.dtype == dtype
    triton = _grads(out, inputs, grad_out)
    exact = [_leaf(t, device, torch.float32) for t in (q, k, v)]
    reference = _grads(
        edge_attention_reference(*exact, rows, cols, **kwargs),
        (*exact, kwargs["logit_bias"], kwargs["edge_weight"]),
        grad_out.float(),
    )
    _assert_close([t.float() for t in triton], reference, tol)


def _token_major(shape, generator, device):
    """A head-split `(B, H, N, d)` leaf as a projection makes it: a transposed view of `(B, N, H, d)`."""
    b, h, n, d = shape
    base = torch.randn(b, n, h, d, generator=generator).to(device).requires_grad_()
    return base, base.transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_edge_kernel_reads_head_split_views_in_place(device, dtype):
    """Head-split q, k, v (token-major views, as the projections make them) with rows / cols naming their flat
    head-major rows: exactly the outputs and query gradients of the same rows flattened, their key and value
    gradients to round-off (and, in fp32, the reference's), the output and the gradients laid out as the inputs (no
    copy into or out of the head-major layout)."""
    g = torch.Generator().manual_seed(9)
    n, m = 7, 5
    (q_base, q), (k_base, k), (v_base, v) = (_token_major((B, H, length, D), g, device) for length in (n, m, m))
    q, k, v = (t.to(dtype) for t in (q, k, v))
    rows = torch.randint(0, B * H * n, (90,), generator=g).to(device)
    cols = (rows // n) * m + torch.randint(0, m, (90,), generator=g).to(device)  # keys of the row's own head
    kwargs = {"logit_bias": torch.randn(90, generator=g).to(device), "scale": 0.7}
    out = edge_attention(q, k, v, rows, cols, backend="triton", **kwargs)
    assert out.shape == q.shape and out.stride() == q.stride() and out.dtype == dtype
    grad_out = torch.randn(out.shape, generator=g).to(device=device, dtype=dtype)
    got = torch.autograd.grad(out, (q_base, k_base, v_base), grad_out)
    flat = [t.detach().reshape(-1, D).requires_grad_() for t in (q, k, v)]
    grad_flat = grad_out.reshape(-1, D)
    want = edge_attention(*flat, rows, cols, backend="triton", **kwargs)
    want_grads = torch.autograd.grad(want, flat, grad_flat)
    if dtype == torch.float32:
        reference = edge_attention_reference(*flat, rows, cols, **kwargs)
        _assert_close([want, *want_grads], [reference, *torch.autograd.grad(reference, flat, grad_flat)], 2e-5)
    assert torch.equal(out, want.view(q.shape))
    for name, grad, flat_grad, length in zip("qkv", got, want_grads, (n, m, m), strict=True):
        # the (B, N, H, d) leaf's gradient, in the inputs' dtype (the leaf's is its fp32 copy)
        grad, expected = grad.to(dtype), flat_grad.view(B, H, length, D).transpose(1, 2)
        if name == "q" or device == "cpu":  # the interpreter adds the atomic sums in one order
            assert torch.equal(grad, expected)
        else:  # dK and dV are atomic sums: on CUDA their order, and so their rounding, differs from run to run
            torch.testing.assert_close(grad, expected)


def test_edge_kernel_without_edges_gives_zeros(device):
    q = torch.randn(R, D, device=device, requires_grad=True)
    k, v = torch.randn(C, D, device=device), torch.randn(C, D, device=device)
    none = torch.zeros(0, dtype=torch.int64, device=device)
    out = edge_attention(q, k, v, none, none, backend="triton")
    assert torch.equal(out, torch.zeros(R, D, device=device))
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert torch.equal(grad, torch.zeros(R, D, device=device))


def test_dense_keeps_views_the_kernels_can_read_in_place_and_copies_the_others():
    """`launch.dense`: a token-major head-split view is read in place, also when a size-1 axis has a stride
    `empty_like` would not give it; a strided slice (not dense) and a non-contiguous last axis are copied."""
    from attnzoo.kernels.triton.launch import dense

    heads_view = torch.randn(1, 7, 1, 8).transpose(1, 2)  # (B, H, N, d) with B = H = 1
    assert dense(heads_view) is heads_view
    odd = torch.randn(7, 8).as_strided((1, 1, 7, 8), (999, 5, 8, 1))  # size-1 axes with arbitrary strides
    assert dense(odd) is odd
    sliced = torch.randn(2, 3, 7, 16)[..., :8]  # gaps between rows
    assert dense(sliced) is not sliced and dense(sliced).is_contiguous()
    transposed = torch.randn(8, 7).t()
    assert dense(transposed).is_contiguous()

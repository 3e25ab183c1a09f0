"""`global_rows` of edge and gathered attention: the first queries' dense rows as part of the primitive. The Triton
kernels compute them in programs of their own (CUDA's path: run by Triton's interpreter on CPU, compiled on CUDA under
the `gpu` marker); the reference replaces the rows after the method's output (`kernels.global_rows`, what
`ZooAttention.with_global_rows` does). Outputs and every gradient must agree, padding and int32 edge lists included.
(A²-Former's interpolated kernels share the same global-row programs: `test_interpolated_attention.py`.)"""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import dense_masked_attention, edge_attention, gathered_attention
from attnzoo.kernels.dense import global_rows_keep

pytest.importorskip("triton")

from triton_devices import TRITON_DEVICES as DEVICES  # noqa: E402

B, H, N, D = 2, 3, 24, 16


def _inputs(device: str, dtype: torch.dtype, seed: int = 0, index_dtype: torch.dtype = torch.int64):
    """Head-split q, k, v read from token-major projections (as the models hold them), row-sorted edges within each
    (batch, head) with an fp32 logit bias and edge weight, and a key mask whose second example has padding at its
    end and at position 1 (a padded global position keeps the method's row)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, N, H, D, generator=g).transpose(1, 2).to(device, dtype) for _ in range(3))
    rows = torch.randint(0, B * H * N, (500,), generator=g).sort().values
    cols = (rows // N) * N + torch.randint(0, N, (500,), generator=g)
    bias = torch.randn(500, generator=g)
    weight = torch.rand(500, generator=g) + 0.5
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[1, -5:] = False
    key_valid[1, 1] = False
    tensors = (q, k, v, bias.to(device), weight.to(device))
    return tensors, rows.to(device, index_dtype), cols.to(device, index_dtype), key_valid.to(device)


def _run(backend: str, tensors, rows, cols, key_valid, global_rows: int, grad_seed: int = 1, **dropout):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    q, k, v, bias, weight = leaves
    out = edge_attention(
        q, k, v, rows, cols, logit_bias=bias, edge_weight=weight, sorted_rows=True, global_rows=global_rows,
        key_valid=key_valid, backend=backend, **dropout,
    )  # fmt: skip
    return _backward(out, leaves, grad_seed)


def _backward(out, leaves, grad_seed: int):
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(out.device, out.dtype)
    out.backward(grad)
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("dtype", "atol", "global_rows", "index_dtype"),
    [
        (torch.float32, 1e-5, 1, torch.int64),
        (torch.float32, 1e-5, 3, torch.int32),  # SBM's int32 edge lists
        (torch.bfloat16, 6e-2, 1, torch.int32),
        (torch.bfloat16, 6e-2, 3, torch.int64),
    ],
)
def test_global_rows_in_the_kernels_equal_the_reference(device, dtype, atol, global_rows, index_dtype):
    tensors, rows, cols, key_valid = _inputs(device, dtype, index_dtype=index_dtype)
    out, grads = _run("triton", tensors, rows, cols, key_valid, global_rows)
    # The reference in fp32 from the same (rounded) values.
    ref_inputs = [t.float().cpu() for t in tensors]
    ref_out, ref_grads = _run("reference", ref_inputs, rows.cpu().long(), cols.cpu().long(), key_valid.cpu(),
                              global_rows)  # fmt: skip
    torch.testing.assert_close(out.float().cpu(), ref_out, atol=atol, rtol=atol)
    for name, grad, ref in zip(("q", "k", "v", "logit_bias", "edge_weight"), grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.float().cpu(), ref, atol=atol, rtol=atol, msg=lambda m, n=name: f"{n}: {m}")
    # dq, dk and dv come back in the inputs' layout (token-major here, as the projections' backward reads them)
    for grad, tensor in zip(grads[:3], tensors[:3], strict=True):
        assert grad.stride() == tensor.stride()


@pytest.mark.parametrize("device", DEVICES)
def test_global_rows_are_dense_rows_and_their_edges_get_no_gradient(device):
    """What the rows are: a real global query's row is dense attention over the real keys, a padded global position
    keeps its edge row, and a replaced row's edges get exactly zero gradient."""
    tensors, rows, cols, key_valid = _inputs(device, torch.float32)
    q, k, v, bias, weight = tensors
    out, grads = _run("triton", tensors, rows, cols, key_valid, 2)
    plain, _ = _run("triton", tensors, rows, cols, key_valid, 0)
    mask = key_valid[:, None, None, :]
    dense, _ = dense_masked_attention(q[:, :, :2], k, v, mask, scale=D**-0.5, return_weights=False)
    real = key_valid[:, :2]  # (B, 2): the global positions that are real tokens
    for b in range(B):
        for i in range(2):
            expected = dense[b, :, i] if real[b, i] else plain[b, :, i]
            torch.testing.assert_close(out[b, :, i], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, 2:], plain[:, :, 2:], atol=0, rtol=0)  # the other rows are untouched
    # edges of replaced rows: row r = (b H + h) N + i with i < 2 and real
    b_of, i_of = rows.long() // (H * N), rows.long() % N
    replaced = (i_of < 2) & real[b_of, i_of.clamp(max=1)]
    assert replaced.any() and (~replaced).any()
    for grad in grads[3:]:
        assert torch.all(grad[replaced] == 0)
        assert grad[~replaced].abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_more_global_rows_than_the_kernels_take_fall_back_to_the_reference_rows(device):
    tensors, rows, cols, key_valid = _inputs(device, torch.float32)
    out, grads = _run("triton", tensors, rows, cols, key_valid, 17)  # MAX_FUSED_GLOBALS + 1
    ref_out, ref_grads = _run("reference", [t.cpu() for t in tensors], rows.cpu(), cols.cpu(), key_valid.cpu(), 17)
    torch.testing.assert_close(out.cpu(), ref_out, atol=1e-5, rtol=1e-5)
    for grad, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_global_rows_reject_inputs_they_do_not_fit():
    tensors, rows, cols, key_valid = _inputs("cpu", torch.float32)
    q, k, v = tensors[:3]
    with pytest.raises(ValueError, match="global_rows needs head-split self-attention"):
        edge_attention(q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D), rows, cols, global_rows=1)
    with pytest.raises(ValueError, match="global_rows needs head-split self-attention"):
        edge_attention(q, k, v, rows, cols, global_rows=N + 1)
    with pytest.raises(ValueError, match="global_rows must be >= 0"):
        edge_attention(q, k, v, rows, cols, global_rows=-1)
    with pytest.raises(ValueError, match="key_valid must be bool of shape"):
        edge_attention(q, k, v, rows, cols, global_rows=1, key_valid=key_valid[:, :-1])


SLOTS = 6


def _slot_inputs(device: str, dtype: torch.dtype, seed: int = 0):
    """Head-split q, k, v read from token-major projections, each query's `SLOTS` sampled keys (some invalid, as
    Smart Bird's unused slots) with an fp32 logit bias, and the key mask of `_inputs`."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, N, H, D, generator=g).transpose(1, 2).to(device, dtype) for _ in range(3))
    idx = torch.randint(0, N, (B, H, N, SLOTS), generator=g)
    valid = torch.rand(B, H, N, SLOTS, generator=g) < 0.8
    bias = torch.randn(B, H, N, SLOTS, generator=g)
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[1, -5:] = False
    key_valid[1, 1] = False
    valid &= key_valid[:, None, None, :].expand(-1, H, N, -1).gather(3, idx)
    return (q, k, v, bias.to(device)), idx.to(device), valid.to(device), key_valid.to(device)


def _run_slots(backend: str, tensors, idx, valid, key_valid, global_rows: int, grad_seed: int = 1, **dropout):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    q, k, v, bias = leaves
    out = gathered_attention(
        q, k, v, idx, valid, logit_bias=bias, global_rows=global_rows, key_valid=key_valid, backend=backend, **dropout
    )
    return _backward(out, leaves, grad_seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 6e-2)])
@pytest.mark.parametrize("global_rows", [0, 1, 3, 17])
def test_gathered_global_rows_in_the_kernels_equal_the_reference(device, dtype, atol, global_rows):
    """None, one, three, and more than the kernels take (17: replaced after the kernel)."""
    tensors, idx, valid, key_valid = _slot_inputs(device, dtype)
    out, grads = _run_slots("triton", tensors, idx, valid, key_valid, global_rows)
    ref_out, ref_grads = _run_slots(
        "reference", [t.float().cpu() for t in tensors], idx.cpu(), valid.cpu(), key_valid.cpu(), global_rows
    )
    torch.testing.assert_close(out.float().cpu(), ref_out, atol=atol, rtol=atol)
    for name, grad, ref in zip(("q", "k", "v", "logit_bias"), grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.float().cpu(), ref, atol=atol, rtol=atol, msg=lambda m, n=name: f"{n}: {m}")
    # the kernels' output in token-major memory (the heads merge as a view), dq, dk and dv in the inputs' layout
    assert out.transpose(1, 2).is_contiguous() or global_rows > 16
    for grad, tensor in zip(grads[:3], tensors[:3], strict=True):
        assert grad.stride() == tensor.stride()
    if global_rows:  # a replaced row's slots get no gradient; the others do
        real = key_valid[:, :global_rows]  # (B, g)
        replaced = torch.zeros(B, N, dtype=torch.bool, device=real.device)
        replaced[:, :global_rows] = real
        replaced = replaced[:, None, :, None].expand(-1, H, -1, SLOTS)
        assert torch.all(grads[3][replaced] == 0) and grads[3][~replaced].abs().sum() > 0


def _dropout(device: str, keep_shape: tuple[int, ...], seed: int = 11) -> dict:
    """Training with attention dropout: the method's keep mask drawn here, the global rows' hash seed given, so
    that both backends drop the same entries."""
    keep = torch.rand(keep_shape, generator=torch.Generator().manual_seed(seed)) >= 0.3
    global_seed = torch.tensor(123456789 + seed)
    return {"dropout_p": 0.3, "training": True, "keep": keep.to(device), "global_seed": global_seed.to(device)}


def _on_cpu(dropout: dict) -> dict:
    return {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in dropout.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("global_rows", [3, 17])
@pytest.mark.parametrize("primitive", ["edge", "gathered"])
def test_global_rows_with_attention_dropout_in_the_kernels_equal_the_reference(device, global_rows, primitive):
    """In training with attention dropout the kernels regenerate the rows' hashed mask (forward and backward) and
    equal the reference, which draws it from the same seed; three rows (each its own decisions), and 17: the
    fallback after the kernel."""
    if primitive == "edge":
        tensors, rows, cols, key_valid = _inputs(device, torch.float32)
        dropout = _dropout(device, (rows.shape[0],))
        out, grads = _run("triton", tensors, rows, cols, key_valid, global_rows, **dropout)
        cpu = [t.cpu() for t in tensors], rows.cpu(), cols.cpu(), key_valid.cpu()
        ref_out, ref_grads = _run("reference", *cpu, global_rows, **_on_cpu(dropout))
        plain, _ = _run("reference", *cpu, global_rows, **{**_on_cpu(dropout), "global_seed": torch.tensor(7)})
    else:
        tensors, idx, valid, key_valid = _slot_inputs(device, torch.float32)
        dropout = _dropout(device, tuple(idx.shape))
        out, grads = _run_slots("triton", tensors, idx, valid, key_valid, global_rows, **dropout)
        cpu = [t.cpu() for t in tensors], idx.cpu(), valid.cpu(), key_valid.cpu()
        ref_out, ref_grads = _run_slots("reference", *cpu, global_rows, **_on_cpu(dropout))
        plain, _ = _run_slots("reference", *cpu, global_rows, **{**_on_cpu(dropout), "global_seed": torch.tensor(7)})
    torch.testing.assert_close(out.cpu(), ref_out, atol=1e-5, rtol=1e-5)
    for grad, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.cpu(), ref, atol=1e-5, rtol=1e-5)
    # another seed drops other entries of the global rows, and nothing else
    assert not torch.allclose(plain[:, :, :global_rows], ref_out[:, :, :global_rows])
    torch.testing.assert_close(plain[:, :, global_rows:], ref_out[:, :, global_rows:], atol=0, rtol=0)


def test_the_reference_global_rows_drop_the_hashed_entries_of_the_softmax():
    """The reference rows, written out: softmax over the real keys, times the hashed keep mask over (1 - p)."""
    tensors, rows, cols, key_valid = _inputs("cpu", torch.float32)
    q, k, v = tensors[:3]
    dropout = _dropout("cpu", (rows.shape[0],))
    out, _ = _run("reference", tensors, rows, cols, key_valid, 2, **dropout)
    keep = global_rows_keep(dropout["global_seed"], B, H, 2, N, 0.3)  # (B, H, 2, N)
    assert 0.5 < keep.float().mean() < 0.9
    scores = (q[:, :, :2] @ k.transpose(-1, -2) * D**-0.5).masked_fill(~key_valid[:, None, None, :], -torch.inf)
    expected = (scores.softmax(-1) * keep / 0.7) @ v
    real = key_valid[:, None, :2, None]  # a padded global position keeps the method's row
    torch.testing.assert_close(torch.where(real, out[:, :, :2], expected), expected, atol=1e-5, rtol=1e-5)

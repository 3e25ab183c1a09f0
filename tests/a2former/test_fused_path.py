"""A²-Former's fused path as the GPU runs it, measured on CPU: `attention_backend="triton"` takes the CUDA code path
under Triton's interpreter, with the kernel launches stubbed (counted, not run: the numerics are
`tests/kernels/test_interpolated_attention.py`'s). What the attention adds over a dense layer is counted with a
`TorchDispatchMode`: aten ops (the eager glue that dominated the GPU time, gpu-performance.md §3.2), ops that make the
device wait for the host, kernel launches, and what backward keeps (no int64 index stacks, no fp32 copy of the hidden
states). Also the fp32 offset projection that keeps no fp32 copy of its input."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnzoo.a2former.wide_linear import wide_linear
from attnzoo.testing import family_by_name
from source_checkout import load_config

pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter counts (CUDA: tests/gpu)")

#: The issue's budget for the eager ops a sparse attention may add to a layer (#49).
EXTRA_OPS_FORWARD, EXTRA_OPS_FORWARD_BACKWARD = 15, 30
#: Ops that are free (views, allocations without a fill) and ops that make the device wait for the host.
FREE = {
    "view", "_unsafe_view", "reshape", "transpose", "t", "expand", "slice", "select", "unsqueeze", "squeeze",
    "as_strided", "permute", "detach", "alias", "split", "unbind", "empty", "empty_like", "new_empty",
    "empty_strided", "lift_fresh", "_reshape_alias", "split_with_sizes",
}  # fmt: skip
SYNCS = {"nonzero", "_local_scalar_dense", "_unique2", "unique_dim", "unique_consecutive", "masked_select", "bincount"}
N = 48


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run under it (the free ones apart) and those that sync with the host."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE:
            self.ops[name] += 1
            boolean_index = name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None
            )
            if name in SYNCS or boolean_index:
                self.syncs[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def launches(monkeypatch) -> Counter[str]:
    """Triton launches by kernel name; the kernels do not run (their outputs stay uninitialised)."""
    counts: Counter[str] = Counter()

    def stub(self, *args, grid, warmup, **kwargs):
        counts[self.__name__] += 1

    monkeypatch.setattr(InterpretedFunction, "run", stub)
    return counts


def _model(family: str, num_global_tokens: int):
    torch.manual_seed(0)
    config = load_config(
        family,
        "tiny",
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        num_hidden_layers=1,
        attention_backend="triton",
        num_global_tokens=num_global_tokens,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    return family_by_name(family).model_class(config).to(torch.bfloat16)


def _inputs() -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 100, (2, N), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0  # padding: the key-table path
    return {"input_ids": ids, "attention_mask": mask}


def _count(model, launches: Counter[str]) -> tuple[OpCounter, OpCounter, list[torch.Tensor]]:
    """Ops of one eval forward, ops of one training forward+backward, and what that backward kept; `launches`
    holds the kernels launched by the forward."""
    inputs = _inputs()
    model.train()
    model(**inputs).last_hidden_state.float().pow(2).mean().backward()  # warm-up (first calls cache things)
    model.eval()
    launches.clear()
    with torch.no_grad(), OpCounter() as forward:
        model(**inputs)
    forward_launches = launches.copy()
    model.train()
    saved: list[torch.Tensor] = []
    with OpCounter() as both:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = model(**inputs).last_hidden_state
        out.float().pow(2).mean().backward()
    launches.clear()
    launches.update(forward_launches)
    return forward, both, saved


@pytest.fixture
def dense_counts(launches):
    return _count(_model("dense_transformer", 0), launches)


@pytest.mark.parametrize("num_global_tokens", [0, 1])
def test_fused_path_adds_no_sync_and_keeps_no_index_or_fp32_copy(dense_counts, launches, num_global_tokens):
    forward, both, saved = _count(_model("a2former", num_global_tokens), launches)
    # One kernel for the key tables (the inputs are padded), one for the attention.
    assert launches == {"_real_neighbours": 1, "_interpolated_fwd": 1}
    dense_forward, dense_both, _ = dense_counts
    # The model's own input check syncs in dense too; the attention adds none (row_valid.all() did).
    assert forward.syncs == dense_forward.syncs and both.syncs == dense_both.syncs
    activation = 2 * N * 64  # (B, N, D) elements
    for tensor in saved:
        assert not (tensor.dtype == torch.int64 and tensor.numel() > 2 * N), "an int64 index was saved"
        assert not (tensor.dtype == torch.float32 and tensor.numel() >= activation), "an fp32 activation was saved"


@pytest.mark.parametrize("num_global_tokens", [0, 1])
def test_fused_path_glue_fits_the_op_budget(dense_counts, launches, num_global_tokens):
    """Offset projection, density, global slots and global rows: within the issue's budget over a dense layer."""
    forward, both, _ = _count(_model("a2former", num_global_tokens), launches)
    dense_forward, dense_both, _ = dense_counts
    extra_forward = forward.ops.total() - dense_forward.ops.total()
    extra_both = both.ops.total() - dense_both.ops.total()
    assert extra_forward <= EXTRA_OPS_FORWARD, forward.ops - dense_forward.ops
    assert extra_both <= EXTRA_OPS_FORWARD_BACKWARD, both.ops - dense_both.ops


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_wide_linear_equals_plain_fp32_autograd_without_saving_an_fp32_input(scale):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 16, generator=g).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(6, 16, generator=g).to(torch.bfloat16).requires_grad_()
    bias = torch.randn(6, generator=g).to(torch.bfloat16).requires_grad_()
    grad_out = torch.randn(2, 5, 6, generator=g)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = wide_linear(x, weight, bias, scale)
    assert out.dtype == torch.float32
    assert not any(t.dtype == torch.float32 and t.shape == x.shape for t in saved)
    expected = F.linear(x.float(), weight.float(), bias.float()) * scale
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(out, (x, weight, bias), grad_out)
    expected_grads = torch.autograd.grad(expected, (x, weight, bias), grad_out)
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want)

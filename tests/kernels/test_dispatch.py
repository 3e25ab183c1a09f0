"""Backend dispatch: which implementation runs for a backend name and device, refusals, and the dense primitive."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from attnzoo.kernels import ATTENTION_BACKENDS, dense_attention, dense_masked_attention, dispatch, resolve_backend

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_backend_names_match_the_config_field():
    from attnzoo.core.configuration import ATTENTION_BACKENDS as CONFIG_BACKENDS

    assert CONFIG_BACKENDS == ATTENTION_BACKENDS == ("fast", "reference", "triton")


def test_fast_takes_triton_on_cuda_and_the_torch_paths_elsewhere(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_installed", lambda: True)
    assert resolve_backend("fast", CPU, torch.float32) == "torch"
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert resolve_backend("fast", CUDA, dtype, dtype, dtype) == "triton"
    # fp64, mixed dtypes and a missing triton keep the torch paths instead of failing here (the public functions
    # refuse mixed dtypes before they resolve a backend).
    assert resolve_backend("fast", CUDA, torch.float64) == "torch"
    assert resolve_backend("fast", CUDA, torch.bfloat16, torch.float32) == "torch"
    monkeypatch.setattr(dispatch, "triton_installed", lambda: False)
    assert resolve_backend("fast", CUDA, torch.bfloat16) == "torch"
    assert resolve_backend("reference", CUDA, torch.bfloat16) == "reference"


def test_triton_backend_refusals_name_the_problem(monkeypatch):
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("fastest", CPU, torch.float32)
    with pytest.raises(ValueError, match="not mps"):
        resolve_backend("triton", torch.device("mps"), torch.float32)
    with pytest.raises(ValueError, match="one dtype among"):
        resolve_backend("triton", CUDA, torch.float64)
    # Kernels compiled for a GPU, not built for the interpreter, cannot run on the CPU.
    monkeypatch.setattr(dispatch._triton_kernels(), "interpreted", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", CPU, torch.float32)
    monkeypatch.setattr(dispatch, "triton_installed", lambda: False)
    with pytest.raises(ValueError, match=r"attnzoo\[gpu\]"):
        resolve_backend("triton", CUDA, torch.bfloat16)


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_triton_interpret_spelt_true_runs_the_kernels_on_cpu():
    """Triton reads TRITON_INTERPRET as a boolean ("true", "on", ...), so attnzoo must not insist on "1"."""
    pytest.importorskip("triton")
    script = textwrap.dedent(
        """
        import torch
        from attnzoo.kernels import edge_attention
        q = k = v = torch.randn(3, 4)
        rows, cols = torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1])
        out = edge_attention(q, k, v, rows, cols, backend="triton")
        torch.testing.assert_close(out, edge_attention(q, k, v, rows, cols, backend="reference"))
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "true"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


def test_import_and_cpu_kernels_work_without_triton():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # as if triton were not installed
        import torch
        import attnzoo
        from attnzoo.kernels import gathered_attention
        q = torch.randn(1, 2, 5, 4)
        out = gathered_attention(q, q, q, torch.zeros(1, 2, 5, 3, dtype=torch.long))
        assert out.shape == q.shape and "attnzoo.kernels.triton" not in sys.modules
        try:
            gathered_attention(q, q, q, torch.zeros(1, 2, 5, 3, dtype=torch.long), backend="triton")
        except ValueError as err:
            assert "attnzoo[gpu]" in str(err), err
        else:
            raise AssertionError("the triton backend ran without triton")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_dense_attention_masks_biases_and_zeroes_empty_rows(backend):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.rand(2, 1, 6, 6, generator=g) < 0.6
    mask[1, 0, 2] = False  # a query without keys
    bias = torch.randn(2, 3, 6, 6, generator=g, dtype=torch.float64, requires_grad=True)
    out = dense_attention(q, k, v, mask, logit_bias=bias, scale=0.5, backend=backend)
    expected, _ = dense_masked_attention(q, k, v, mask, scale=0.5, logit_bias=bias)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
    assert torch.equal(out[1, :, 2], torch.zeros(3, 8, dtype=torch.float64))
    grads = torch.autograd.grad(out.sum(), (q, k, v, bias))
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v, bias))
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_dense_attention_causal_with_a_learned_bias_equals_the_masked_formula(backend):
    """A bias that needs a gradient (SBM's straight-through term) beside the causal flag: SDPA refuses the pair."""
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    out = dense_attention(q, k, v, logit_bias=bias, is_causal=True, backend=backend)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = dense_masked_attention(q, k, v, causal, logit_bias=bias)[0]
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v, bias))
    expected_grads = torch.autograd.grad(expected.pow(2).sum(), (q, k, v, bias))
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_dense_attention_causal_flag_never_looks_ahead(backend):
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    out = dense_attention(q, k, v, is_causal=True, backend=backend)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(out, dense_masked_attention(q, k, v, causal)[0], atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="inside `mask`"):
        dense_attention(q, k, v, causal, is_causal=True, backend=backend)

"""`attnzoo.core.saved_tensors`: a registered tensor is made again in backward instead of kept; everything else is
kept (without leaking a Function's saved output) and shown to an observing measurement; other hooks take
precedence."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from attnzoo.core.saved_tensors import RegeneratedTensors, observing_hooks, other_saved_tensor_hooks


class ScaleBy(torch.autograd.Function):
    """`x * w` with the weight `w` (no gradient) and the output saved, as the kernels' Functions save theirs."""

    @staticmethod
    def forward(ctx, x, w):
        out = x * w
        ctx.save_for_backward(w, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        w, _ = ctx.saved_tensors
        return grad * w, None


def test_a_registered_tensor_is_rebuilt_once_in_backward_and_the_gradient_is_unchanged():
    x = torch.randn(6, requires_grad=True)
    w = torch.rand(6)
    calls = []

    def rebuild():
        calls.append(torch.is_grad_enabled())
        return {"w": w.clone()}

    hooks = RegeneratedTensors(rebuild, "cpu")
    hooks.register(w=w)
    with hooks.active():
        out = ScaleBy.apply(x, w)
        out2 = ScaleBy.apply(out, w)  # two Functions read the same registered tensor: one rebuild
    assert calls == [], "nothing is rebuilt in forward"
    out2.sum().backward()
    assert calls == [False], "one rebuild, without an autograd graph"
    torch.testing.assert_close(x.grad, w * w, rtol=0, atol=0)


def test_a_tensor_changed_in_place_after_forward_is_an_error_in_backward():
    x = torch.randn(6, requires_grad=True)
    y = x * 2
    hooks = RegeneratedTensors(dict, "cpu")
    with hooks.active():
        out = y.sin()  # keeps y
    with torch.no_grad():
        y.mul_(3.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        out.sum().backward()


def test_the_rebuilt_tensors_are_dropped_after_their_last_reader():
    x = torch.randn(6, requires_grad=True)
    w = torch.rand(6)
    hooks = RegeneratedTensors(lambda: {"w": w.clone()}, "cpu")
    hooks.register(w=w)
    with hooks.active():
        first = ScaleBy.apply(x, w)
        unused = ScaleBy.apply(x, w)  # holds the name too, but the loss leaves it out: it never runs
        second = ScaleBy.apply(first, w)
    hooks.release_after(first.grad_fn)
    second.sum().backward(retain_graph=True)
    assert hooks._rebuilt is None, "the rebuilt tensors outlived their last reader"
    grad = x.grad.clone()
    x.grad = None
    second.sum().backward()  # through the retained graph: rebuilt again
    torch.testing.assert_close(x.grad, grad, rtol=0, atol=0)
    del unused


def test_kept_tensors_are_shown_to_an_observer_and_registered_ones_are_not():
    x = torch.randn(6, requires_grad=True)
    w = torch.rand(6)
    seen = []
    with observing_hooks(lambda t: seen.append(tuple(t.shape))):
        assert not other_saved_tensor_hooks(), "an observer does not own the saved tensors"
        hooks = RegeneratedTensors(lambda: {"w": w}, "cpu")
        hooks.register(w=w)
        with hooks.active():
            ScaleBy.apply(x, w)
        y = torch.randn(3, requires_grad=True)
        y.sin()  # saved outside the hooks: observed as well
    # the output is kept and observed; the registered weight is neither
    assert seen == [(6,), (3,)]


@pytest.mark.parametrize("hooks", ["regenerated", "observing"])
def test_a_saved_output_does_not_keep_itself_alive(hooks):
    # A forward measured without a backward (the benchmarks' saved-bytes count) must free its graph when dropped.
    active = RegeneratedTensors(dict, "cpu").active() if hooks == "regenerated" else observing_hooks(lambda t: None)
    x = torch.randn(6, requires_grad=True)
    with active:
        out = ScaleBy.apply(x, torch.rand(6))
    ref = weakref.ref(out)
    del out
    gc.collect()
    assert ref() is None, "the saved output and its node form a reference cycle"


def test_the_rebuild_runs_under_the_forwards_autocast_state():
    states = []

    def rebuild():
        states.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return {"w": torch.ones(6)}

    x = torch.randn(6, requires_grad=True)
    w = torch.ones(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hooks = RegeneratedTensors(rebuild, "cpu")
        hooks.register(w=w)
        with hooks.active():
            out = ScaleBy.apply(x, w)
    out.float().sum().backward()
    assert states == [(True, torch.bfloat16)]


def test_activation_checkpointing_owns_the_saved_tensors():
    assert not other_saved_tensor_hooks()
    inside = []

    def layer(x):
        inside.append(other_saved_tensor_hooks())
        return x.sin()

    checkpoint(layer, torch.randn(3, requires_grad=True), use_reentrant=False).sum().backward()
    # the forward, then its recomputation in backward
    assert inside == [True, True]


def test_under_compiled_autograd_the_rebuild_runs_eagerly_and_the_gradient_is_unchanged():
    # Compiled autograd traces the unpack hooks into its backward graph. The rebuild (SBM's: a sampler of
    # data-dependent size, Triton launches, Python ints that change every step) must run as the eager code it is,
    # not be traced and specialised per call.
    x = torch.randn(6, requires_grad=True)
    w = torch.rand(6)
    traced = []

    def rebuild():
        traced.append(torch.compiler.is_compiling())
        return {"w": w.clone()}

    hooks = RegeneratedTensors(rebuild, "cpu")
    hooks.register(w=w)
    with hooks.active():
        out = ScaleBy.apply(x, w)
    torch._dynamo.reset()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="eager")):
        out.sum().backward()
    assert traced == [False]
    torch.testing.assert_close(x.grad, w, rtol=0, atol=0)

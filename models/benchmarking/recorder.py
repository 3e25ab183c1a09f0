"""Counting what a piece of PyTorch code asks of the device: a `TorchDispatchMode` that records every aten op.

[`OpRecorder`] counts, per scope (a module's forward, or everything else): the ops that launch a kernel, the ops that
make the host wait for the device on CUDA (each with the attnzoo line that called it), the bytes the ops write, the
largest single op output and the SDPA calls. [`stubbed_triton_launches`] replaces every Triton kernel launch under
Triton's CPU interpreter by a counted no-op, and [`stubbed_flex_attention`] attnzoo's FlexAttention call by a counted
stand-in of its compiled kernels. [`attnzoo.benchmarking.proxies`] builds the per-layer proxies of GPU speed and
memory on these.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ..core.saved_tensors import observing_hooks, storage_bytes

#: Ops that launch no kernel: allocations without a fill, metadata-only reshapes (views are recognised from their
#: schema) and `promote_types` (dtype arithmetic on the host, which `torch.promote_types` routes through the
#: dispatcher); `lift_fresh` wraps host data into a tensor and counts as a host-to-device copy instead ([`sync_kind`]).
NO_KERNEL = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "_unsafe_view",
        "lift_fresh",
        "set_",
        "promote_types",
    }
)
#: Allocations whose memory is not initialised (a stubbed kernel zero-fills them when it receives them).
UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
#: Ops whose output size or value the host reads from the device: a synchronisation on CUDA.
SYNC_OPS = frozenset(
    {
        "nonzero",
        "_local_scalar_dense",  # .item(), bool(), int(), float() of a tensor
        "is_nonzero",
        "equal",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "masked_select",
        "bincount",
    }
)
HOST_COPY = "tensor from host data (a host-to-device copy on CUDA)"
SDPA_OPS = frozenset(
    {
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)
#: Compute-bound ops that a CPU without native bf16 matrix units emulates about 10x slower than in fp32 (one bf16
#: `mm` of an FFN backward took 2.7 s at N = 512 on the 2-core test machine): on a CPU the recorder computes them in
#: fp32 and rounds each output to the dtype the op returns, which changes no count and no byte.
WIDENED = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)
_LOW_PRECISION = (torch.bfloat16, torch.float16)
#: The kernels one FlexAttention call launches once compiled (torch's inductor lowering): the forward template; in
#: the backward a reduction (`delta`, the row sums of `out * grad_out` in fp32) and the backward template.
FLEX_FORWARD_LAUNCHES = ("flex_attention",)
FLEX_BACKWARD_LAUNCHES = ("flex_attention_backward_delta", "flex_attention_backward")
_PACKAGE = Path(__file__).resolve().parents[1]


def sync_kind(name: str, args: tuple, kwargs: dict) -> str | None:
    """The kind of device synchronisation the aten op `name` (its overload packet) causes on CUDA, or `None`."""
    if name in SYNC_OPS:
        return name
    if name in ("index", "index_put", "index_put_", "_index_put_impl_") and len(args) > 1:
        indices = args[1] if isinstance(args[1], (list, tuple)) else ()
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return f"{name} with a boolean mask"
    if name == "repeat_interleave" and isinstance(args[0], torch.Tensor) and kwargs.get("output_size") is None:
        # `.Tensor(repeats)` or `.self_Tensor(self, repeats)`: without `output_size` the host reads the total.
        repeats = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else args[0]
        if repeats.numel() > 1:
            return "repeat_interleave with tensor repeats"
    if name == "lift_fresh":
        return HOST_COPY
    return None


def attnzoo_site() -> str:
    """`file:line (function)` of the innermost attnzoo frame outside `attnzoo.benchmarking` (the caller of an op)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(_PACKAGE) and path.relative_to(_PACKAGE).parts[0] != "benchmarking":
            return f"{path.relative_to(_PACKAGE).as_posix()}:{frame.lineno} ({frame.name})"
    return "outside attnzoo (autograd)"


@dataclass
class Counts:
    """What one scope of a recording did.

    Args:
        ops: kernel-launching aten ops by name (views and uninitialised allocations excluded).
        syncs: device synchronisations by `"<kind> at <attnzoo line>"`.
        bytes_written: bytes of every counted op's outputs.
        largest_bytes / largest_op: the largest single op output, and the op (with shape and dtype) that wrote it.
        launches: Triton kernel launches by kernel name (stubbed runs only).
        sdpa: one `(head_dim, score_elements)` per SDPA call, `score_elements` being `B * H * Nq * Nk`.
    """

    ops: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)
    bytes_written: int = 0
    largest_bytes: int = 0
    largest_op: str = ""
    launches: Counter = field(default_factory=Counter)
    sdpa: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_ops(self) -> int:
        return sum(self.ops.values())

    def add(self, other: Counts) -> None:
        """Add `other`'s counts to these (the largest output is the larger of the two)."""
        self.ops.update(other.ops)
        self.syncs.update(other.syncs)
        self.launches.update(other.launches)
        self.bytes_written += other.bytes_written
        self.sdpa += other.sdpa
        if other.largest_bytes > self.largest_bytes:
            self.largest_bytes, self.largest_op = other.largest_bytes, other.largest_op


class OpRecorder(TorchDispatchMode):
    """Records aten ops per scope: use as a context manager around the code to count.

    A scope is the name given to a module in [`scoped`]; an op counts in the innermost scope whose forward is
    running (`""` outside them). Forward hooks do not follow autograd into the backward, whose ops count in the
    scope where `backward()` is called. Higher-order ops (FlexAttention) count as one op.
    """

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.scopes: dict[str, Counts] = {}
        self.stack: list[str] = [""]
        #: storages allocated uninitialised while recording (a stubbed kernel zero-fills them)
        self.uninitialised: set[int] = set()
        #: scope -> {storage: bytes} of what autograd packed for backward (filled by `saving_hooks`)
        self.saved: dict[str, dict[Any, int]] = {}
        self.paused = False

    def counts(self, scope: str = "") -> Counts:
        return self.scopes.setdefault(scope, Counts())

    def total(self, exclude: tuple[str, ...] = ()) -> Counts:
        """Every scope's counts added up, except the scopes in `exclude`."""
        total = Counts()
        for scope, counts in self.scopes.items():
            if scope not in exclude:
                total.add(counts)
        return total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = getattr(func, "overloadpacket", None)
        name = packet.__name__ if packet is not None else getattr(func, "__name__", str(func))
        out = _widened(func, args, kwargs) if name in WIDENED else func(*args, **kwargs)
        if self.paused:
            return out
        counts = self.counts(self.stack[-1])
        kind = sync_kind(name, args, kwargs)
        if kind is not None:
            counts.syncs[f"{kind} at {attnzoo_site()}"] += 1
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if name in UNINITIALISED:
            self.uninitialised.update(t.untyped_storage().data_ptr() for t in outputs)
        if name in NO_KERNEL or getattr(func, "is_view", False):
            return out
        counts.ops[name] += 1
        if name in SDPA_OPS and len(args) > 1 and isinstance(args[1], torch.Tensor):
            q, k = args[0], args[1]
            counts.sdpa.append((int(q.shape[-1]), q.shape[:-1].numel() * int(k.shape[-2])))
        for tensor in outputs:
            if tensor.layout != torch.strided:
                continue
            nbytes = tensor.numel() * tensor.element_size()
            counts.bytes_written += nbytes
            if nbytes > counts.largest_bytes:
                counts.largest_bytes = nbytes
                counts.largest_op = f"{name} {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"
        return out

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Ops run inside the block are not recorded."""
        paused, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = paused

    @contextlib.contextmanager
    def scoped(self, modules: dict[str, nn.Module]) -> Iterator[None]:
        """Within the block, the forward ops of each module count under its name in `modules`."""
        handles = []
        for name, module in modules.items():

            def enter(module: nn.Module, args: tuple, name: str = name) -> None:
                self.stack.append(name)

            def leave(module: nn.Module, args: tuple, output: Any) -> None:
                self.stack.pop()

            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def saving_hooks(self, parameters: list[nn.Parameter]) -> contextlib.AbstractContextManager:
        """`saved_tensors_hooks` recording each unique storage autograd packs for backward in [`saved`] under the
        current scope (the `parameters`' storages excluded: they are kept anyway)."""
        params = {p.untyped_storage().data_ptr() for p in parameters}

        def observe(tensor: torch.Tensor) -> None:
            key, nbytes = storage_bytes(tensor)
            if key not in params and nbytes:
                self.saved.setdefault(self.stack[-1], {})[key] = nbytes

        return observing_hooks(observe)


def _widened(func: Any, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)`, computed in fp32 when it takes bf16 or fp16 CPU tensors, with each output rounded to
    the dtype the op itself returns (read from its meta kernel)."""
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    low = any(t.dtype in _LOW_PRECISION and t.device.type == "cpu" for t in tensors)
    if not low or kwargs.get("out") is not None:
        return func(*args, **kwargs)
    meta_args, meta_kwargs = _map_tensors(lambda t: t.to("meta"), (args, kwargs))
    expected = func(*meta_args, **meta_kwargs)
    wide_args, wide_kwargs = _map_tensors(lambda t: t.float() if t.dtype in _LOW_PRECISION else t, (args, kwargs))
    result = func(*wide_args, **wide_kwargs)
    if isinstance(result, torch.Tensor):
        return result.to(expected.dtype)
    return type(result)(
        r.to(e.dtype) if isinstance(r, torch.Tensor) else r for r, e in zip(result, expected, strict=True)
    )


def _map_tensors(function: Callable[[torch.Tensor], torch.Tensor], tree: Any) -> Any:
    return tree_map(lambda x: function(x) if isinstance(x, torch.Tensor) else x, tree)


def triton_interpreted() -> bool:
    """Whether attnzoo's Triton kernels were built for Triton's CPU interpreter (imports them)."""
    from ..kernels.dispatch import _load_triton_kernels

    kernels = _load_triton_kernels()
    return not isinstance(kernels, str) and kernels.interpreted()


@contextlib.contextmanager
def stubbed_triton_launches(recorder: OpRecorder) -> Iterator[None]:
    """Under Triton's interpreter, every kernel launch inside the block is counted in `recorder` (in its current
    scope) and runs no program. Tensors handed to the kernel that were allocated uninitialised while recording are
    zero-filled: an output then reads as zeros and an index as 0, valid either way."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def stub(self: InterpretedFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        if warmup:
            return
        recorder.counts(recorder.stack[-1]).launches[self.__name__] += 1
        with recorder.pause(), torch.no_grad():
            for tensor in [*args, *kwargs.values()]:
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() in recorder.uninitialised:
                    tensor.zero_()
                    # Written once, as the kernel would: a later launch reading it (a kernel's output saved for
                    # backward) must not bump its version.
                    recorder.uninitialised.discard(tensor.untyped_storage().data_ptr())

    InterpretedFunction.run = stub
    try:
        yield
    finally:
        InterpretedFunction.run = run


@contextlib.contextmanager
def stubbed_flex_attention(recorder: OpRecorder) -> Iterator[None]:
    """Within the block, attnzoo's FlexAttention call (`flex_attention` in `attnzoo.kernels.flex`, which
    [`~attnzoo.kernels.flex.flex_block_attention`] calls eagerly off CUDA; on CUDA, torch.compile falls back to eager
    under the recorder's dispatch mode and calls it too) is a stand-in of the compiled kernels: no program runs, the
    launches of the forward and of the backward ([`FLEX_FORWARD_LAUNCHES`], [`FLEX_BACKWARD_LAUNCHES`]) are counted in
    `recorder`'s current scope, the output (and with `return_aux` the log-sum-exp) and the gradients are zeros of the
    right shape and dtype, and autograd keeps what torch's FlexAttention autograd saves: q, k, v, the output and the
    fp32 log-sum-exp and row maxima (`(B, H, N)` each). The BlockMask's tile tensors, which torch saves too, are the
    family's cached constants and cost no memory per step: they are not saved here."""
    from torch.nn.attention.flex_attention import AuxOutput

    from ..kernels import flex

    original = flex.flex_attention

    def stub(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out, logsumexp = _StubbedFlexAttention.apply(recorder, query, key, value)
        return out if kwargs.get("return_aux") is None else (out, AuxOutput(lse=logsumexp))

    flex.flex_attention = stub
    try:
        yield
    finally:
        flex.flex_attention = original


@contextlib.contextmanager
def sdpa_dropout_as_on_cuda() -> Iterator[None]:
    """Within the block, `F.scaled_dot_product_attention` with attention dropout runs without it, so that its ops
    and saved tensors are those of CUDA's call. On CUDA its flash and memory-efficient kernels drop inside the same
    launch (forward and backward regenerate the mask from a Philox seed, which is all they keep), while the CPU
    takes the math path for it (materialised scores, a `bernoulli_` mask, batched matmuls: about 20 ops and an
    `N x N` softmax saved per call). The outputs differ (nothing is dropped): the proxies count, they do not compare
    values. The dense baseline is counted without dropout for the same reason."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def without_dropout(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
            args = (*args[:4], 0.0, *args[5:])
        return original(*args, **{**kwargs, "dropout_p": 0.0} if "dropout_p" in kwargs else kwargs)

    F.scaled_dot_product_attention = without_dropout
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class _StubbedFlexAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, recorder: OpRecorder, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        launches = recorder.counts(recorder.stack[-1]).launches
        launches.update(FLEX_FORWARD_LAUNCHES)
        with recorder.pause():
            # The kernel's outputs: (B, H, N, d_v) in the queries' memory layout (torch's FlexAttention keeps it, and
            # the layout decides whether the caller's head merge copies), and two fp32 (B, H, N) row statistics.
            same_dim = value.shape[-1] == query.shape[-1]
            out = torch.zeros_like(query) if same_dim else query.new_zeros(*query.shape[:-1], value.shape[-1])
            logsumexp = query.new_zeros(query.shape[:-1], dtype=torch.float32)
            row_max = torch.zeros_like(logsumexp)
        ctx.recorder = recorder
        ctx.save_for_backward(query, key, value, out, logsumexp, row_max)
        ctx.set_materialize_grads(False)  # no zeros made for an unused log-sum-exp's gradient (no op to count)
        return out, logsumexp

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_logsumexp: torch.Tensor):
        recorder = ctx.recorder
        recorder.counts(recorder.stack[-1]).launches.update(FLEX_BACKWARD_LAUNCHES)
        query, key, value = ctx.saved_tensors[:3]
        with recorder.pause():
            grads = tuple(torch.zeros_like(t) for t in (query, key, value))
        return None, *grads

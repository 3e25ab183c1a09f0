"""Saved-tensor hooks: tensors made again in backward instead of kept, and hooks that only watch what is kept.

SBM's fastRG graph has `density * n * m` edges per head (about 48 M per layer at 16K tokens and 1.5% density), and
its edge attention and straight-through estimator both read the edges in backward. Kept, at 9 bytes an edge, they
would outweigh every other activation of the layer at long lengths. The graph is a deterministic function of the
memberships (recomputed from the queries and keys, which backward keeps anyway) and of a few generator draws, so
backward samples it again, as FlashAttention regenerates its dropout mask ([`RegeneratedTensors`]). Hooks rather than
arguments of the autograd Functions keep the kernels' Functions generic.

The benchmarks measure what autograd keeps with hooks of their own ([`observing_hooks`]); regeneration runs under
them and shows them what it keeps, so that a measurement sees the layer as it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import Tensor

#: attribute marking a pack hook that only records what autograd keeps (its unpack returns the tensor as packed)
_OBSERVER = "_attnzoo_observes_saved_tensors"


def storage_bytes(tensor: Tensor) -> tuple[Any, int]:
    """`(key, bytes)` of the storage holding `tensor` (tensors sharing a storage share a key); a tensor without a
    single storage (sparse) is keyed by its identity and counted by its elements."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return ("id", id(tensor)), tensor.numel() * tensor.element_size()


def observing_hooks(observe: Callable[[Tensor], None]) -> AbstractContextManager:
    """`saved_tensors_hooks` that call `observe` on every tensor autograd keeps for backward and keep it (a
    measurement: [`RegeneratedTensors`] may run under them and reports to them what it keeps).

    A kept tensor is a detached alias: kept as is, a saved output would hold its own node, a reference cycle that no
    garbage collection breaks, and a forward measured without a backward would keep its whole graph allocated."""

    def pack(tensor: Tensor) -> Tensor:
        observe(tensor)
        return tensor.detach()

    setattr(pack, _OBSERVER, True)
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)


def _outer_pack() -> tuple[Callable[[Tensor], Any] | None, bool]:
    """The innermost active pack hook (`None`: no hooks) and whether it is an observer's."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)  # (pack, unpack) innermost, or None
    pack = None if hooks is None else hooks[0]
    return pack, getattr(pack, _OBSERVER, False)


def other_saved_tensor_hooks() -> bool:
    """Whether saved-tensor hooks other than observers are active (non-reentrant activation checkpointing,
    offloading): they own the saved tensors then (checkpointing recomputes the whole layer anyway), and nesting
    [`RegeneratedTensors`] would hide tensors from them."""
    pack, observer = _outer_pack()
    return pack is not None and not observer


def _key(t: Tensor) -> tuple | None:
    # Storage address and layout: a packed tensor is the registered one or an alias of it with the same contents.
    # A tensor without a storage (sparse, fake) is never registered.
    try:
        return t.data_ptr(), t.dtype, tuple(t.shape), t.stride()
    except (RuntimeError, NotImplementedError):
        return None


class RegeneratedTensors:
    """Saved-tensor hooks that keep a name in place of each registered tensor and, in backward, read it from
    `rebuild()` (called once, under `no_grad`, with the forward's autocast state).

    Every other saved tensor is kept as a detached alias (kept as is, a Function's saved output would hold its own
    node: a reference cycle that leaks it) with its version, and shown to the observing hooks active when this
    object was made. Torch checks no version under hooks, so the unpack does: a tensor changed in place after it was
    saved is an error in backward, as without hooks (and `rebuild`, which reads the forward's inputs again, would
    otherwise make its tensors from the changed values).

    Args:
        rebuild (`callable`): returns a dict from each registered name to a tensor equal to the registered one.
        device_type (`str`): the device whose autocast state `rebuild` runs under.
    """

    def __init__(self, rebuild: Callable[[], dict[str, Tensor | None]], device_type: str):
        self._rebuild = rebuild
        self._names: dict[tuple, str] = {}
        self._rebuilt: dict[str, Tensor | None] | None = None
        self._device_type = device_type
        self._autocast = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        outer, observer = _outer_pack()
        self._observe = outer if observer else None

    def register(self, **tensors: Tensor | None) -> None:
        """Pack these tensors as their names from now on (`None` values are skipped)."""
        self._names.update({key: name for name, t in tensors.items() if t is not None and (key := _key(t))})

    def release_after(self, node: torch.autograd.graph.Node | None) -> None:
        """Drop the rebuilt tensors once `node` has run in backward: it must be the last node to read them (nodes
        that hold them but never run, e.g. of an output the loss leaves out, would keep them to the end of backward
        otherwise). A later backward through a retained graph rebuilds them. `None` (no autograd graph): nothing."""
        if node is not None:
            node.register_hook(lambda grad_inputs, grad_outputs: self._release())

    def _release(self) -> None:
        self._rebuilt = None

    def pack(self, t: Tensor) -> tuple[Tensor, int] | str:
        key = _key(t)
        name = None if key is None else self._names.get(key)
        if name is not None:
            return name
        if self._observe is not None:
            self._observe(t)
        return t.detach(), t._version  # the alias shares the version counter

    # Compiled autograd traces unpack hooks into its backward graph: the rebuild (a sampler of data-dependent size,
    # Python ints that change every call) runs as eager code there instead of being traced and specialised per call.
    @torch.compiler.disable
    def unpack(self, packed: tuple[Tensor, int] | str) -> Tensor | None:
        if not isinstance(packed, str):
            tensor, version = packed
            if tensor._version != version:
                raise RuntimeError(
                    f"a tensor of shape {tuple(tensor.shape)} and dtype {tensor.dtype} that backward needs was "
                    f"modified in place after the forward saved it (version {tensor._version}, saved at {version})"
                )
            return tensor
        if self._rebuilt is None:
            enabled, dtype = self._autocast
            with torch.no_grad(), torch.autocast(self._device_type, dtype=dtype, enabled=enabled):
                self._rebuilt = self._rebuild()
        return self._rebuilt[packed]

    @contextmanager
    def active(self) -> Iterator[RegeneratedTensors]:
        """The hooks, on the tensors saved inside the block."""
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield self

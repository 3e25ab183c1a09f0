"""One (model, level) at one length: the module, its inputs and the untimed set-up, step and autograd accounting."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..core.layers import EncoderLayer
from ..core.saved_tensors import observing_hooks, storage_bytes
from .rows import BenchModel, make_inputs
from .settings import BenchmarkSettings


def short_error(err: BaseException) -> str:
    """One-line status of something that raised (a workload, a worker): `"error: Type: first line"`."""
    return f"error: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


def hidden_loss(hidden: torch.Tensor) -> torch.Tensor:
    """The benchmark's training objective `mean(last_hidden_state ** 2)`, in fp32."""
    return hidden.float().pow(2).mean()


def _hidden(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0]


def first_encoder_layer(model: nn.Module) -> nn.Module:
    """The first encoder layer: `encoder.layers[0]` in the zoo, `encoder.layer[0]` in BERT-like HF models,
    `layers[0]` in ModernBERT (no encoder module)."""
    encoder = getattr(model, "encoder", model)
    layers = getattr(encoder, "layers", None) or encoder.layer
    return layers[0]


class Workload:
    """One (model, level) at one length on one device: the module, its inputs and the timed step callables.

    At `level="layer"` the first encoder layer is replayed on the exact positional and keyword arguments it received
    during one full forward (captured by a forward pre-hook), which covers every model's private layer signature
    (BigBird's band masks, Longformer's global-attention flags) without re-implementing any of them.
    """

    def __init__(self, row: BenchModel, level: str, length: int, settings: BenchmarkSettings):
        self.row, self.level, self.length = row, level, length
        self.device = settings.device
        torch.manual_seed(settings.seed)
        self.model = row.build_on(settings.size, length, settings.device, settings.torch_dtype)
        self.inputs = make_inputs(row, settings.size, settings.batch_size, length, settings.device, settings.seed)
        self.notes: list[str] = []
        self.density: float | None = None
        with torch.no_grad():
            if level == "layer":
                captured: dict[str, Any] = {}

                def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
                    captured.setdefault("args", args)
                    captured.setdefault("kwargs", kwargs)

                self.module = first_encoder_layer(self.model)
                handle = self.module.register_forward_pre_hook(capture, with_kwargs=True)
                try:
                    output = self.model(**self.inputs)
                finally:
                    handle.remove()
                self.args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in captured["args"])
                self.kwargs = dict(captured["kwargs"])
            else:
                self.module = self.model
                output = self.model(**self.inputs)
        density = getattr(output, "attention_density", None)
        if density is not None:
            self.density = float(density.float().mean())
        if getattr(self.model, "attention_type", None) == "original_full":
            # HF BigBird silently switches itself to full attention below (5 + 2 * random blocks) * block_size.
            self.notes.append("BigBird fell back to full attention at this length")

    def _call(self, grad: bool) -> Any:
        if self.level == "model":
            return self.module(**self.inputs)
        hidden, *rest = self.args
        if grad:
            # The layer's input needs a gradient too: in a model the backward continues into the layer below.
            hidden = hidden.detach().requires_grad_(True)
        return self.module(hidden, *rest, **self.kwargs)

    def prepare(self, mode: str, keep_grads: bool = False) -> None:
        """Untimed set-up before a step: eval for the forward, training mode and no stale grads for fwd+bwd.

        Timing frees the gradients (`set_to_none`, as Trainer does). Memory measurements keep them allocated
        (zeroed) so that a step's peak is its activations and temporaries, not the parameter-sized gradient buffers
        every model of this size allocates alike (performance.md §5.1: parameters and gradients apart).
        """
        self.module.train(mode == "fwd_bwd")
        if mode == "fwd_bwd":
            self.module.zero_grad(set_to_none=not keep_grads)

    def step(self, mode: str) -> None:
        """One forward (no autograd) or one forward+backward of `mean(last_hidden_state ** 2)` (+ auxiliary loss)."""
        if mode == "fwd":
            with torch.no_grad():
                self._call(grad=False)
            return
        output = self._call(grad=True)
        loss = hidden_loss(_hidden(output))
        aux_loss = getattr(output, "aux_loss", None)
        if isinstance(self.module, EncoderLayer):
            aux_loss = output[2]  # a zoo layer returns (hidden, weights, aux_loss, density)
        if aux_loss is not None:
            # Methods with an auxiliary loss (SBM's density term) pay its backward in real training too.
            loss = loss + aux_loss.float()
        loss.backward()

    def parameters_bytes(self) -> int:
        """Bytes of the measured module's parameters (their gradients take as much again)."""
        return sum(p.numel() * p.element_size() for p in self.module.parameters())

    def saved_for_backward_bytes(self) -> int:
        """Bytes autograd keeps for the backward of one training step (unique storages, parameters excluded)."""
        self.prepare("fwd_bwd")
        param_storages = {p.untyped_storage().data_ptr() for p in self.module.parameters()}
        seen: dict[Any, int] = {}

        def observe(tensor: torch.Tensor) -> None:
            key, nbytes = storage_bytes(tensor)
            if key not in param_storages and nbytes:
                seen[key] = nbytes

        with observing_hooks(observe):
            output = self._call(grad=True)
        del output
        self.module.zero_grad(set_to_none=True)
        return sum(seen.values())

    def close(self) -> None:
        self.model = self.module = self.inputs = self.args = self.kwargs = None

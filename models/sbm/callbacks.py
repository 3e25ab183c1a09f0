"""Trainer integration: log the mask density of every SBM attention layer during training."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn
from transformers import TrainerCallback

from .attention_sbm import SBMAttention


class SBMDensityCallback(TrainerCallback):
    """Logs the mean mask density of each SBM layer (averaged over heads and over the steps since the last log).

    Keys: `sbm_density/layer_{i}` for encoder layers, `sbm_density/decoder_layer_{i}` and
    `sbm_density/cross_attention_layer_{i}` for the decoder sites, and `sbm_density/mean` over all of them. The
    density of a layer is the fraction of valid (query, key) pairs it attended to, as in `outputs.attention_density`.

    Example:

    ```python
    >>> from transformers import Trainer
    >>> from attnzoo.sbm.callbacks import SBMDensityCallback
    >>> trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[SBMDensityCallback()])
    ```
    """

    def __init__(self) -> None:
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)

    @staticmethod
    def _name(module: SBMAttention) -> str:
        prefix = "" if module.site == "encoder" else f"{module.site}_"
        return f"sbm_density/{prefix}layer_{module.layer_idx}"

    def attach(self, model: nn.Module) -> None:
        """Hook every SBM attention of `model` (done automatically at the start of training)."""
        self.detach()
        for module in model.modules():
            if isinstance(module, SBMAttention) and module.use_sbm:
                self._handles.append(module.register_forward_hook(self._record))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _record(self, module: SBMAttention, args, output) -> None:
        if module.training and output.density is not None:
            name = self._name(module)
            self._sums[name] += float(output.density.mean())
            self._counts[name] += 1

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.attach(model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or not self._counts:
            return
        means = {name: self._sums[name] / self._counts[name] for name in sorted(self._counts)}
        logs.update(means)
        logs["sbm_density/mean"] = sum(means.values()) / len(means)
        self._sums.clear()
        self._counts.clear()

    def on_train_end(self, args, state, control, **kwargs):
        self.detach()

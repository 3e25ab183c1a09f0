"""How a parameter of the converted model that has no source was initialised, in words and numbers."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..core.attention import ZooAttention

# Module types whose parameters transformers' `PreTrainedModel._init_weights` initialises (the zoo's `_init_weights`
# defers to it), as (weight rule, bias rule).
_STANDARD_RULES: dict[type, tuple[str, str]] = {
    nn.Linear: ("normal(0, {std})", "zeros"),
    nn.Embedding: ("normal(0, {std})", ""),
    nn.LayerNorm: ("ones", "zeros"),
}


def describe_init(model: nn.Module, name: str, initializer_range: float) -> str:
    """
    The initialisation of parameter `name` of `model` as it stands: the rule that set it and what it holds.

    Standard layers get transformers' rule (normal with the config's `initializer_range`, zero biases, LayerNorm at
    one / zero); a method's own parameters name the attention (or module) class whose `init_method_weights` set
    them, with their mean, standard deviation and range, since those rules are the method's own (A²-Former's
    spread offsets, SBM's cluster embeddings, ...).
    """
    owner_name, _, attribute = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    values = _values(getattr(owner, attribute).detach().float())
    warm_start = _warm_start_rule(model, owner_name, attribute)
    if warm_start is not None:
        return f"{warm_start}: {values}"
    for module_type, (weight_rule, bias_rule) in _STANDARD_RULES.items():
        if type(owner) is module_type:
            rule = (weight_rule if attribute == "weight" else bias_rule).format(std=initializer_range)
            return f"{rule} ({type(owner).__name__}.{attribute}; holds {values})" if rule else values
    return f"{_method_rule(model, owner_name)}: {values}"


def _values(tensor: torch.Tensor) -> str:
    """What a tensor holds, in a few numbers."""
    if tensor.numel() and bool((tensor == 0).all()):
        return "zeros"
    if tensor.numel() and bool((tensor == tensor.flatten()[0]).all()):
        return f"constant {tensor.flatten()[0].item():.4g}"
    std = tensor.std().item() if tensor.numel() > 1 else 0.0
    low, high = tensor.min().item(), tensor.max().item()
    return f"mean {tensor.mean().item():.3g}, std {std:.3g}, range [{low:.3g}, {high:.3g}]"


def _nearest(model: nn.Module, path: str, accepts: Callable[[nn.Module], bool]) -> tuple[nn.Module, str] | None:
    """The innermost module along the dotted module `path` (the model itself last) that `accepts`, with the rest of
    the path below it; None when no module on the way does."""
    parts = path.split(".") if path else []
    for end in range(len(parts), -1, -1):
        module = model.get_submodule(".".join(parts[:end]))  # "" is the model itself
        if accepts(module):
            return module, ".".join(parts[end:])
    return None


def _warm_start_rule(model: nn.Module, owner_name: str, attribute: str) -> str | None:
    """`<Attention>.init_for_warm_start` when the parameter is one of an attention's `not_from_source` ones."""
    found = _nearest(model, owner_name, lambda module: isinstance(module, ZooAttention))
    if found is None:
        return None
    attention, below = found
    local = f"{below}.{attribute}" if below else attribute
    return f"{type(attention).__name__}.init_for_warm_start" if local in attention.not_from_source else None


def _method_rule(model: nn.Module, owner_name: str) -> str:
    """`<Class>.init_method_weights` of the nearest enclosing module that defines it, else the owner's
    constructor (the parameter then holds what the module created it with)."""
    found = _nearest(model, owner_name, lambda module: hasattr(module, "init_method_weights"))
    if found is not None:
        return f"{type(found[0]).__name__}.init_method_weights"
    owner = model.get_submodule(owner_name)
    return f"{type(owner).__name__} constructor"

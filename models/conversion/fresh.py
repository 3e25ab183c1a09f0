"""How a parameter of the converted model that has no source was initialised, in words and numbers."""

from __future__ import annotations

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
    owner = model.get_submodule(owner_name) if owner_name else model
    values = _values(getattr(owner, attribute).detach().float())
    warm_start = _warm_start_rule(model, name)
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


def _warm_start_rule(model: nn.Module, name: str) -> str | None:
    """`<Attention>.init_for_warm_start` when `name` is one of an attention's `not_from_source` parameters."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        module = model.get_submodule(".".join(parts[:end]))
        if isinstance(module, ZooAttention):
            local = ".".join(parts[end:])
            return f"{type(module).__name__}.init_for_warm_start" if local in module.not_from_source else None
    return None


def _method_rule(model: nn.Module, owner_name: str) -> str:
    """`<Class>.init_method_weights` of the nearest enclosing module that defines it, else the owner's
    constructor (the parameter then holds what the module created it with)."""
    parts = owner_name.split(".") if owner_name else []
    for end in range(len(parts), -1, -1):
        module = model.get_submodule(".".join(parts[:end])) if end else model
        if hasattr(module, "init_method_weights"):
            return f"{type(module).__name__}.init_method_weights"
    owner = model.get_submodule(owner_name) if owner_name else model
    return f"{type(owner).__name__} constructor"

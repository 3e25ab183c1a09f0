"""Constant tensors derived from a length alone, built once per (arguments, device) instead of on every call.

Each would otherwise cost its kernel launches in every layer's forward (an `arange` and its arithmetic, a twiddle
factor, a fill): on a GPU a launch costs about as much as a small kernel, whatever its size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

Builder = TypeVar("Builder", bound=Callable[..., torch.Tensor])


def _memo(builder: Builder) -> Callable[..., torch.Tensor]:
    """`builder` cached on its (hashable) arguments, built outside autograd and inference mode (so that any caller,
    a later training step's autograd included, may read it)."""
    memo = functools.lru_cache(maxsize=64)(builder)

    def build(*args):
        with torch.inference_mode(False), torch.no_grad():
            return memo(*args)

    return build


def cached_constant(builder: Builder) -> Builder:
    """Decorator: `builder(*args)` (hashable arguments, a `torch.device` among them) built once and then shared.

    The cached tensor is built outside autograd and inference mode, so that any caller may read it; callers must not
    write to it. Under `torch.compile` the builder runs as written (dynamo would bypass a cache and warn): the graph
    then holds the constant, with no graph break.

    Args:
        builder (`Callable[..., torch.Tensor]`): a pure function of its arguments.

    Returns:
        The cached builder.
    """
    build = _memo(builder)

    @functools.wraps(builder)
    def get(*args):
        return builder(*args) if torch.compiler.is_compiling() else build(*args)

    return get  # type: ignore[return-value]


def host_cached_constant(builder: Builder) -> Builder:
    """[`cached_constant`] for builders that must not be traced: ones that wait for the device while building (a
    selection, a `unique`) or build objects dynamo does not trace (a BlockMask). Under `torch.compile` the lookup is a
    host-side call (a graph break) instead of the builder traced into every graph.

    Args:
        builder (`Callable[..., Any]`): a pure function of its (hashable) arguments.

    Returns:
        The cached builder.
    """
    return torch.compiler.disable(functools.wraps(builder)(_memo(builder)))  # type: ignore[return-value]


@cached_constant
def scalar(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-d tensor holding `value` (a Python scalar given to `torch.where` is wrapped into a new tensor on every
    call; this one is made once per device)."""
    return torch.full((), value, dtype=dtype, device=device)

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


def cached_constant(builder: Builder) -> Builder:
    """Decorator: `builder(*args)` (hashable arguments, a `torch.device` among them) built once and then shared.

    The cached tensor is built outside autograd and inference mode, so that any caller may read it; callers must not
    write to it. Under `torch.compile` the builder runs as written (dynamo would bypass a cache and warn): the graph
    then holds the constant.

    Args:
        builder (`Callable[..., torch.Tensor]`): a pure function of its arguments.

    Returns:
        The cached builder.
    """
    memo = functools.lru_cache(maxsize=64)(builder)

    @functools.wraps(builder)
    def get(*args):
        if torch.compiler.is_compiling():
            return builder(*args)
        with torch.inference_mode(False), torch.no_grad():
            return memo(*args)

    return get  # type: ignore[return-value]

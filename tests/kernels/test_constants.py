"""`cached_constant`: built once per arguments, outside autograd and inference mode."""

from __future__ import annotations

import torch

from attnzoo.kernels.constants import cached_constant

calls: list[tuple] = []


@cached_constant
def ramp(length: int, device: torch.device) -> torch.Tensor:
    calls.append((length, device))
    return torch.arange(length, dtype=torch.float32, device=device)


def test_a_constant_is_built_once_per_arguments_and_usable_from_any_mode():
    calls.clear()
    cpu = torch.device("cpu")
    with torch.inference_mode():
        first = ramp(5, cpu)
    assert not first.is_inference() and not first.requires_grad
    assert ramp(5, cpu) is first and ramp(6, cpu) is not first
    assert calls == [(5, cpu), (6, cpu)]
    # Built under inference mode, it still enters an autograd graph (an inference tensor could not be saved).
    weight = torch.ones(5, requires_grad=True)
    (weight * first).sum().backward()
    assert torch.equal(weight.grad, first)

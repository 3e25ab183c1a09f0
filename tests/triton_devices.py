"""Where the Triton kernels' tests run: under the interpreter on CPU tensors (without CUDA), and compiled on CUDA
(the `gpu` marker, run by the GPU command)."""

from __future__ import annotations

import pytest
import torch

#: `@pytest.mark.parametrize("device", TRITON_DEVICES)`: `"cpu"` (id `interpreter`) or `"cuda"`.
TRITON_DEVICES = [
    pytest.param(
        "cpu",
        id="interpreter",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the kernels compile instead"),
    ),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]

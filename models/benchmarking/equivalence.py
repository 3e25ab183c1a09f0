"""Before timing: does a family's fast path compute what its `attention_backend="reference"` path computes?"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ..testing import probe_loss
from .rows import BenchModel, make_inputs
from .settings import BenchmarkSettings


def check_equivalence(row: BenchModel, settings: BenchmarkSettings, length: int) -> dict[str, Any]:
    """Compare a family's fast path with `attention_backend="reference"` on the same weights (fp32, eval mode).

    Eval mode makes sampling methods deterministic; the outputs must agree within `atol + rtol * max|reference|`,
    and every parameter's gradient of a fixed random projection of the output ([`~attnzoo.testing.probe_loss`]; the
    benchmark's own `mean(last_hidden_state ** 2)` is nearly constant after the final LayerNorm, so its gradient
    barely reaches the attention) within `rtol` of that parameter's largest entry. The models have one encoder
    layer, so that both paths see the same input: deeper, the first layer's round-off differences can move a
    data-dependent selection in the next one (FSAT's `floor` of a predicted position flips to the neighbouring query)
    and change a few outputs by far more than the tolerance without any kernel being wrong (FSAT, width 256, 2
    layers: 2 of 2048 and 14 of 8192 positions off by up to 0.1; with 1 layer every output agrees to 1e-6).
    """
    atol, rtol = 1e-4, 2e-3
    try:
        torch.manual_seed(settings.seed)
        fast = row.build_on(dataclasses.replace(settings.size, num_hidden_layers=1), length, settings.device)
        reference_config = copy.deepcopy(fast.config)
        reference_config.attention_backend = "reference"
        with torch.device(settings.device):
            reference = type(fast)(reference_config).eval()
        reference.load_state_dict(fast.state_dict())
        inputs = make_inputs(row, settings.size, 1, length, settings.device, settings.seed)
        outputs = []
        for model in (fast, reference):
            hidden = model(**inputs).last_hidden_state
            probe_loss(hidden.float(), inputs.get("attention_mask")).backward()
            grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
            outputs.append((hidden.detach(), grads))
        (out_fast, grads_fast), (out_ref, grads_ref) = outputs
        output_error = float((out_fast - out_ref).abs().max()) / (atol + rtol * float(out_ref.abs().max()))
        # Each gradient within its own scale (the embeddings' are orders of magnitude above the attention's); the
        # ones that are zero in exact arithmetic (the key bias: softmax ignores a per-query constant) within a
        # millionth of the model's largest.
        grad_scale = max((float(g.abs().max()) for g in grads_ref.values()), default=0.0)
        grad_error = 0.0
        for name, grad_ref in grads_ref.items():
            if name in grads_fast:
                diff = float((grads_fast[name] - grad_ref).abs().max())
                tolerance = rtol * float(grad_ref.abs().max()) + 1e-6 * grad_scale + 1e-30
                grad_error = max(grad_error, diff / tolerance)
        passed = output_error <= 1 and grad_error <= 1 and grads_fast.keys() == grads_ref.keys()
        return {
            "length": length,
            "passed": bool(passed),
            # error / tolerance: pass at <= 1
            "output_error": output_error,
            "grad_error": grad_error,
            "error": None,
        }
    except Exception as err:  # noqa: BLE001 - a broken family must not stop the benchmark of the others
        return {"length": length, "passed": False, "error": f"{type(err).__name__}: {err}"}

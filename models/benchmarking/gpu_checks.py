"""What the GPU command checks on one model besides its speed: host syncs, SDPA's kernel choice and a profile.

- [`sdpa_backend`]: which kernel `F.scaled_dot_product_attention` runs for a head dim, with or without a mask (read
  from the aten op it dispatches to; SDPA's math path shows as no such op);
- [`sync_check`]: every device sync of one training step, by line, and the first one with its attnzoo line, under
  `torch.cuda.set_sync_debug_mode` (on a CPU, counted by the op recorder instead);
- [`profile_step`]: a `torch.profiler` trace of one training step (Chrome trace, gzipped), with its wall time, the
  host time and the device's busy time, and the top kernels.

The model reads `inputs_embeds` (looked up outside the measured step) without an attention mask: the model's own
input checks read the ids and the mask on the host by design, once per forward, and what is checked here is what the
method adds.
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .recorder import SDPA_OPS, OpRecorder
from .rows import BenchModel, make_inputs
from .settings import ModelSize
from .workload import hidden_loss

_PACKAGE = Path(__file__).resolve().parents[1]
#: SDPA's aten ops by the kernel they name.
SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_fused_attention_overrideable": "fused (backend-specific)",
}


def sdpa_backend(
    head_dim: int,
    masked: bool,
    *,
    length: int,
    heads: int = 12,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
) -> str:
    """The kernel SDPA runs for one `(1, heads, length, head_dim)` call, with a key-padding boolean mask or none."""
    q, k, v = (torch.randn(1, heads, length, head_dim, device=device, dtype=dtype) for _ in range(3))
    mask = None
    if masked:
        mask = torch.ones(1, 1, 1, length, dtype=torch.bool, device=device)
        mask[..., -1] = False
    with OpRecorder() as recorder:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ops = [name for name in recorder.total().ops if name in SDPA_OPS]
    return SDPA_KERNELS.get(ops[0], ops[0]) if ops else "math (the scores materialised)"


def _model_step(row: BenchModel, size: ModelSize, length: int, device: str, dtype: torch.dtype) -> Callable[[], None]:
    """A training step of the row's model on embedded inputs without a mask (see the module docstring)."""
    model = row.build_on(size, length, device, dtype).train()
    inputs = make_inputs(row, size, 1, length, device, 0)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(inputs["input_ids"])

    def step() -> None:
        model.zero_grad(set_to_none=True)
        output = model(inputs_embeds=embeds)
        loss = hidden_loss(output.last_hidden_state)
        if getattr(output, "aux_loss", None) is not None:
            loss = loss + output.aux_loss.float()
        loss.backward()

    return step


def _first_attnzoo_frame(frames: list[traceback.FrameSummary]) -> str:
    inside = [f for f in frames if Path(f.filename).resolve().is_relative_to(_PACKAGE)]
    frame = inside[-1] if inside else (frames[-1] if frames else None)
    if frame is None:
        return "?"
    path = Path(frame.filename).resolve()
    where = path.relative_to(_PACKAGE).as_posix() if path.is_relative_to(_PACKAGE) else path.name
    return f"{where}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()}"


def sync_check(row: BenchModel, size: ModelSize, length: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """The device syncs of one training step of `row`'s model, after an untimed warm-up step.

    On CUDA: `set_sync_debug_mode("warn")` counts every sync by the Python line that issued it, then `"error"` stops
    at the first one, whose innermost attnzoo frame is reported. On a CPU the op recorder counts the same ops.
    Returns `{"row", "syncs": {line: count}, "first_sync": line or None, "error": other failure or None}`.
    """
    result: dict[str, Any] = {"row": row.name, "syncs": {}, "first_sync": None, "error": None}
    try:
        step = _model_step(row, size, length, device, dtype)
        step()
        if device != "cuda":
            with OpRecorder() as recorder:
                step()
            result["syncs"] = dict(recorder.total().syncs)
            result["first_sync"] = next(iter(result["syncs"]), None)
            return result
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        sites = Counter(
            f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower()
        )
        result["syncs"] = dict(sites)
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        except RuntimeError as err:
            if "synchroniz" not in str(err).lower():
                raise
            result["first_sync"] = _first_attnzoo_frame(traceback.extract_tb(err.__traceback__))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    except Exception as err:  # noqa: BLE001 - a family that fails is a finding; the others are still checked
        result["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return result


def profile_step(
    row: BenchModel, size: ModelSize, length: int, device: str, dtype: torch.dtype, out_dir: Path
) -> dict[str, Any]:
    """`torch.profiler` of one training step of `row`'s model (after a warm-up step), written to
    `out_dir/<row>.json.gz` (Chrome trace) and `out_dir/<row>.txt` (the top ops by device, else CPU, time).

    Returns the row, the files, the step's wall time, the host's op time, the device's kernel time, the number of
    device kernels, and the five ops with the most device (or CPU) time; `error` when it failed.
    """
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in row.name)
    result: dict[str, Any] = {"row": row.name, "error": None}
    try:
        step = _model_step(row, size, length, device, dtype)
        step()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as profiler:
            start = time.perf_counter()
            step()
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
        out_dir.mkdir(parents=True, exist_ok=True)
        trace = out_dir / f"{safe}.json.gz"
        profiler.export_chrome_trace(str(trace))
        averages = profiler.key_averages()
        on_device = device == "cuda"
        sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
        (out_dir / f"{safe}.txt").write_text(averages.table(sort_by=sort_by, row_limit=30) + "\n")
        kernels = [e for e in profiler.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
        top = sorted(averages, key=lambda a: getattr(a, sort_by, 0.0), reverse=True)[:5]
        result.update(
            files=[trace.name, f"{safe}.txt"],
            wall_ms=wall * 1e3,
            host_ms=sum(a.self_cpu_time_total for a in averages) / 1e3,
            device_ms=sum(e.self_device_time_total for e in kernels) / 1e3 if on_device else None,
            device_kernels=len(kernels) if on_device else None,
            top=[{"op": a.key, "ms": getattr(a, sort_by, 0.0) / 1e3, "calls": a.count} for a in top],
        )
    except Exception as err:  # noqa: BLE001
        result["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return result

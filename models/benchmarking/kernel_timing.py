"""Micro-benchmarks of the attention kernels against SDPA, in one process, on one set of `(B, H, N, d)` tensors.

Each benchmark builds, from shared q, k, v (and a seeded generator), a function computing one attention output;
[`time_kernels`] times its forward (no autograd) and its forward+backward (`out.backward(grad)`) in interleaved
rounds after warm-up calls (Triton and FlexAttention compile there) and reports the medians and the ratio to SDPA
without a mask in the same rounds. The kernel layer's own fast paths are here; a family's fused kernel adds itself
with [`register_kernel_benchmark`] so that the GPU command times it next to the others.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..kernels import edge_attention, flatten_heads, gathered_attention
from .timing import timed

#: A benchmark: `build(q, k, v, generator)` returns a function computing one output of q's shape.
KernelBenchmark = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], Callable[[], torch.Tensor]]
BASELINE = "sdpa"
KERNEL_BENCHMARKS: dict[str, KernelBenchmark] = {}


def register_kernel_benchmark(name: str) -> Callable[[KernelBenchmark], KernelBenchmark]:
    """Decorator adding a kernel benchmark under `name` (a name is registered once)."""

    def register(build: KernelBenchmark) -> KernelBenchmark:
        if name in KERNEL_BENCHMARKS:
            raise ValueError(f"A kernel benchmark called {name!r} is registered already.")
        KERNEL_BENCHMARKS[name] = build
        return build

    return register


@register_kernel_benchmark(BASELINE)
def _sdpa(q, k, v, generator):
    return lambda: F.scaled_dot_product_attention(q, k, v)


@register_kernel_benchmark("sdpa + key padding mask")
def _sdpa_masked(q, k, v, generator):
    # The last 1% of the keys are padding: a boolean mask takes SDPA off its mask-free kernels.
    valid = torch.ones(q.shape[0], 1, 1, k.shape[2], dtype=torch.bool, device=q.device)
    valid[..., -max(1, k.shape[2] // 100) :] = False
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=valid)


def _random_keys(q: torch.Tensor, k: torch.Tensor, slots: tuple[int, ...], generator: torch.Generator):
    B, H, N, _ = q.shape
    return torch.randint(0, k.shape[2], (B, H, N, *slots), generator=generator).to(q.device)


@register_kernel_benchmark("gathered, 21 keys per query (Smart Bird)")
def _gathered_single(q, k, v, generator):
    idx = _random_keys(q, k, (21,), generator)
    return lambda: gathered_attention(q, k, v, idx)


@register_kernel_benchmark("gathered, 11 slots of 2 weighted keys (A²-Former)")
def _gathered_mixed(q, k, v, generator):
    idx = _random_keys(q, k, (11, 2), generator)
    weight = torch.rand(idx.shape, generator=generator).to(q.device, q.dtype)
    weight = (weight / weight.sum(-1, keepdim=True)).requires_grad_(True)
    return lambda: gathered_attention(q, k, v, idx, weight=weight)


def _edge_benchmark(per_query: int) -> KernelBenchmark:
    def build(q, k, v, generator):
        B, H, N, _ = q.shape
        # Each query row of each head gets `per_query` random keys of its head: rows sorted, as the families pass them.
        rows = torch.arange(B * H * N).repeat_interleave(per_query)
        cols = (rows // N) * N + torch.randint(0, N, rows.shape, generator=generator)
        rows, cols = rows.to(q.device), cols.to(q.device)
        flat = [flatten_heads(t) for t in (q, k, v)]
        return lambda: edge_attention(*flat, rows, cols, sorted_rows=True).view(q.shape)

    return build


register_kernel_benchmark("edges, 9 per query (FSAT)")(_edge_benchmark(9))
register_kernel_benchmark("edges, 246 per query (SBM at 1.5%)")(_edge_benchmark(246))


@dataclass
class KernelTiming:
    """Median milliseconds of one benchmark (`None` when it raised), and its ratio to SDPA in the same rounds."""

    name: str
    fwd_ms: float | None
    fwd_bwd_ms: float | None
    fwd_ratio: float | None
    fwd_bwd_ratio: float | None
    error: str | None = None


def time_kernels(
    batch: int,
    heads: int,
    length: int,
    head_dim: int,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    rounds: int = 10,
    warmup: int = 2,
    names: list[str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Time every registered benchmark (or `names`) at `(batch, heads, length, head_dim)` on `device`.

    Returns `{"shape", "device", "dtype", "rounds", "results": [KernelTiming as dict, ...]}`; a benchmark that raises
    (out of memory, a kernel that does not build) is reported with its error and the others still run.
    """
    generator = torch.Generator().manual_seed(seed)

    def tensor(requires_grad: bool = True) -> torch.Tensor:
        x = torch.randn(batch, heads, length, head_dim, generator=generator)
        return x.to(device, dtype).requires_grad_(requires_grad)

    q, k, v = tensor(), tensor(), tensor()
    grad = tensor(requires_grad=False)
    steps: dict[str, dict[str, Callable[[], None]]] = {}
    errors: dict[str, str] = {}
    for name in names or list(KERNEL_BENCHMARKS):
        try:
            compute = KERNEL_BENCHMARKS[name](q, k, v, generator)
        except Exception as err:  # noqa: BLE001 - one benchmark's failure is a result; the others run
            errors[name] = f"{type(err).__name__}: {err}"
            continue
        steps[name] = {"fwd": _forward(compute), "fwd_bwd": _forward_backward(compute, grad)}
    times: dict[str, dict[str, list[float]]] = {name: {"fwd": [], "fwd_bwd": []} for name in steps}
    for round_index in range(warmup + rounds):
        names_now = list(steps)
        shift = round_index % max(len(names_now), 1)
        for name in names_now[shift:] + names_now[:shift]:
            for mode, step in steps[name].items():
                try:
                    seconds = timed(step, device)
                except Exception as err:  # noqa: BLE001
                    errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                    del steps[name]
                    break
                if round_index >= warmup:
                    times[name][mode].append(seconds * 1e3)
    medians = {
        name: {mode: statistics.median(values) if values else None for mode, values in modes.items()}
        for name, modes in times.items()
        if name not in errors
    }
    baseline = medians.get(BASELINE, {})
    results = []
    for name in names or list(KERNEL_BENCHMARKS):
        if name in errors:
            results.append(KernelTiming(name, None, None, None, None, errors[name]))
            continue
        ms = medians[name]
        ratio = {
            mode: ms[mode] / baseline[mode] if ms[mode] and baseline.get(mode) else None for mode in ("fwd", "fwd_bwd")
        }
        results.append(KernelTiming(name, ms["fwd"], ms["fwd_bwd"], ratio["fwd"], ratio["fwd_bwd"]))
    return {
        "shape": {"batch": batch, "heads": heads, "length": length, "head_dim": head_dim},
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "rounds": rounds,
        "results": [asdict(result) for result in results],
    }


def _forward(compute: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        with torch.no_grad():
            compute()

    return step


def _forward_backward(compute: Callable[[], torch.Tensor], grad: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        compute().backward(grad)

    return step


def kernel_markdown(timings: dict[str, Any]) -> str:
    """The micro-benchmark as a Markdown table."""
    shape = timings["shape"]
    lines = [
        f"B = {shape['batch']}, H = {shape['heads']}, N = {shape['length']}, d = {shape['head_dim']}, "
        f"{timings['dtype']} on {timings['device']}, median of {timings['rounds']} rounds",
        "",
        "| kernel | fwd ms | fwd+bwd ms | fwd × SDPA | fwd+bwd × SDPA |",
        "|---|---|---|---|---|",
    ]
    for r in timings["results"]:
        if r["error"]:
            lines.append(f"| {r['name']} | – | – | – | – ({r['error'][:120]}) |")
            continue
        cells = [r["fwd_ms"], r["fwd_bwd_ms"], r["fwd_ratio"], r["fwd_bwd_ratio"]]
        lines.append(f"| {r['name']} | " + " | ".join("–" if c is None else f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)

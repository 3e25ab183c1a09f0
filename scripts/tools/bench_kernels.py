"""Forward+backward timing of the attention kernels against dense SDPA (not collected by pytest).

Usage: `python scripts/tools/bench_kernels.py [--sizes 1024 4096] [--threads 1]`. Methods are timed in interleaved
rounds and the median is reported; the box may be shared, so treat differences below ~1.3x as noise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnzoo.kernels import (
    edge_attention,
    edge_attention_reference,
    flatten_heads,
    gathered_attention,
    gathered_attention_reference,
)


def _fwd_bwd(fn: Callable[[], torch.Tensor], grad: torch.Tensor) -> None:
    fn().backward(grad)


def _time_interleaved(methods: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    for run in methods.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            methods[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def _report(title: str, results: dict[str, float], baseline: str) -> None:
    print(title)
    for name, ms in results.items():
        print(f"  {name:<28} {ms:9.1f} ms  {ms / results[baseline]:6.2f}x SDPA")


def bench(n: int, heads: int, dim: int, k: int, densities: list[float], rounds: int, max_reference_edges: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, key, v = (torch.randn(1, heads, n, dim, generator=g, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, n, dim, generator=g)
    sdpa = {"sdpa (no mask)": lambda: _fwd_bwd(lambda: F.scaled_dot_product_attention(q, key, v), grad)}

    idx = torch.randint(0, n, (1, heads, n, k), generator=g)
    mask = torch.zeros(1, heads, n, n, dtype=torch.bool).scatter_(-1, idx, True)
    methods = dict(sdpa)
    methods["gathered fast"] = lambda: _fwd_bwd(lambda: gathered_attention(q, key, v, idx), grad)
    methods["gathered reference"] = lambda: _fwd_bwd(lambda: gathered_attention_reference(q, key, v, idx), grad)
    methods["sdpa + bool mask"] = lambda: _fwd_bwd(
        lambda: F.scaled_dot_product_attention(q, key, v, attn_mask=mask), grad
    )
    _report(f"gathered N={n} H={heads} d={dim} K={k}", _time_interleaved(methods, rounds), "sdpa (no mask)")

    for density in densities:
        _bench_edges(q, key, v, grad, sdpa, density, rounds, max_reference_edges, g)


def _bench_edges(q, key, v, grad, sdpa, density, rounds, max_reference_edges, g) -> None:
    _, heads, n, dim = q.shape
    flat = [flatten_heads(t) for t in (q, key, v)]
    flat_grad = flatten_heads(grad)
    # Random edges inside each head's (N, N) block, unsorted: the fast timing includes its row sort.
    num_edges = int(density * n * n * heads)
    head = torch.randint(0, heads, (num_edges,), generator=g)
    local_rows = torch.randint(0, n, (num_edges,), generator=g)
    local_cols = torch.randint(0, n, (num_edges,), generator=g)
    rows, cols = head * n + local_rows, head * n + local_cols
    edge_mask = torch.zeros(1, heads, n, n, dtype=torch.bool)
    edge_mask[0, head, local_rows, local_cols] = True
    methods = dict(sdpa)
    methods["edge fast (incl. sort)"] = lambda: _fwd_bwd(lambda: edge_attention(*flat, rows, cols), flat_grad)
    if num_edges <= max_reference_edges:
        methods["edge reference"] = lambda: _fwd_bwd(lambda: edge_attention_reference(*flat, rows, cols), flat_grad)
    methods["sdpa + bool mask"] = lambda: _fwd_bwd(
        lambda: F.scaled_dot_product_attention(q, key, v, attn_mask=edge_mask), grad
    )
    results = _time_interleaved(methods, rounds)
    title = f"edges N={n} H={heads} d={dim} density={density:.0%} E={num_edges}"
    if num_edges > max_reference_edges:
        title += " (reference skipped: too much memory)"
    _report(title, results, "sdpa (no mask)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--densities", type=float, nargs="+", default=[0.02, 0.1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-reference-edges", type=int, default=2_000_000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), fp32, forward+backward, median of {args.rounds}")
    for n in args.sizes:
        bench(n, args.heads, args.dim, args.k, args.densities, args.rounds, args.max_reference_edges)


if __name__ == "__main__":
    main()

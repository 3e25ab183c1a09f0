"""The Sparse Transformer's two CUDA fast paths against dense SDPA, attention alone (not collected by pytest).

Usage, on a CUDA machine with attnzoo on the path (about 2-4 minutes at the defaults, most of it FlexAttention's
compiles):

    python scripts/tools/bench_sparse_transformer_flex.py --output-dir $OUT/st-flex
    python scripts/tools/bench_sparse_transformer_flex.py --lengths 16384 65536 --patterns strided-split \\
        --block-sizes 128x128 128x64 --output-dir $OUT/st-flex-long

Per pattern and length, at base size (B = 1, 12 heads, d = 64, bf16, stride 64, one global token as in the
benchmark's rows), forward and forward+backward of the attention on given q, k, v (no projections):

- `dense`: `F.scaled_dot_product_attention` without a mask (FlashAttention), the baseline of every ratio;
- `flex`: the layer's FlexAttention path (`attention_backend="fast"`); its first call, which compiles the kernels, is
  timed apart; `flex RxC` rows repeat it with another tile shape (`--block-sizes`);
- `reshape`: the other fast path, reshapes into SDPA and the Triton edge kernel (`attention_backend="triton"`), with
  the core's dense global rows.

Reported: medians of CUDA-event times over interleaved rounds, the peak memory above the inputs, the largest
difference between the outputs of `flex` and `reshape`, and whether one forward+backward of `flex` runs under
`torch.cuda.set_sync_debug_mode("error")` (the first offending line otherwise). Writes `st_flex.json` and `st_flex.md`
to `--output-dir`. `--dry-run` runs tiny sizes on the CPU (FlexAttention forward only) to check the program.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnzoo.sparse_transformer import SparseTransformerAttention, SparseTransformerConfig
from attnzoo.sparse_transformer.flex_pattern import FLEX_BLOCK_SIZE, flex_pattern_attention, takes_flex

PATTERNS = {
    "strided-split": {"sparse_pattern": "strided", "sparse_head_assignment": "split"},
    "fixed-split": {"sparse_pattern": "fixed", "sparse_head_assignment": "split"},
    "fixed-merged": {"sparse_pattern": "fixed", "sparse_head_assignment": "merged"},
    "strided-merged": {"sparse_pattern": "strided", "sparse_head_assignment": "merged"},  # no Flex path
}


def _attention(pattern: str, heads: int, dim: int, device: torch.device) -> SparseTransformerAttention:
    config = SparseTransformerConfig(
        hidden_size=heads * dim,
        num_attention_heads=heads,
        attention_probs_dropout_prob=0.0,
        num_global_tokens=1,
        **PATTERNS[pattern],
    )
    return SparseTransformerAttention(config).to(device).eval()


def _methods(attention, q, k, v, block_sizes: list[tuple[int, int]]) -> dict[str, Callable[[], torch.Tensor]]:
    def path(backend: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            attention.config.attention_backend = backend
            out = attention.with_global_rows(attention.attend(q, k, v, None), q, k, v, None)
            return attention.head_split_output(out)  # the global rows spliced in

        return run

    def flex(block: tuple[int, int]) -> Callable[[], torch.Tensor]:
        return lambda: flex_pattern_attention(
            q, k, v, None, attention.head_kinds, attention.spec, attention.scaling, block
        )

    cuda = q.device.type == "cuda"
    methods = {"dense": lambda: F.scaled_dot_product_attention(q, k, v)}
    if takes_flex(attention.head_kinds):
        # On CUDA the layer's own path (the dispatch takes FlexAttention there); the dry run calls it directly.
        methods["flex"] = path("fast") if cuda else flex(FLEX_BLOCK_SIZE)
        for block in block_sizes:
            if block != FLEX_BLOCK_SIZE:
                methods[f"flex {block[0]}x{block[1]}"] = flex(block)
    methods["reshape"] = path("triton" if cuda else "fast")  # the CPU's fast path is the same reshapes
    return methods


class _Clock:
    """Milliseconds of a callable: CUDA events on a GPU, the wall clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> float:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end)


def _first_line(err: BaseException) -> str:
    """The exception and the innermost frame of attnzoo (or the last one) it came from."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if "attnzoo" in f.filename or "/models/" in f.filename] or frames[-1:]
    where = f" at {ours[-1].filename}:{ours[-1].lineno} ({ours[-1].line})" if ours else ""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{where}"


def bench_one(pattern: str, length: int, args, device: torch.device) -> list[dict[str, Any]]:
    """Rows of one pattern at one length."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    attention = _attention(pattern, args.heads, args.dim, device)
    q, k, v = (torch.randn(1, args.heads, length, args.dim, device=device, dtype=dtype) for _ in range(3))
    grad = torch.randn_like(q)
    methods = _methods(attention, q, k, v, args.block_sizes)
    clock = _Clock(device)
    rows: dict[str, dict[str, Any]] = {
        name: {"pattern": pattern, "length": length, "method": name} for name in methods
    }
    outputs: dict[str, torch.Tensor] = {}
    runners: dict[str, dict[str, Callable[[], Any]]] = {}
    for name, fn in methods.items():
        row = rows[name]
        # FlexAttention has no CPU backward: the dry run times its forward only.
        train = device.type == "cuda" or not name.startswith("flex")

        def fwd_bwd(fn=fn) -> None:
            for x in (q, k, v):
                x.requires_grad_(True)
            try:
                out = fn()
                torch.autograd.grad(out, (q, k, v), grad)
            finally:
                for x in (q, k, v):
                    x.requires_grad_(False)

        def forward(fn=fn) -> torch.Tensor:
            with torch.no_grad():
                return fn()

        try:
            row["first_call_s"] = clock(fwd_bwd if train else forward) / 1e3  # compiles Flex's kernels
            outputs[name] = forward()
            runners[name] = {"forward": forward, **({"forward+backward": fwd_bwd} if train else {})}
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                (fwd_bwd if train else forward)()
                row["peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        except Exception as err:  # an out-of-memory or a compile failure is a result, not the end of the run
            row["error"] = _first_line(err)
    times: dict[tuple[str, str], list[float]] = {}
    names = list(runners)
    for r in range(args.rounds):  # interleaved, so that a slow moment of the device is shared
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for mode, run in runners[name].items():
                times.setdefault((name, mode), []).append(clock(run))
    for (name, mode), ts in times.items():
        rows[name][f"{mode}_ms"] = statistics.median(ts)
    for row in rows.values():
        for mode in ("forward", "forward+backward"):
            if f"{mode}_ms" in row and f"{mode}_ms" in rows["dense"]:
                row[f"{mode}_x_dense"] = row[f"{mode}_ms"] / rows["dense"][f"{mode}_ms"]
    if "flex" in outputs and "reshape" in outputs:
        rows["flex"]["max_abs_diff_vs_reshape"] = float(
            (outputs["flex"].float() - outputs["reshape"].float()).abs().max()
        )
    if "flex" in runners and device.type == "cuda":
        rows["flex"]["sync_free"] = _sync_check(runners["flex"]["forward+backward"])
    return list(rows.values())


def _sync_check(run: Callable[[], Any]) -> str:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
        return "yes"
    except RuntimeError as err:
        return "no: " + _first_line(err)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Sparse Transformer fast paths, attention alone ({result['device']}, torch {result['torch']})",
        "",
        f"B = 1, {result['heads']} heads, d = {result['dim']}, {result['dtype']}, stride 64, one global token; "
        f"median of {result['rounds']} rounds. `× dense` is the ratio to SDPA without a mask in the same run.",
        "",
        "| pattern | N | method | forward ms | fwd+bwd ms | fwd+bwd × dense | peak MB | first call s | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else "–"

    for row in result["rows"]:
        note = row.get("error", "")
        if "max_abs_diff_vs_reshape" in row:
            note += f"largest difference flex vs reshape {row['max_abs_diff_vs_reshape']:.3g}"
        if "sync_free" in row:
            note += f"; sync-free: {row['sync_free']}"
        lines.append(
            f"| {row['pattern']} | {row['length']} | {row['method']} | {cell(row, 'forward_ms', '.2f')} | "
            f"{cell(row, 'forward+backward_ms', '.2f')} | {cell(row, 'forward+backward_x_dense', '.3f')} | "
            f"{cell(row, 'peak_mb', '.0f')} | {cell(row, 'first_call_s', '.1f')} | {note} |"
        )
    return "\n".join(lines) + "\n"


def _block(text: str) -> tuple[int, int]:
    rows, _, cols = text.partition("x")
    return int(rows), int(cols or rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--patterns", nargs="+", default=["strided-split", "fixed-split"], choices=sorted(PATTERNS))
    parser.add_argument("--block-sizes", type=_block, nargs="+", default=[FLEX_BLOCK_SIZE], help="e.g. 128x64")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, to check the program")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    if args.dry_run:
        args.lengths, args.heads, args.dim, args.rounds = [192], 2, 8, 1
    elif device.type != "cuda":
        parser.error("needs a CUDA device (or --dry-run)")
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "heads": args.heads,
        "dim": args.dim,
        "dtype": "bf16" if device.type == "cuda" else "fp32",
        "rounds": args.rounds,
        "rows": [],
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for pattern in args.patterns:
        for length in args.lengths:
            result["rows"] += bench_one(pattern, length, args, device)
            # Written after every length, so that a run cut short keeps what it measured.
            (args.output_dir / "st_flex.json").write_text(json.dumps(result, indent=2) + "\n")
            (args.output_dir / "st_flex.md").write_text(_markdown(result))
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()

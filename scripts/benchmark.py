"""Benchmark every attnzoo family against our dense family, the floor, and transformers' BERT, BigBird, Longformer
and ModernBERT.

Measures forward and forward+backward time and peak memory versus sequence length, for the whole small encoder and
for one encoder layer, all models at identical width, depth and heads in one run, and writes `benchmark.json`,
`benchmark.md` (with the crossover length of every row) and `benchmark.png`. The floor row, `null_attention`, is the
dense family with an attention that returns its values: no attention can go under it. The measuring code is
`attnzoo.benchmarking` (methodology in its docstring).

Examples:
    # the real run (quiet machine): all registered families + HF baselines, CPU, 1 thread, peak memory, 2 runs
    python scripts/benchmark.py --memory --runs 2 --extra-lengths 8192 16384 --output-dir results/bench-cpu
    # GPU, bf16
    python scripts/benchmark.py --device cuda --dtype bf16 --lengths 1024 4096 16384 --output-dir results/bench-gpu
    # a quick look while developing
    python scripts/benchmark.py --families dense_transformer sbm --no-hf-baselines --lengths 256 --rounds 1 \
        --level model
    # the CPU proxies of GPU speed and memory per encoder layer (issue 49; the CUDA code path under Triton's
    # interpreter, which this sets up on a machine without CUDA), written to proxies.{json,md}
    python scripts/benchmark.py --proxies --output-dir results/proxies
    # the same for training with the configs' default attention dropout
    python scripts/benchmark.py --proxies --proxy-attention-dropout 0.1 --output-dir results/proxies-dropout
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from attnzoo.benchmarking import (  # noqa: E402  (environment first)
    DEFAULT_HF_BASELINES,
    HF_BASELINES,
    MAX_DEFAULT_CHECK_LENGTH,
    PROXY_LENGTH,
    PROXY_ROWS,
    BenchmarkSettings,
    ModelSize,
    markdown_report,
    proxies_markdown,
    run_benchmark,
    run_proxies,
    write_proxies,
    write_reports,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", help="families to run (default: every registered one)")
    parser.add_argument(
        "--hf-baselines",
        nargs="+",
        choices=HF_BASELINES,
        default=list(DEFAULT_HF_BASELINES),
        help="transformers models to compare with (same size)",
    )
    parser.add_argument("--no-hf-baselines", action="store_true", help="skip the transformers models")
    parser.add_argument(
        "--rows",
        nargs="+",
        help="keep only these rows, e.g. dense sbm:fastrg-2%% (default: every row of the families)",
    )
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    parser.add_argument(
        "--extra-lengths", nargs="+", type=int, default=[], help="longer lengths, zoo families and the floor only"
    )
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--rounds", type=int, help="timed interleaved rounds (default: CPU 7, CUDA 20)")
    parser.add_argument("--warmup", type=int, help="untimed warm-up steps per model (default: CPU 1, CUDA 10)")
    parser.add_argument("--runs", type=int, default=1, help="repeat the timing sweep in this many fresh processes")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (recorded)")
    parser.add_argument("--cpu-affinity", nargs="+", type=int, help="pin the process to these CPU cores")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--level", choices=["model", "layer", "both"], default="both")
    parser.add_argument("--memory", action="store_true", help="CPU peak memory, one fresh subprocess per model and N")
    parser.add_argument("--memory-lengths", nargs="+", type=int, help="lengths for --memory (default: all)")
    parser.add_argument("--memory-jobs", type=int, default=1, help="memory subprocesses run at the same time")
    parser.add_argument(
        "--max-seconds-per-step",
        type=float,
        default=30.0,
        help="skip longer lengths of a model once one step exceeds this (0 = never)",
    )
    parser.add_argument("--no-equivalence-check", action="store_true", help="skip the fast-vs-reference check")
    parser.add_argument(
        "--check-length",
        type=int,
        help=f"length of the equivalence check (default: the shortest length, at most {MAX_DEFAULT_CHECK_LENGTH})",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=ModelSize.vocab_size)
    parser.add_argument("--hidden-size", type=int, default=ModelSize.hidden_size)
    parser.add_argument("--num-layers", type=int, default=ModelSize.num_hidden_layers)
    parser.add_argument("--num-heads", type=int, default=ModelSize.num_attention_heads)
    parser.add_argument("--intermediate-size", type=int, default=ModelSize.intermediate_size)
    parser.add_argument(
        "--proxies",
        action="store_true",
        help=f"instead of timing: the CPU proxies of GPU speed and memory per encoder layer of --rows (default: "
        f"{' '.join(PROXY_ROWS).replace('%', '%%')}) at --proxy-length",  # argparse formats % in help
    )
    parser.add_argument("--proxy-length", type=int, default=PROXY_LENGTH, help="sequence length of the proxies")
    parser.add_argument(
        "--proxy-attention-dropout",
        type=float,
        default=0.0,
        help="the proxies' rows in training with this attention dropout (the configs' default is 0.1; dense: none)",
    )
    parser.add_argument("--output-dir", default="benchmark_results")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> BenchmarkSettings:
    return BenchmarkSettings(
        families=args.families,
        hf_baselines=[] if args.no_hf_baselines else args.hf_baselines,
        rows=args.rows,
        lengths=args.lengths,
        extra_lengths=args.extra_lengths,
        batch_size=args.batch_size,
        rounds=args.rounds,
        warmup=args.warmup,
        threads=args.threads,
        device=args.device,
        dtype=args.dtype,
        levels=["model", "layer"] if args.level == "both" else [args.level],
        memory=args.memory,
        memory_lengths=args.memory_lengths,
        memory_jobs=args.memory_jobs,
        max_seconds_per_step=args.max_seconds_per_step or None,
        runs=args.runs,
        check_equivalence=not args.no_equivalence_check,
        check_length=args.check_length,
        seed=args.seed,
        cpu_affinity=args.cpu_affinity,
        size=ModelSize(
            vocab_size=args.vocab_size,
            hidden_size=args.hidden_size,
            num_hidden_layers=args.num_layers,
            num_attention_heads=args.num_heads,
            intermediate_size=args.intermediate_size,
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.proxies:
        return main_proxies(args)
    settings = settings_from_args(args)
    report = run_benchmark(settings, log=(lambda message: None) if args.quiet else print)
    paths = write_reports(report, args.output_dir)
    print(markdown_report(report))
    print("wrote " + ", ".join(str(path) for path in paths.values() if path is not None))
    return 0


def main_proxies(args: argparse.Namespace) -> int:
    """`--proxies`: measure, print and write the proxies (on CUDA when asked, else the CUDA path on the CPU)."""
    import torch

    if args.device == "cpu":
        # The Triton kernels are built for the interpreter when first imported: nothing has imported them yet.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        torch.set_num_threads(args.threads)
    report = run_proxies(
        tuple(args.rows or PROXY_ROWS),
        args.proxy_length,
        device=args.device,
        log=(lambda m: None) if args.quiet else print,
        attention_dropout=args.proxy_attention_dropout,
    )
    paths = write_proxies(report, args.output_dir)
    print(proxies_markdown(report))
    print("wrote " + ", ".join(str(path) for path in paths.values()))
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The attnzoo showcase on a laptop CPU, on bundled real data, in a few minutes:

1. train a WordPiece tokenizer and a tiny dense masked-LM on bundled WikiText for about a minute
   (`scripts/run_mlm.py`), then show fill-mask predictions through `transformers.pipeline("fill-mask")`;
2. fine-tune a tiny model of every registered family (`attnzoo.FAMILIES`) on bundled SST-2 with identical data,
   tokenizer and optimiser, and print one table side by side: dev accuracy, training time and peak memory.

The table is written as `results.md` and `results.json` with a plot `results.png` to `--output_dir`
(default `outputs/demo/`).

```bash
python scripts/demo.py                      # everything: a 60 s MLM, then 100 SST-2 steps per family
python scripts/demo.py --families dense_transformer,sbm --sst2_steps 600 --mlm_seconds 30
```
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
# The SST-2 fine-tune of the test suite reads the bundled data of this checkout.
sys.path.insert(0, str(REPO_ROOT / "tests"))

import attnzoo  # noqa: E402  (registers every family)
from attnzoo.tokenization import iter_texts_from_files, train_wordpiece_tokenizer  # noqa: E402
from attnzoo.training import TimeLimitCallback  # noqa: E402
from source_checkout import train_and_eval_sst2  # noqa: E402

DATA = REPO_ROOT / "tests" / "fixtures" / "data"
FILL_MASK_SENTENCES = (
    "The river flows through the [MASK] of the city .",
    "He was the first [MASK] of the club .",
    "The album was released in [MASK] .",
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--output_dir", default="outputs/demo", help="Where results and models go (outputs/demo).")
    parser.add_argument("--families", default=None, help="Comma-separated family names (default: every family).")
    parser.add_argument("--mlm_seconds", type=float, default=60.0, help="MLM training time budget (default: 60 s).")
    parser.add_argument("--mlm_steps", type=int, default=2000, help="At most this many MLM steps (default: 2000).")
    parser.add_argument("--sst2_steps", type=int, default=300, help="SST-2 fine-tuning steps per family (300).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of every run (default: 0).")
    parser.add_argument("--skip_mlm", action="store_true", help="Skip part 1 (tokenizer + MLM + fill-mask).")
    args = parser.parse_args(argv)
    for name in ("mlm_steps", "sst2_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer.")
    if args.mlm_seconds <= 0:
        parser.error("--mlm_seconds must be positive.")
    return args


def _run_mlm_module() -> Any:
    spec = importlib.util.spec_from_file_location("attnzoo_run_mlm", Path(__file__).with_name("run_mlm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def part_mlm(out: Path, steps: int, seconds: float, seed: int) -> dict[str, Any]:
    """Tokenizer + tiny dense MLM on WikiText for a time budget, then fill-mask predictions."""
    from transformers import pipeline

    print("\n== 1. Tokenizer and a tiny dense masked-LM on bundled WikiText ==", flush=True)
    start = time.perf_counter()
    tokenizer = train_wordpiece_tokenizer(
        iter_texts_from_files(DATA / "text" / "wikitext_train.txt"), vocab_size=4000, model_max_length=512
    )
    tokenizer_dir = out / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)
    print(f"tokenizer: {len(tokenizer)} tokens in {time.perf_counter() - start:.1f}s -> {tokenizer_dir}")
    mlm_dir = out / "mlm"
    if mlm_dir.exists():
        shutil.rmtree(mlm_dir)  # the demo's own folder from an earlier run
    argv = [
        "--config_path", str(REPO_ROOT / "configs" / "models" / "dense_transformer" / "tiny.json"),
        "--tokenizer_name_or_path", str(tokenizer_dir),
        "--train_file", str(DATA / "text" / "wikitext_train.txt"),
        "--validation_file", str(DATA / "text" / "wikitext_valid.txt"),
        "--max_seq_length", "128",
        "--per_device_train_batch_size", "16",
        "--per_device_eval_batch_size", "32",
        "--learning_rate", "1e-3",
        "--lr_scheduler_type", "constant_with_warmup",
        "--warmup_steps", "20",
        "--weight_decay", "0.01",
        "--max_steps", str(steps),
        "--logging_steps", "10",
        "--save_strategy", "no",
        "--max_eval_samples", "64",
        "--seed", str(seed),
        "--use_cpu",
        "--log_level", "warning",
        "--output_dir", str(mlm_dir),
    ]  # fmt: skip
    # A time budget rather than a step count: about a minute on any machine.
    result = _run_mlm_module().main(argv, callbacks=[TimeLimitCallback(seconds)])
    metrics = result["metrics"]
    print(
        f"MLM: {result['global_step']} steps in {metrics['train_runtime']:.0f}s, "
        f"eval loss {metrics['eval_loss']:.2f}, masked-token accuracy {metrics['eval_accuracy']:.1%}"
    )
    fill = pipeline("fill-mask", model=str(mlm_dir), tokenizer=str(mlm_dir), device="cpu")
    predictions = {}
    for sentence in FILL_MASK_SENTENCES:
        top = fill(sentence, top_k=5)
        predictions[sentence] = [(p["token_str"], round(float(p["score"]), 4)) for p in top]
        print(f"  {sentence}\n    -> " + ", ".join(f"{t} ({s:.3f})" for t, s in predictions[sentence]))
    return {"mlm_metrics": metrics, "fill_mask": predictions}


class PeakRSS:
    """Peak resident memory growth of this process while the block runs (Linux: sampled from /proc every 5 ms)."""

    def __init__(self) -> None:
        self.peak_mb = float("nan")
        self._stop = threading.Event()

    @staticmethod
    def _rss_mb() -> float | None:
        try:
            with open("/proc/self/statm") as handle:
                return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except OSError:
            return None

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._peak = max(self._peak, self._rss_mb() or 0.0)

    def __enter__(self) -> PeakRSS:
        gc.collect()
        # Give freed heap back to the system so one family's leftovers do not hide the next one's peak (glibc only).
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        self._base = self._rss_mb()
        self._peak = self._base or 0.0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        if self._base is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._base is not None:
            self._thread.join()
            self.peak_mb = self._peak - self._base


def part_families(families: list[str], steps: int, seed: int) -> list[dict[str, Any]]:
    """Fine-tune a tiny model of each family on SST-2 (same data, tokenizer, optimiser, seed)."""
    print(f"\n== 2. Tiny models of {len(families)} families fine-tuned on bundled SST-2 ({steps} steps each) ==")
    rows = []
    for name in families:
        print(f"  {name} ...", end="", flush=True)
        with PeakRSS() as memory:
            try:
                result = train_and_eval_sst2(name, steps=steps, seed=seed)
                error = None
            except Exception as err:  # one broken family must not hide the others' results
                result, error = {}, f"{type(err).__name__}: {err}"
        row = {
            "family": name,
            "accuracy": result.get("accuracy"),
            "train_seconds": result.get("train_seconds"),
            "peak_memory_mb": memory.peak_mb,
            "error": error,
        }
        rows.append(row)
        print(" failed: " + error if error else f" accuracy {row['accuracy']:.1%} in {row['train_seconds']:.1f}s")
    return rows


def format_table(rows: list[dict[str, Any]], steps: int) -> str:
    dense = next((r for r in rows if r["family"] == "dense_transformer" and r["accuracy"] is not None), None)
    lines = [
        f"| family | SST-2 dev accuracy | vs dense | training time ({steps} steps) | peak memory growth |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['family']} | failed: {r['error'][:60]} | | | |")
            continue
        delta = f"{100 * (r['accuracy'] - dense['accuracy']):+.1f} pts" if dense else "n/a"
        memory = f"{r['peak_memory_mb']:.0f} MB" if r["peak_memory_mb"] == r["peak_memory_mb"] else "n/a"
        lines.append(
            f"| {r['family']} | {100 * r['accuracy']:.1f}% | {delta} | {r['train_seconds']:.1f} s | {memory} |"
        )
    return "\n".join(lines)


def plot_results(rows: list[dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot; pip install 'attnzoo[plots]')")
        return None
    ok = [r for r in rows if not r["error"]]
    if not ok:
        return None
    names = [r["family"] for r in ok]
    panels = (
        ("SST-2 dev accuracy (%)", [100 * r["accuracy"] for r in ok]),
        ("training time (s)", [r["train_seconds"] for r in ok]),
        ("peak memory growth (MB)", [r["peak_memory_mb"] for r in ok]),
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (title, values) in zip(axes, panels, strict=True):
        bars = ax.bar(names, values, color=["#888888" if n == "dense_transformer" else "#3b7dd8" for n in names])
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle("attnzoo tiny models on bundled SST-2 (same data, tokenizer, optimiser and seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    registered = sorted(f.name for f in attnzoo.FAMILIES.values())
    families = registered if args.families is None else [n.strip() for n in args.families.split(",") if n.strip()]
    unknown = sorted(set(families) - set(registered))
    if unknown:
        print(f"error: unknown families {unknown}; registered: {registered}", file=sys.stderr)
        return 2
    # Dense first: it is the reference of the comparison.
    families.sort(key=lambda n: (n != "dense_transformer", n))
    start = time.perf_counter()
    summary: dict[str, Any] = {"seed": args.seed}
    if not args.skip_mlm:
        summary.update(part_mlm(out, args.mlm_steps, args.mlm_seconds, args.seed))
    rows = part_families(families, args.sst2_steps, args.seed)
    table = format_table(rows, args.sst2_steps)
    print("\n" + table)
    summary.update(sst2_steps=args.sst2_steps, results=rows, total_seconds=time.perf_counter() - start)
    (out / "results.md").write_text(
        "# attnzoo demo: tiny models on bundled SST-2\n\n"
        f"{args.sst2_steps} fine-tuning steps per family from scratch, batch 32, dev = 800 held-out SST-2 sentences "
        "(not the official dev set). Peak memory is the growth of the process's resident memory during the run.\n\n"
        + table
        + "\n"
    )
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    plot = plot_results(rows, out / "results.png")
    written = ["results.md", "results.json"] + (["results.png"] if plot else [])
    print(f"\nWritten to {out}/: {', '.join(written)} (total {summary['total_seconds']:.0f}s)")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

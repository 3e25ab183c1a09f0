"""Do SBM-Transformer's defaults learn short inputs as well as dense attention? SST-2 phrases at 64 tokens, three
seeds, paired differences against the dense family, and the ablation that names what cost the points.

Protocol: the shared SST-2 training set (67,349 phrases) split once with seed 0 into 63,349 for training and 4,000
held out for validation (never trained or tuned on); a WordPiece tokenizer of 8,000 tokens trained on the training
part; `configs/models/<family>/tiny.json` with width 128 and 4 heads (2 layers, FFN 128); 1,000 steps of batch 32,
AdamW at 5e-4 with 100 warm-up steps and linear decay, gradient clipping at 1.0, length 64; `scripts/run_glue.py`.

    python scripts/experiments/sbm-short-inputs/run.py data --sst2 /work/shared/data/glue/SST-2/train.tsv
    OMP_NUM_THREADS=1 python scripts/experiments/sbm-short-inputs/run.py train --jobs 2     # every row, seeds 0-2
    python scripts/experiments/sbm-short-inputs/run.py table                               # results/ and the table
    OMP_NUM_THREADS=1 python scripts/experiments/sbm-short-inputs/run.py check   # the slow test's protocol, 3 seeds

Runs go to `outputs/sbm-short-inputs/` (a run whose folder holds `metrics.json` is reused); `table` writes
`results/runs.json` (every run: row, seed, overrides, accuracy, gradient norms, code version, command) and
`results/table.md`. The tokenizer every run used is `results/tokenizer/`. `check` runs the regression test's protocol
(`tests/sbm/test_sbm_slow.py`: the bundled SST-2 slice, `train_and_eval_sst2`) for dense, SBM's default and the 0.2
estimator over the three seeds and writes `results/regression_check.jsonl`, the measurements its bound comes from.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attnzoo.evaluation.seeds import PairedDifference

ROOT = Path(__file__).resolve().parents[3]  # scripts/experiments/sbm-short-inputs/run.py: the checkout
WORK = ROOT / "outputs" / "sbm-short-inputs"
RESULTS = Path(__file__).resolve().parent / "results"
HELD_OUT = 4000
SEEDS = (0, 1, 2)
SIZE = {"hidden_size": 128, "num_attention_heads": 4}
BUDGET = [
    "--max_seq_length", "64", "--max_steps", "1000", "--per_device_train_batch_size", "32",
    "--learning_rate", "5e-4", "--warmup_steps", "100", "--logging_steps", "100", "--eval_strategy", "no",
    "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--per_device_eval_batch_size", "128",
]  # fmt: skip
#: Row name -> (family, config overrides). The `0.2` rows are the defaults SBM had before its unsampled pairs'
#: gradient was bounded (`ste_unsampled_gradient="derivative"`), each with one of that release's changes undone.
ROWS: dict[str, tuple[str, dict]] = {
    "dense": ("dense_transformer", {}),
    "sbm (default)": ("sbm", {}),
    "sbm 0.2 defaults": ("sbm", {"ste_unsampled_gradient": "derivative"}),
    "sbm 0.2, sampled pairs' STE only": ("sbm", {"ste_all_pairs": False}),
    "sbm 0.2, no global token": ("sbm", {"ste_unsampled_gradient": "derivative", "num_global_tokens": 0}),
    "sbm 0.2, first-token pooling": ("sbm", {"ste_unsampled_gradient": "derivative", "classifier_pooling": "cls"}),
    "sbm 0.1 defaults": ("sbm", {"ste_all_pairs": False, "num_global_tokens": 0, "classifier_pooling": "cls"}),
}
BASELINE = "dense"
#: Rows of `check`: the regression test's protocol on the bundled SST-2 slice.
CHECK_ROWS = ("dense", "sbm (default)", "sbm 0.2 defaults")


def slug(row: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in row).strip("-").replace("--", "-")


def data(sst2: Path, retrain_tokenizer: bool) -> None:
    """Split the shared SST-2 training file (seed 0) and copy the committed tokenizer (or train one on the training
    part: WordPiece training is not deterministic here, two trainings on the same file number 297 of the 8,000
    tokens differently, so every committed run used the one in `results/tokenizer/`)."""
    lines = sst2.read_text(encoding="utf-8").splitlines()
    header, body = lines[0], lines[1:]
    order = list(range(len(body)))
    random.Random(0).shuffle(order)
    held_out = set(order[:HELD_OUT])
    WORK.mkdir(parents=True, exist_ok=True)
    for name, keep in (("train", lambda i: i not in held_out), ("validation", lambda i: i in held_out)):
        rows = [line for i, line in enumerate(body) if keep(i)]
        (WORK / f"{name}.tsv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    if not retrain_tokenizer:
        shutil.copytree(RESULTS / "tokenizer", WORK / "tokenizer", dirs_exist_ok=True)
        return
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_tokenizer.py"), "--files", str(WORK / "train.tsv"),
         "--text_column", "sentence", "--vocab_size", "8000", "--output_dir", str(WORK / "tokenizer")],
        check=True,
    )  # fmt: skip


def command(row: str, seed: int) -> list[str]:
    family, overrides = ROWS[row]
    fields = ",".join(f"{k}={v}" for k, v in {**SIZE, **overrides}.items())
    return [
        "scripts/run_glue.py", "--task_name", "sst2",
        "--config_path", f"configs/models/{family}/tiny.json", "--config_overrides", fields,
        "--tokenizer_name_or_path", str(WORK.relative_to(ROOT) / "tokenizer"),
        "--train_file", str(WORK.relative_to(ROOT) / "train.tsv"),
        "--validation_file", str(WORK.relative_to(ROOT) / "validation.tsv"), *BUDGET, "--seed", str(seed),
        "--output_dir", str(WORK.relative_to(ROOT) / "runs" / f"{slug(row)}-s{seed}"),
    ]  # fmt: skip


def train_one(row: str, seed: int) -> None:
    output = WORK / "runs" / f"{slug(row)}-s{seed}"
    if (output / "metrics.json").is_file():
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    commit = _commit()  # before the run: the code it runs
    with open(output.with_suffix(".log"), "w", encoding="utf-8") as log:
        run = [sys.executable, *command(row, seed)]
        subprocess.run(run, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    (output / "command.json").write_text(json.dumps({"command": ["python", *command(row, seed)], "commit": commit}))


def _commit() -> str:
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return git.stdout.strip()


def collect() -> list[dict]:
    """Every finished run: accuracy, final training loss, gradient norms before clipping, command and commit."""
    runs = []
    for row in ROWS:
        for seed in SEEDS:
            folder = WORK / "runs" / f"{slug(row)}-s{seed}"
            if not (folder / "metrics.json").is_file():
                continue
            metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))["metrics"]
            history = json.loads((folder / "log_history.json").read_text(encoding="utf-8"))
            provenance = json.loads((folder / "command.json").read_text(encoding="utf-8"))
            runs.append({
                "row": row, "seed": seed, "family": ROWS[row][0], "overrides": ROWS[row][1],
                "accuracy": metrics["eval_accuracy"], "validation_loss": metrics["eval_loss"],
                "train_loss": [e["loss"] for e in history if "loss" in e],
                "grad_norm": [e["grad_norm"] for e in history if "grad_norm" in e], **provenance,
            })  # fmt: skip
    return runs


def table(runs: list[dict]) -> str:
    by_row: dict[str, dict[int, dict]] = {}
    for run in runs:
        by_row.setdefault(run["row"], {})[run["seed"]] = run
    baseline = {seed: run["accuracy"] for seed, run in by_row.get(BASELINE, {}).items()}
    lines = [
        "| row | overrides | " + " | ".join(f"seed {s}" for s in SEEDS) + " | mean | Δ vs dense ± SE "
        "| largest gradient norm (median over seeds) |",
        "|---|---|" + "---|" * len(SEEDS) + "---|---|---|",
    ]
    for row, seeds in by_row.items():
        accuracies = [100 * seeds[s]["accuracy"] if s in seeds else None for s in SEEDS]
        present = [a for a in accuracies if a is not None]
        shared = tuple(s for s in SEEDS if s in seeds and s in baseline)
        paired = PairedDifference(shared, tuple(seeds[s]["accuracy"] - baseline[s] for s in shared))
        delta = "–" if row == BASELINE else f"{100 * paired.mean:+.2f} ± {100 * paired.standard_error:.2f}"
        peaks = sorted(max(run["grad_norm"]) for run in seeds.values())
        overrides = ", ".join(f"`{k}={v}`" for k, v in ROWS[row][1].items()) or "–"
        cells = [f"{a:.2f}" if a is not None else "–" for a in accuracies]
        lines.append(
            f"| {row} | {overrides} | " + " | ".join(cells) + f" | {sum(present) / len(present):.2f} | {delta} "
            f"| {peaks[len(peaks) // 2]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def check(seeds: list[int]) -> None:
    """The slow regression test's protocol (its constants, `train_and_eval_sst2`) for `CHECK_ROWS` over `seeds`."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch

    from source_checkout import SST2_SHORT_INPUTS, SST2_WIDTH, train_and_eval_sst2

    torch.set_num_threads(1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    commit = _commit()  # before the runs: the code they run
    with open(RESULTS / "regression_check.jsonl", "w", encoding="utf-8") as out:
        for seed in seeds:
            for row in CHECK_ROWS:
                family, overrides = ROWS[row]
                protocol = {**SST2_SHORT_INPUTS, "seed": seed}
                result = train_and_eval_sst2(family, {**SST2_WIDTH, **overrides}, **protocol)
                record = {"row": row, "overrides": overrides, **protocol, **result, "commit": commit}
                out.write(json.dumps(record) + "\n")
                out.flush()
                print(json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    data_parser = sub.add_parser("data", help="split SST-2 and train the tokenizer")
    data_parser.add_argument("--sst2", type=Path, required=True, help="the shared SST-2 train.tsv")
    data_parser.add_argument("--retrain_tokenizer", action="store_true", help="train a new one (see `data`)")
    train_parser = sub.add_parser("train", help="run the rows (reuses finished runs)")
    train_parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    train_parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    train_parser.add_argument("--jobs", type=int, default=1, help="runs side by side (one thread each)")
    sub.add_parser("table", help="write results/runs.json and results/table.md")
    check_parser = sub.add_parser("check", help="the regression test's protocol over seeds")
    check_parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    args = parser.parse_args(argv)
    if args.step == "data":
        data(args.sst2, args.retrain_tokenizer)
    elif args.step == "train":
        if not (WORK / "tokenizer").is_dir():
            raise SystemExit(f"{WORK / 'tokenizer'} is missing: run the `data` step first.")
        jobs = [(row, seed) for row in args.rows for seed in args.seeds]
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda job: train_one(*job), jobs))
    elif args.step == "check":
        check(args.seeds)
    else:
        runs = collect()
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "runs.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
        markdown = table(runs)
        (RESULTS / "table.md").write_text(markdown, encoding="utf-8")
        print(markdown)


if __name__ == "__main__":
    main()

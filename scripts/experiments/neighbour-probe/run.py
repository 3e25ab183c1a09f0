"""Can a family learn to read a token's neighbours? Masked-LM training curves on a task that needs them.

Self-pretraining on LRA Text (the long-inputs study, `scripts/experiments/long-inputs/README.md`) taught A²-Former the
bytes and left dense attention and the Sparse Transformer at the entropy of byte frequencies. This probe separates
"cannot find the neighbours" from a bug in a family: `--task pairs` is a synthetic sequence of symbol pairs whose
second symbol is a fixed function of the first (a masked symbol is given away by its partner only), and `--hf_bert`
adds transformers' own `BertForMaskedLM` of the same shape as the reference for dense attention. `--task text` trains
on the shipped reviews' bytes instead. Every row uses `attnzoo.evaluation`'s masking and optimizer loop, with the same
seed and batches.

Example:
    python scripts/experiments/neighbour-probe/run.py --task pairs --length 128 --steps 600 --hf_bert \
        --families dense_transformer a2former --output outputs/neighbour-probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM

from attnzoo.evaluation import Budget, ModelSize, RunSpec, TaskData, text_task
from attnzoo.evaluation.runner import masked_batches, model_config, optimize, run_batches
from attnzoo.evaluation.tasks import CLS_ID, FIRST_SYMBOL_ID, PAD_ID, SEP_ID, epoch_stream
from attnzoo.registry import FAMILIES

#: Symbols of the pair task, and its map from a pair's first symbol to its second (7 is invertible modulo 40, so
#: either symbol of a pair gives the other away).
PAIR_SYMBOLS = 40


#: The 2,500 IMDB reviews shipped with the source checkout.
REVIEWS_FILE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "data" / "imdb" / "train_subset_2500.tsv"


def pair_task(length: int, examples: int = 2000, seed: int = 0) -> TaskData:
    """`examples` sequences of `length` symbols in pairs `(a, (7a + 3) mod 40)`, wrapped in `[CLS]` / `[SEP]`."""
    if length < 2 or length % 2:
        raise ValueError(f"The pair task needs an even length >= 2, got {length}.")
    rng = random.Random(seed)
    rows = []
    for _ in range(examples):
        firsts = [rng.randrange(PAIR_SYMBOLS) for _ in range(length // 2)]
        ids = [FIRST_SYMBOL_ID + s for a in firsts for s in (a, (7 * a + 3) % PAIR_SYMBOLS)]
        rows.append(([CLS_ID, *ids, SEP_ID], 0))
    return TaskData("pairs", length + 2, FIRST_SYMBOL_ID + PAIR_SYMBOLS, 2, epoch_stream(rows), [])


def hf_bert(task: TaskData, size: ModelSize) -> torch.nn.Module:
    """transformers' `BertForMaskedLM` with the families' shape (learned positions, post-LN)."""
    config = BertConfig(
        **dataclasses.asdict(size),
        vocab_size=task.vocab_size,
        max_position_embeddings=max(task.length, 512),
        pad_token_id=PAD_ID,
    )
    return BertForMaskedLM(config)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["pairs", "text"], default="pairs")
    parser.add_argument("--length", type=int, default=128, help="symbols (pairs) or bytes (text) per sequence")
    parser.add_argument("--families", nargs="*", choices=sorted(FAMILIES), default=["dense_transformer", "a2former"])
    parser.add_argument("--hf_bert", action="store_true", help="add transformers' BertForMaskedLM of the same shape")
    parser.add_argument(
        "--position_embedding_type", default="sinusoidal", choices=["absolute", "sinusoidal", "rotary"]
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--warmup_steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, help="write the curves as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.task == "pairs":
        task = pair_task(args.length, seed=args.seed)
    else:
        task = text_task(REVIEWS_FILE, args.length + 2, pooling="mean")
    size, budget = (
        ModelSize(),
        Budget(args.steps, args.batch_size, args.learning_rate, args.warmup_steps, seed=args.seed),
    )
    builders = {
        family: lambda family=family: FAMILIES[family].masked_lm_class(
            model_config(
                task, RunSpec(family, task.length, {"position_embedding_type": args.position_embedding_type}), size
            )
        )
        for family in args.families
    }
    if args.hf_bert:
        builders["hf:bert"] = lambda: hf_bert(task, size)
    results = {"task": args.task, "length": args.length, "budget": vars(args) | {"output": None}, "rows": {}}
    for name, build in builders.items():
        torch.manual_seed(args.seed)
        model = build()
        stream = masked_batches(run_batches(task, budget), task.vocab_size, budget.mlm_probability, args.seed, "cpu")
        curve = optimize(model, stream, args.steps, budget, name, log_every=50)["curve"]
        results["rows"][name] = curve
        print(f"{name:20s} masked-LM loss {curve[0]['loss']:.2f} -> {curve[-1]['loss']:.2f} nats", flush=True)
    if args.task == "pairs":
        print(
            f"(a symbol read alone: ln {PAIR_SYMBOLS} = {math.log(PAIR_SYMBOLS):.2f} nats; from its partner: about 0)"
        )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return results


if __name__ == "__main__":
    main()

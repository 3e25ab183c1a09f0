#!/usr/bin/env python
"""Draw which keys every query of an attnzoo model attends to (the pattern figures of the sparse-attention papers).

Builds the model of any registered family from a config file (or loads a checkpoint), runs its encoder on one input
with `output_attentions=True` and draws, for every head of the chosen layers, the `(query, key)` pairs whose attention
probability is nonzero. Fixed patterns (Sparse Transformer) come out the same for any input; learned or sampled
structures (Smart Bird, A²-Former, FSAT, SBM) depend on the input, the weights and, in `--train_mode`, the RNG.

Examples:

```bash
# Sparse Transformer, strided pattern with split heads, 128 tokens
python scripts/tools/plot_attention_pattern.py --config_path configs/models/sparse_transformer/tiny.json \
    --length 128 --output_file out/patterns/sparse_transformer.png

# fixed pattern, merged heads, stride 16, summary 4, with 20 padding tokens at the end
python scripts/tools/plot_attention_pattern.py --config_path configs/models/sparse_transformer/tiny.json \
    --config_overrides '{"sparse_pattern": "fixed", "sparse_head_assignment": "merged", "sparse_stride": 16, \
    "sparse_summary_size": 4}' --length 128 --num_padding 20 --output_file out/patterns/fixed.png

# a trained checkpoint on real text
python scripts/tools/plot_attention_pattern.py --model_name_or_path out/sst2 --text "a gripping , funny film" \
    --layers 0 1 --output_file out/patterns/sst2.png
```
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser

from attnzoo.inspection import InspectionArguments, build_model, make_inputs

logger = logging.getLogger(__name__)


@dataclass
class PatternArguments(InspectionArguments):
    """What to draw. Give exactly one of `config_path` (random weights) and `model_name_or_path` (a checkpoint)."""

    output_file: str = field(default="attention_pattern.png", metadata={"help": "image to write (png, pdf, svg)"})
    seed: int = field(default=0, metadata={"help": "seed of the random weights, tokens and training-mode sampling"})
    num_padding: int = field(default=0, metadata={"help": "padding tokens appended (masked) to show padding"})
    layers: list[int] = field(default_factory=lambda: [0], metadata={"help": "encoder layers to draw"})
    heads: list[int] | None = field(default=None, metadata={"help": "heads to draw (default: all)"})
    train_mode: bool = field(
        default=False, metadata={"help": "run in training mode (sampling methods draw from the RNG; dropout is off)"}
    )
    save_masks: bool = field(default=False, metadata={"help": "also save the boolean patterns as <output_file>.pt"})


def pad_inputs(inputs: dict[str, torch.Tensor], num_padding: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Append `num_padding` masked padding tokens."""
    if not num_padding:
        return inputs
    input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
    pad = torch.full((1, num_padding), pad_token_id, dtype=input_ids.dtype)
    return {
        "input_ids": torch.cat([input_ids, pad], dim=1),
        "attention_mask": torch.cat([attention_mask, torch.zeros_like(pad)], dim=1),
    }


def attention_patterns(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Per layer, the `(H, N, N)` boolean pattern: True where the query gave the key a nonzero probability."""
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    if out.attentions is None or any(a is None for a in out.attentions):
        raise ValueError(f"{type(model).__name__} did not return attention weights.")
    return [weights[0] != 0 for weights in out.attentions]


def plot_patterns(patterns: list[torch.Tensor], layers: list[int], heads: list[int], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = len(layers), len(heads)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.4 * rows + 0.4), squeeze=False)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            mask = patterns[layer][head]
            ax = axes[r][c]
            ax.imshow(mask.numpy(), cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
            ax.set_title(f"layer {layer}, head {head}: {mask.float().mean().item():.1%}", fontsize=9)
            ax.set_xlabel("key j", fontsize=8)
            ax.set_ylabel("query i", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    parser = HfArgumentParser(PatternArguments)
    (args,) = parser.parse_args_into_dataclasses(sys.argv[1:] if argv is None else argv)
    model = build_model(args, attention_probs_dropout_prob=0.0).train(args.train_mode)
    inputs = pad_inputs(make_inputs(args, model.config), args.num_padding, model.config.pad_token_id)
    patterns = attention_patterns(model, inputs)
    heads = args.heads if args.heads is not None else list(range(model.config.num_attention_heads))
    for layer in args.layers:
        if not 0 <= layer < len(patterns):
            raise ValueError(f"--layers must be in [0, {len(patterns)}), got {layer}.")
    for head in heads:
        if not 0 <= head < model.config.num_attention_heads:
            raise ValueError(f"--heads must be in [0, {model.config.num_attention_heads}), got {head}.")
    length, padding = inputs["input_ids"].shape[1], args.num_padding
    title = f"{model.config.model_type}: keys used by each query (black), N = {length}" + (
        f" incl. {padding} padding" if padding else ""
    )
    path = Path(args.output_file)
    plot_patterns(patterns, args.layers, heads, title, path)
    if args.save_masks:
        torch.save({layer: patterns[layer] for layer in args.layers}, path.with_suffix(".pt"))
    logger.info("wrote %s", path)
    return path


if __name__ == "__main__":
    main()

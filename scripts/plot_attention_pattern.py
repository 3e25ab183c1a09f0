#!/usr/bin/env python
"""Draw which keys every query of an attnzoo model attends to (the pattern figures of the sparse-attention papers).

Builds the model of any registered family from a config file (or loads a checkpoint), runs its encoder on one input
with `output_attentions=True` and draws, for every head of the chosen layers, the `(query, key)` pairs whose attention
probability is nonzero. Fixed patterns (Sparse Transformer) come out the same for any input; learned or sampled
structures (Smart Bird, A²-Former, FSAT, SBM) depend on the input, the weights and, in `--train_mode`, the RNG.

Examples:

```bash
# Sparse Transformer, strided pattern with split heads, 128 tokens
python scripts/plot_attention_pattern.py --config_path configs/models/sparse_transformer/tiny.json \
    --length 128 --output_file out/patterns/sparse_transformer.png

# fixed pattern, merged heads, stride 16, summary 4, with 20 padding tokens at the end
python scripts/plot_attention_pattern.py --config_path configs/models/sparse_transformer/tiny.json \
    --config_overrides '{"sparse_pattern": "fixed", "sparse_head_assignment": "merged", "sparse_stride": 16, \
    "sparse_summary_size": 4}' --length 128 --num_padding 20 --output_file out/patterns/fixed.png

# a trained checkpoint on real text
python scripts/plot_attention_pattern.py --model_name_or_path out/sst2 --text "a gripping , funny film" \
    --layers 0 1 --output_file out/patterns/sst2.png
```
"""

from __future__ import annotations

import importlib
import json
import logging
import pkgutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, HfArgumentParser

import attnzoo

logger = logging.getLogger(__name__)


@dataclass
class PatternArguments:
    """What to draw. Give exactly one of `config_path` (random weights) and `model_name_or_path` (a checkpoint)."""

    config_path: str | None = field(
        default=None, metadata={"help": "config.json of any attnzoo family, e.g. configs/models/<method>/tiny.json"}
    )
    model_name_or_path: str | None = field(default=None, metadata={"help": "checkpoint folder (weights and config)"})
    config_overrides: str | None = field(
        default=None, metadata={"help": "JSON object of config fields to override, e.g. '{\"sparse_stride\": 16}'"}
    )
    output_file: str = field(default="attention_pattern.png", metadata={"help": "image to write (png, pdf, svg)"})
    length: int = field(default=128, metadata={"help": "number of random tokens when no --text is given"})
    text: str | None = field(default=None, metadata={"help": "text to encode instead of random tokens"})
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "tokenizer for --text (defaults to --model_name_or_path)"}
    )
    num_padding: int = field(default=0, metadata={"help": "padding tokens appended (masked) to show padding"})
    layers: list[int] = field(default_factory=lambda: [0], metadata={"help": "encoder layers to draw"})
    heads: list[int] | None = field(default=None, metadata={"help": "heads to draw (default: all)"})
    train_mode: bool = field(
        default=False, metadata={"help": "run in training mode (sampling methods draw from the RNG; dropout is off)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the random weights, tokens and training-mode sampling"})
    save_masks: bool = field(default=False, metadata={"help": "also save the boolean patterns as <output_file>.pt"})


def import_families() -> None:
    """Import every method package of attnzoo so families not yet wired into `attnzoo/__init__` register too."""
    for module in pkgutil.iter_modules(attnzoo.__path__):
        if module.ispkg and module.name not in ("core", "kernels"):
            try:
                importlib.import_module(f"attnzoo.{module.name}")
            except ImportError as err:  # a package under development must not stop the others
                logger.warning("skipping attnzoo.%s: %s", module.name, err)


def build_model(args: PatternArguments) -> torch.nn.Module:
    if (args.config_path is None) == (args.model_name_or_path is None):
        raise ValueError("Give exactly one of --config_path and --model_name_or_path.")
    overrides = json.loads(args.config_overrides) if args.config_overrides else {}
    overrides["attention_probs_dropout_prob"] = 0.0
    torch.manual_seed(args.seed)
    if args.config_path is not None:
        config = AutoConfig.from_pretrained(args.config_path, **overrides)
        model = AutoModel.from_config(config)
    else:
        model = AutoModel.from_pretrained(args.model_name_or_path, **overrides)
    return model.train(args.train_mode)


def make_inputs(args: PatternArguments, config) -> dict[str, torch.Tensor]:
    if args.text is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name_or_path or args.model_name_or_path)
        input_ids = tokenizer(args.text, return_tensors="pt")["input_ids"]
    else:
        generator = torch.Generator().manual_seed(args.seed)
        # Ids from 5 upwards avoid the special tokens of the zoo's WordPiece vocabularies.
        input_ids = torch.randint(5, config.vocab_size, (1, args.length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if args.num_padding:
        pad = torch.full((1, args.num_padding), config.pad_token_id, dtype=input_ids.dtype)
        input_ids = torch.cat([input_ids, pad], dim=1)
        attention_mask = torch.cat([attention_mask, torch.zeros_like(pad)], dim=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


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
    import_families()
    model = build_model(args)
    inputs = make_inputs(args, model.config)
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

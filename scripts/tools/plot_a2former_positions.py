#!/usr/bin/env python
"""Plot where every query's sample points landed in an A²-Former encoder (the paper's Figure 3).

Runs the encoder on one input and records, for each A²-Former attention layer, the bounded fractional positions of
the K points of every query and head. One panel per head: the x axis is the query index, the y axis the key
position of each of its K points (one colour per point); the diagonal marks the query itself. Give a checkpoint to
see learned positions, or a config to see the initial grid (`--perturb` adds random offset weights to show
data-dependent positions without training).

Examples:

```bash
# initial positions of the tiny config, 256 random tokens
python scripts/tools/plot_a2former_positions.py --config_path configs/models/a2former/tiny.json --length 256 \
    --output_file out/a2former_positions.png

# a fine-tuned checkpoint on real text, layers 0 and 1, positions also saved as a tensor file
python scripts/tools/plot_a2former_positions.py --model_name_or_path out/sst2-a2former \
    --text "a gripping , funny and moving film" --layers 0 1 --save_positions --output_file out/positions.png
```
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser

from attnzoo.a2former import A2FormerAttention
from attnzoo.inspection import InspectionArguments, build_model, load_tokenizer, make_inputs

logger = logging.getLogger(__name__)


@dataclass
class PositionArguments(InspectionArguments):
    """What to plot. Give exactly one of `config_path` (random weights) and `model_name_or_path` (a checkpoint)."""

    output_file: str = field(default="a2former_positions.png", metadata={"help": "image to write (png, pdf, svg)"})
    layers: list[int] = field(default_factory=lambda: [0], metadata={"help": "encoder layers to plot"})
    heads: list[int] | None = field(default=None, metadata={"help": "heads to plot (default: all)"})
    perturb: float = field(
        default=0.0, metadata={"help": "std of random offset weights added to show input-dependent positions"}
    )
    save_positions: bool = field(default=False, metadata={"help": "also save the positions as <output_file>.pt"})


def build_a2former(args: PositionArguments) -> torch.nn.Module:
    """The A²-Former encoder in eval mode, its offset weights perturbed by `--perturb`."""
    model = build_model(args)
    if not any(isinstance(m, A2FormerAttention) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} has no A²-Former attention layer.")
    if args.perturb > 0:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, A2FormerAttention):
                    module.offset_weight.normal_(0.0, args.perturb)
    return model


def encode(args: PositionArguments, model: torch.nn.Module) -> tuple[torch.Tensor, list[str] | None]:
    """Input ids `(1, N)` and, for text, the tokens (tick labels)."""
    tokenizer = load_tokenizer(args) if args.text is not None else None
    ids = make_inputs(args, model.config, tokenizer)["input_ids"]
    return ids, tokenizer.convert_ids_to_tokens(ids[0]) if tokenizer is not None else None


@torch.no_grad()
def record_positions(model: torch.nn.Module, input_ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Run the encoder once; layer index -> positions `(H, N, K)` of the first (only) sample."""
    positions: dict[int, torch.Tensor] = {}

    def hook(module: A2FormerAttention, args, kwargs):
        hidden_states = args[0]
        key_valid = args[1] if len(args) > 1 else kwargs.get("key_valid")
        offsets, _ = module.predict_offsets(hidden_states)
        positions[module.layer_idx] = module.sample_positions(offsets, key_valid, hidden_states.shape[1])[0][0]

    handles = [
        m.register_forward_pre_hook(hook, with_kwargs=True)
        for m in model.modules()
        if isinstance(m, A2FormerAttention) and not m.is_causal
    ]
    try:
        model(input_ids=input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return positions


def plot(positions: dict[int, torch.Tensor], args: PositionArguments, tokens: list[str] | None) -> None:
    """One row per layer, one panel per head: query index vs the positions of its K points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [layer for layer in args.layers if layer in positions]
    if not layers:
        raise ValueError(f"--layers {args.layers} not in the model's layers {sorted(positions)}.")
    num_heads = positions[layers[0]].shape[0]
    heads = args.heads if args.heads is not None else list(range(num_heads))
    fig, axes = plt.subplots(
        len(layers), len(heads), figsize=(3.2 * len(heads), 3.2 * len(layers)), squeeze=False, sharex=True
    )
    for row, layer in enumerate(layers):
        pos = positions[layer]  # (H, N, K)
        n, k = pos.shape[1], pos.shape[2]
        queries = torch.arange(n)
        for col, head in enumerate(heads):
            ax = axes[row][col]
            ax.plot([0, n - 1], [0, n - 1], color="0.8", linewidth=0.8)
            for point in range(k):
                ax.scatter(queries, pos[head, :, point], s=3, color=plt.cm.viridis(point / max(k - 1, 1)))
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xlim(-0.5, n - 0.5)
            ax.set_ylim(-0.5, n - 0.5)
            if tokens is not None and n <= 40:
                ax.set_xticks(range(n), tokens, rotation=90, fontsize=6)
                ax.set_yticks(range(n), tokens, fontsize=6)
            if row == len(layers) - 1:
                ax.set_xlabel("query")
            if col == 0:
                ax.set_ylabel("sampled key position")
    fig.suptitle(f"A²-Former sample points (K = {positions[layers[0]].shape[2]} per query and head)")
    fig.tight_layout()
    Path(args.output_file).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output_file, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[int, torch.Tensor]:
    """Parse arguments, record the positions, write the figure (and the tensors); returns the positions."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = HfArgumentParser(PositionArguments)
    (args,) = parser.parse_args_into_dataclasses(args=argv if argv is not None else sys.argv[1:])
    model = build_a2former(args)
    input_ids, tokens = encode(args, model)
    positions = record_positions(model, input_ids)
    plot(positions, args, tokens)
    if args.save_positions:
        torch.save({"positions": positions, "input_ids": input_ids}, f"{args.output_file}.pt")
    logger.info("wrote %s", args.output_file)
    return positions


if __name__ == "__main__":
    main()

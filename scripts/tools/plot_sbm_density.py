#!/usr/bin/env python
"""Plot the mask density of every SBM attention layer and head (the paper's Figure 5 style).

Runs an SBM-Transformer encoder on an input and plots the fraction of (query, key) pairs each head attended to, as a
layers × heads heatmap, next to a bar chart of the per-layer mean. With `--trainer_state` it also plots the density
logged during training by `SBMDensityCallback` (`trainer_state.json` of a Trainer output folder) against the step.

Examples:

```bash
# initial densities of the tiny config on 512 random tokens (about 25% everywhere)
python scripts/tools/plot_sbm_density.py --config_path configs/models/sbm/tiny.json --length 512 \
    --output_file out/sbm_density.png

# a fine-tuned checkpoint on real text, plus the densities logged during its training
python scripts/tools/plot_sbm_density.py --model_name_or_path out/sst2-sbm \
    --text "a gripping , funny and moving film" \
    --trainer_state out/sst2-sbm/trainer_state.json --output_file out/sbm_density.png
```
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser

from attnzoo.inspection import InspectionArguments, build_model, make_inputs
from attnzoo.sbm import SBMAttention

logger = logging.getLogger(__name__)


@dataclass
class DensityArguments(InspectionArguments):
    """What to plot. Give exactly one of `config_path` (random weights) and `model_name_or_path` (a checkpoint)."""

    output_file: str = field(default="sbm_density.png", metadata={"help": "image to write (png, pdf, svg)"})
    length: int = field(default=256, metadata={"help": "number of random tokens when no --text is given"})
    trainer_state: str | None = field(
        default=None, metadata={"help": "trainer_state.json with `sbm_density/*` logs to plot against the step"}
    )


def build_sbm(args: DensityArguments) -> torch.nn.Module:
    """The SBM encoder in eval mode (seeded sampling)."""
    model = build_model(args)
    if not any(isinstance(m, SBMAttention) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} has no SBM attention layer.")
    return model


def encode(args: DensityArguments, model: torch.nn.Module) -> torch.Tensor:
    """Input ids `(1, N)`: the tokenized `--text` or random tokens."""
    return make_inputs(args, model.config)["input_ids"]


@torch.no_grad()
def measure_density(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Density per encoder layer and head, `(num_layers, num_heads)` (the model output's `attention_density`,
    averaged over the batch)."""
    out = model(input_ids=input_ids)
    if out.attention_density is None:
        raise ValueError("The model did not report attention densities.")
    return out.attention_density.mean(0)


def read_logged_density(path: str) -> dict[str, tuple[list[int], list[float]]]:
    """`sbm_density/*` series of a `trainer_state.json`: key -> (steps, values)."""
    history = json.loads(Path(path).read_text())["log_history"]
    series: dict[str, tuple[list[int], list[float]]] = {}
    for entry in history:
        for key, value in entry.items():
            if key.startswith("sbm_density/"):
                steps, values = series.setdefault(key, ([], []))
                steps.append(entry.get("step", len(steps)))
                values.append(value)
    return series


def plot(density: torch.Tensor, args: DensityArguments, logged: dict | None) -> None:
    """Heatmap of layers × heads, per-layer means, and (optionally) the logged training curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_layers, num_heads = density.shape
    panels = 3 if logged else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 0.6 * num_layers + 2.6), squeeze=False)
    ax = axes[0][0]
    image = ax.imshow(density.numpy(), cmap="viridis", vmin=0.0, vmax=max(float(density.max()), 1e-3), aspect="auto")
    for layer in range(num_layers):
        for head in range(num_heads):
            ax.text(head, layer, f"{100 * density[layer, head]:.1f}", ha="center", va="center", fontsize=7, color="w")
    ax.set_xticks(range(num_heads))
    ax.set_yticks(range(num_layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("mask density per head (%)")
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax = axes[0][1]
    ax.barh(range(num_layers), 100 * density.mean(-1).numpy(), color="tab:blue")
    ax.set_yticks(range(num_layers))
    ax.invert_yaxis()
    ax.set_xlabel("mean density (%)")
    ax.set_title("per layer")
    if logged:
        ax = axes[0][2]
        for key, (steps, values) in sorted(logged.items()):
            ax.plot(steps, [100 * v for v in values], label=key.split("/", 1)[1])
        ax.set_xlabel("training step")
        ax.set_ylabel("density (%)")
        ax.set_title("logged during training")
        ax.legend(fontsize=7)
    fig.suptitle(f"SBM attention density ({density.numel()} heads, mean {100 * density.mean():.1f}%)")
    fig.tight_layout()
    Path(args.output_file).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output_file, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> torch.Tensor:
    """Parse arguments, measure the densities, write the figure; returns the `(layers, heads)` densities."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = HfArgumentParser(DensityArguments)
    (args,) = parser.parse_args_into_dataclasses(args=argv if argv is not None else sys.argv[1:])
    model = build_sbm(args)
    density = measure_density(model, encode(args, model))
    logged = read_logged_density(args.trainer_state) if args.trainer_state else None
    plot(density, args, logged)
    logger.info("wrote %s (mean density %.4f)", args.output_file, float(density.mean()))
    return density


if __name__ == "__main__":
    main()

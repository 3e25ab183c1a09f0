"""Carrying the tensors of a run's starting checkpoint that its model had no place for into the model it saves.

Continued pretraining is a middle step: what it saves is the next run's start. A converted BERT stores its pooler as
the classification head's `classifier.dense`, which a masked-LM model does not have; `Trainer` saves only the model's
own parameters, so without this step the pooler would be gone, unnoticed, by the time a classifier is fine-tuned
from the continued checkpoint (it would start from a fresh one).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..conversion.source import read_checkpoint_tensors

logger = logging.getLogger(__name__)

#: The shard that a sharded save gets for the carried tensors.
CARRIED_SHARD = "model-carried.safetensors"


def carry_unloaded_tensors(
    source: str, output_dir: str | Path, names: Iterable[str], cache_dir: str | None = None
) -> list[str]:
    """
    Add the tensors `names` of the checkpoint `source`, unchanged, to the safetensors weights saved in `output_dir`.

    Args:
        source: the checkpoint the run started from (a folder or a Hub id).
        output_dir: where the run saved its model (`model.safetensors`, or shards with their index).
        names: the tensors to carry, as the load reported them unexpected.
        cache_dir: the Hub cache the run used.

    Returns:
        The names carried, sorted. A name `source` does not store under that name (a key the loader renamed) is not
        carried and is logged as a warning; a name the saved model already holds is left as saved.

    Raises:
        `ValueError`: `output_dir` holds no safetensors weights.
    """
    names = set(names)
    if not names:
        return []
    out = Path(output_dir)
    single, index = out / SAFE_WEIGHTS_NAME, out / SAFE_WEIGHTS_INDEX_NAME
    if not single.is_file() and not index.is_file():
        raise ValueError(f"{out} holds no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} to carry tensors into.")
    stored = read_checkpoint_tensors(source, cache_dir)
    absent = sorted(names - set(stored))
    if absent:
        logger.warning("Not carried from %s (not stored under these names): %s", source, ", ".join(absent))
    if single.is_file():
        saved = load_file(str(single))
        carried = {name: stored[name].contiguous() for name in sorted(names & set(stored) - set(saved))}
        if carried:
            with safe_open(str(single), "pt") as handle:
                metadata = handle.metadata()
            save_file({**saved, **carried}, str(single), metadata=metadata)
    else:
        layout = json.loads(index.read_text(encoding="utf-8"))
        carried = {name: stored[name].contiguous() for name in sorted(names & set(stored) - set(layout["weight_map"]))}
        if carried:
            save_file(carried, str(out / CARRIED_SHARD), metadata={"format": "pt"})
            layout["weight_map"].update(dict.fromkeys(carried, CARRIED_SHARD))
            metadata = layout.setdefault("metadata", {})
            metadata["total_size"] = metadata.get("total_size", 0) + sum(_nbytes(t) for t in carried.values())
            index.write_text(json.dumps(layout, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if carried:
        logger.info("Carried from %s into %s unchanged: %s", source, out, ", ".join(carried))
    return sorted(carried)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()

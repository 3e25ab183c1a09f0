"""Fixtures of the Hub publishing tests: tiny trained-looking checkpoints (weights, tokenizer, metrics JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from attnzoo.registry import Family
from source_checkout import load_config

METRICS = {
    "metrics": {
        "train_loss": 0.52,
        "train_runtime": 12.5,
        "eval_accuracy": 0.8125,
        "eval_loss": 0.4375,
        "eval_runtime": 1.5,
        "eval_samples_per_second": 100.0,
        "epoch": 3.0,
    },
    "task": "sst2",
    "data": {"train_examples": 800},
    "global_step": 300,
}


@pytest.fixture(scope="session")
def tokenizer():
    from attnzoo.tokenization import train_wordpiece_tokenizer

    texts = ["a tiny sentence about sparse attention", "another short line of text", "the model reads tokens"] * 4
    return train_wordpiece_tokenizer(texts, vocab_size=200, min_frequency=1)


@pytest.fixture
def make_checkpoint(tokenizer) -> Callable[..., Path]:
    """
    `make_checkpoint(family, head, folder, **fields)` (`head`: a key of `Family.heads`; `fields`: config fields) saves
    a seeded tiny model, the tokenizer and a metrics.json.
    """

    def make(family: Family, head: str, folder: Path, tokenizer_files: bool = True, **fields) -> Path:
        overrides = {"num_labels": 3} if head == "sequence_classification" else {}
        config = load_config(family, "tiny", **overrides, **fields)
        torch.manual_seed(0)
        model = family.heads[head](config).eval()
        model.save_pretrained(folder)
        if tokenizer_files:
            tokenizer.save_pretrained(folder)
        (folder / "metrics.json").write_text(json.dumps(METRICS))
        return folder

    return make

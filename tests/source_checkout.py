"""Helpers of the test suite that read the source checkout: its `scripts/`, `configs/` and `tests/fixtures/`.

The library's own test helpers ([`attnzoo.testing`]) read no files; these locate the checkout's programs, model
configs and bundled data, and run the small SST-2 fine-tunes the slow tests compare families with. Tests import this
module by name (`pytest`'s `pythonpath` puts `tests/` on the path).
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attnzoo.core.configuration import ZooConfig
from attnzoo.registry import Family
from attnzoo.testing import config_from_file, family_by_name

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "data"
SST2_DIR = FIXTURES / "glue" / "SST-2"
#: The 2,500 IMDB reviews the long-input evaluation reads by default.
REVIEWS_FILE = FIXTURES / "imdb" / "train_subset_2500.tsv"


@functools.cache
def load_script(name: str) -> ModuleType:
    """
    Import the program `scripts/<name>.py` as a module (once per process), so tests call its `main(argv)`
    in-process instead of paying a child process's imports. `name` may name a subfolder (`"tools/gpu_check"`,
    `"experiments/warm-start/run"`). The module is registered in `sys.modules`: dataclasses defined in a script look
    their module up there.
    """
    path = REPO_ROOT / "scripts" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no program {name!r}: {path} does not exist")
    spec = importlib.util.spec_from_file_location("attnzoo_script_" + re.sub(r"\W", "_", name), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_config(family: Family | str, size: str = "tiny", **overrides: Any) -> ZooConfig:
    """A family's config from `configs/models/<family>/<size>.json`, with field overrides."""
    name = family if isinstance(family, str) else family.name
    return config_from_file(family, REPO_ROOT / "configs" / "models" / name / f"{size}.json", **overrides)


def read_sst2(split: str) -> tuple[list[str], list[int]]:
    """Sentences and labels of the bundled SST-2 slice (`split` is `"train"` or `"dev"`)."""
    with open(SST2_DIR / f"{split}.tsv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows], [int(r["label"]) for r in rows]


@functools.lru_cache(maxsize=2)
def sst2_tokenizer(vocab_size: int = 2000):
    """A WordPiece tokenizer trained on the bundled SST-2 training sentences (cached per process)."""
    from attnzoo.tokenization import train_wordpiece_tokenizer

    sentences, _ = read_sst2("train")
    return train_wordpiece_tokenizer(sentences, vocab_size=vocab_size, model_max_length=512)


def _batches(tokenizer, sentences, labels, batch_size, max_length, generator=None):
    order = torch.randperm(len(sentences), generator=generator) if generator is not None else range(len(sentences))
    order = list(order)
    for start in range(0, len(order), batch_size):
        idx = [int(i) for i in order[start : start + batch_size]]
        enc = tokenizer(
            [sentences[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        yield enc, torch.tensor([labels[i] for i in idx])


#: A short-input comparison at a budget where the families learn (tests/sbm/test_sbm_slow.py, the sbm-short-inputs
#: study's `check`): width 128, 4 heads, 1,000 steps of batch 32 at 1e-3 (with `train_and_eval_sst2`'s defaults).
SST2_WIDTH = {"hidden_size": 128, "num_attention_heads": 4}
SST2_SHORT_INPUTS = {"steps": 1000, "learning_rate": 1e-3, "seed": 0}


def train_and_eval_sst2(
    family_name: str,
    config_overrides: dict[str, Any] | None = None,
    steps: int = 300,
    seed: int = 0,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    max_length: int = 64,
) -> dict[str, float]:
    """Fine-tune a tiny model of a family on bundled SST-2 from scratch and evaluate it on the bundled dev slice.

    Identical data order, tokenizer, sizes and optimiser for every family, so accuracies are comparable.

    Returns:
        `{"accuracy": ..., "train_seconds": ..., "final_loss": ..., "max_grad_norm": ...}`, the last the largest
        gradient norm before clipping (at 1.0) over the run.
    """
    torch.manual_seed(seed)
    tokenizer = sst2_tokenizer()
    config = load_config(family_name, "tiny", vocab_size=len(tokenizer), num_labels=2, **(config_overrides or {}))
    model = family_by_name(family_name).sequence_classification_class(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 30))
    sentences, labels = read_sst2("train")
    generator = torch.Generator().manual_seed(seed)
    model.train()
    step, loss, start, largest = 0, torch.tensor(0.0), time.perf_counter(), 0.0
    while step < steps:
        for enc, y in _batches(tokenizer, sentences, labels, batch_size, max_length, generator):
            loss = model(**enc, labels=y).loss
            loss.backward()
            largest = max(largest, float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            if step >= steps:
                break
    train_seconds = time.perf_counter() - start
    model.eval()
    dev_sentences, dev_labels = read_sst2("dev")
    correct = 0
    with torch.no_grad():
        for enc, y in _batches(tokenizer, dev_sentences, dev_labels, 128, max_length):
            correct += int((model(**enc).logits.argmax(-1) == y).sum())
    return {
        "accuracy": correct / len(dev_labels),
        "train_seconds": train_seconds,
        "final_loss": float(loss.detach()),
        "max_grad_norm": largest,
    }


def mean_sst2_accuracy(
    family_name: str,
    config_overrides: dict[str, Any] | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    steps: int = 300,
) -> float:
    """Dev accuracy of [`train_and_eval_sst2`] averaged over `seeds`.

    One 300-step run on 800 dev sentences moves by 1-3 points from seed to seed (initialisation and data order), as
    much as the gaps that the slow tests compare; the mean over a few seeds compares the families, not the seeds.
    """
    runs = [train_and_eval_sst2(family_name, config_overrides, steps=steps, seed=seed) for seed in seeds]
    return sum(run["accuracy"] for run in runs) / len(runs)

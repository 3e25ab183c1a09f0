"""Helpers shared by the test suites of every family: repository configs, tiny models, and an SST-2 fine-tuning run.

They read the repository's `configs/` and `tests/fixtures/` folders, so they work from a source checkout.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .core.configuration import ZooConfig
from .registry import FAMILIES, Family

REPO_ROOT = Path(__file__).resolve().parent.parent
SST2_DIR = REPO_ROOT / "tests" / "fixtures" / "data" / "glue" / "SST-2"


@functools.cache
def load_script(name: str) -> ModuleType:
    """
    Import `scripts/<name>.py` as a module (once per process), so tests call its `main(argv)` in-process instead of
    paying a child process's imports. The module is registered in `sys.modules`: dataclasses defined in a script look
    their module up there.
    """
    path = REPO_ROOT / "scripts" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no script named {name!r}: {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"attnzoo_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def family_by_name(name: str) -> Family:
    """Look a family up by its folder name (`"dense"`) or its `model_type` (`"dense_transformer"`)."""
    for family in FAMILIES.values():
        if name in (family.name, family.model_type):
            return family
    raise KeyError(f"Unknown family {name!r}; registered: {sorted(f.name for f in FAMILIES.values())}.")


def load_config(family: Family | str, size: str = "tiny", **overrides: Any) -> ZooConfig:
    """Build a family's config from `configs/models/<family>/<size>.json`, with field overrides."""
    family = family_by_name(family) if isinstance(family, str) else family
    path = REPO_ROOT / "configs" / "models" / family.name / f"{size}.json"
    if not path.is_file():
        raise FileNotFoundError(f"No config file {path} (run from a source checkout of attnzoo).")
    fields = json.loads(path.read_text())
    fields.pop("model_type", None)
    fields.update(overrides)
    return family.config_class(**fields)


def probe_loss(hidden: torch.Tensor, mask: torch.Tensor | None = None, seed: int = 1) -> torch.Tensor:
    """A fixed random projection of the (real tokens') hidden states, summed: its gradient reaches every layer.

    Comparisons of two implementations' gradients need it: a post-LayerNorm encoder's output has a mean square of
    almost exactly 1 per token, so `hidden.pow(2).mean()` sends nearly nothing back to the attention.

    Args:
        hidden (`torch.Tensor` of shape `(B, N, D)`): last hidden states.
        mask (`torch.Tensor` of shape `(B, N)`, *optional*): 1 / `True` at the tokens that count.
        seed (`int`, *optional*, defaults to 1): seed of the projection.
    """
    probe = torch.randn(hidden.shape[-1], generator=torch.Generator().manual_seed(seed))
    projected = hidden * probe.to(device=hidden.device, dtype=hidden.dtype)  # (B, N, D)
    return (projected if mask is None else projected[mask.bool()]).sum()


def assert_same_gradients(
    grads: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
    *,
    rtol: float,
    atol: float,
    atol_of_largest: float = 1e-7,
) -> None:
    """Every parameter's gradient within `rtol` and `atol` times that parameter's own largest expected entry.

    A tolerance scaled by the model's largest gradient (the embeddings') would hide errors in the attention's
    projections, whose gradients are orders of magnitude smaller; `atol_of_largest` times the largest one still
    absorbs the round-off of gradients that vanish in exact arithmetic (the key bias cancels in every softmax).
    """
    assert grads.keys() == expected.keys()
    largest = max(float(g.abs().max()) for g in expected.values())
    for name, grad in grads.items():
        tolerance = atol * float(expected[name].abs().max()) + atol_of_largest * largest
        torch.testing.assert_close(grad, expected[name], atol=tolerance, rtol=rtol, msg=name)


def read_sst2(split: str) -> tuple[list[str], list[int]]:
    """Sentences and labels of the bundled SST-2 slice (`split` is `"train"` or `"dev"`)."""
    with open(SST2_DIR / f"{split}.tsv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows], [int(r["label"]) for r in rows]


@functools.lru_cache(maxsize=2)
def sst2_tokenizer(vocab_size: int = 2000):
    """A WordPiece tokenizer trained on the bundled SST-2 training sentences (cached per process)."""
    from .tokenization import train_wordpiece_tokenizer

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
        `{"accuracy": ..., "train_seconds": ..., "final_loss": ...}`
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
    step, loss, start = 0, torch.tensor(0.0), time.perf_counter()
    while step < steps:
        for enc, y in _batches(tokenizer, sentences, labels, batch_size, max_length, generator):
            loss = model(**enc, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
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


def majority_token_batch(
    batch: int, generator: torch.Generator, length: int = 48
) -> tuple[torch.Tensor, torch.Tensor]:
    """Is token 7 or token 8 the majority among the 7s and 8s of a sequence? `(input_ids (B, N), labels (B,))`.

    Each sequence is `[CLS]` (id 2) followed by noise tokens 9-20, of which 10-19 positions are replaced by 7s and 8s
    (never a tie); the label is 1 where the 8s are the majority. Learnable by any model that can count two tokens.
    """
    ids = torch.randint(9, 21, (batch, length), generator=generator)
    ids[:, 0] = 2
    labels = torch.randint(0, 2, (batch,), generator=generator)
    for row in range(batch):
        count = int(torch.randint(10, 20, (1,), generator=generator))
        majority = count // 2 + 1 + int(torch.randint(0, (count - 1) // 2 + 1, (1,), generator=generator))
        majority = min(majority, count)
        positions = 1 + torch.randperm(length - 1, generator=generator)[:count]
        winner, loser = (8, 7) if labels[row] else (7, 8)
        ids[row, positions[:majority]] = winner
        ids[row, positions[majority:]] = loser
    return ids, labels


def majority_token_accuracy(
    family_name: str,
    config_overrides: dict[str, Any] | None = None,
    steps: int = 80,
    batch_size: int = 32,
    learning_rate: float = 2e-3,
    seed: int = 0,
) -> float:
    """Accuracy on 512 held-out sequences of [`majority_token_batch`] after `steps` AdamW steps from scratch.

    The model is a small classifier (2 layers, width 64, 4 heads) with every method field at the family's default,
    so it checks that the default classifier learns a trivially learnable task.
    """
    torch.manual_seed(seed)
    family = family_by_name(family_name)
    fields = {
        "vocab_size": 32,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "num_labels": 2,
        **(config_overrides or {}),
    }
    config = family.config_class(**fields)
    model = family.sequence_classification_class(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids, labels = majority_token_batch(batch_size, generator)
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    ids, labels = majority_token_batch(512, torch.Generator().manual_seed(10_000 + seed))
    with torch.no_grad():
        return float((model(input_ids=ids).logits.argmax(-1) == labels).float().mean())

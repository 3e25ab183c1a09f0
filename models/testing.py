"""Helpers for testing attnzoo models: a gradient probe, per-parameter gradient comparison, a family lookup, and
a trivially learnable task that checks a default classifier learns.

Nothing here reads files: the helpers that need a source checkout (its `configs/`, `scripts/` and `tests/fixtures/`)
live in the test suite (`tests/source_checkout.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .core.configuration import ZooConfig
from .registry import FAMILIES, Family


def family_by_name(name: str) -> Family:
    """Look a family up by its name (its `model_type`, e.g. `"dense_transformer"`)."""
    if name in FAMILIES:
        return FAMILIES[name]
    raise KeyError(f"Unknown family {name!r}; registered: {sorted(f.name for f in FAMILIES.values())}.")


def config_from_file(family: Family | str, path: str | Path, **overrides: Any) -> ZooConfig:
    """A family's config from a plain `config.json`-style file (`configs/models/<family>/<size>.json` in a checkout),
    with field overrides.

    Args:
        family ([`~attnzoo.registry.Family`] or `str`): the family, or its name.
        path (`str` or `Path`): the JSON file; its `model_type`, if any, must be the family's.
        overrides: config fields to set on top of the file's.
    """
    family = family_by_name(family) if isinstance(family, str) else family
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No config file {path}.")
    fields = json.loads(path.read_text(encoding="utf-8"))
    model_type = fields.pop("model_type", family.model_type)
    if model_type != family.model_type:
        raise ValueError(f"{path} is a {model_type!r} config, not a {family.model_type!r} one.")
    return family.config_class(**{**fields, **overrides})


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

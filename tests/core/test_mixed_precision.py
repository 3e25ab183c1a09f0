"""Every family trains in bf16 autocast, and in fp16 autocast with a gradient scaler (Trainer `--bf16` / `--fp16`)."""

from __future__ import annotations

import pytest
import torch

from attnzoo.registry import FAMILIES
from source_checkout import load_config

HEADS = ("sequence_classification", "conditional_generation")
CASES = [
    pytest.param(family, head, dtype, id=f"{FAMILIES[family].name}-{head}-{str(dtype)[6:]}")
    for family in sorted(FAMILIES)
    for head in HEADS
    for dtype in (torch.bfloat16, torch.float16)
]
STEPS = 4


def _batch(config, head: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, config.vocab_size, (2, 48), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 30:] = 0  # padding too
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if head == "sequence_classification":
        batch["labels"] = torch.tensor([0, 1])
    else:
        batch["labels"] = torch.randint(5, config.vocab_size, (2, 10), generator=g)
    return batch


def _train(family: str, head: str, dtype: torch.dtype | None) -> tuple[list[float], torch.nn.Module, int]:
    """`STEPS` AdamW steps under autocast `dtype` (None: fp32); losses, the model and the steps the scaler skipped."""
    torch.manual_seed(0)
    config = load_config(FAMILIES[family], "tiny", num_labels=2)
    model = FAMILIES[family].heads[head](config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # fp16 needs loss scaling (its range ends at 65504 and small gradients underflow); bf16 has fp32's range.
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    batch = _batch(config, head)
    losses, skipped = [], 0
    for _ in range(STEPS):
        # Stochastic families sample the same structure in every run: the dtype is the only difference.
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(**batch).loss
        losses.append(float(loss.detach()))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        # Only the scaled fp16 backward may overflow (the scaler then skips the step and lowers its scale).
        assert finite or scaler.is_enabled(), "non-finite gradient"
        skipped += not finite
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return losses, model, skipped


def _first_loss_in_fp32(family: str, head: str) -> float:
    torch.manual_seed(0)
    config = load_config(FAMILIES[family], "tiny", num_labels=2)
    model = FAMILIES[family].heads[head](config).train()
    torch.manual_seed(1)
    with torch.no_grad():
        return float(model(**_batch(config, head)).loss)


@pytest.mark.parametrize("family,head,dtype", CASES)
def test_family_trains_in_half_precision_like_fp32(family, head, dtype):
    losses, model, skipped = _train(family, head, dtype)
    assert all(torch.isfinite(torch.tensor(losses)))
    # The first loss is the same function of the same weights in both precisions.
    assert losses[0] == pytest.approx(_first_loss_in_fp32(family, head), rel=2e-2)
    # Training moves: at most one step lost to the scaler's first overflow, and the loss goes down.
    assert skipped <= 1 and losses[-1] < losses[0]
    assert all(torch.isfinite(p).all() for p in model.parameters())

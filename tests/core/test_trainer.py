"""Training through `Trainer`: every family and head trains from a `datasets.Dataset` with default arguments, and
gradient accumulation gives the same update as one large batch."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments

from attnzoo.core.modeling import add_aux_loss
from attnzoo.registry import FAMILIES
from source_checkout import load_config


def _mlm_dataset() -> Dataset:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (4, 16), generator=g)
    labels = torch.full_like(ids, -100)
    # Very different numbers of target tokens per example: a per-micro-batch mean would weight them wrongly.
    for row, count in enumerate((1, 2, 9, 14)):
        labels[row, :count] = ids[row, :count]
    return Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(), "labels": labels.tolist()}
    )


def _train(tmp_path, batch_size: int, accumulation: int) -> dict[str, torch.Tensor]:
    config = load_config("dense_transformer", "tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = FAMILIES["dense_transformer"].masked_lm_class(config)
    args = TrainingArguments(
        output_dir=str(tmp_path / f"b{batch_size}"),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        lr_scheduler_type="constant",
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=_mlm_dataset()).train()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_gradient_accumulation_matches_one_large_batch(tmp_path):
    full = _train(tmp_path, batch_size=4, accumulation=1)
    accumulated = _train(tmp_path, batch_size=2, accumulation=2)
    for name, value in full.items():
        torch.testing.assert_close(accumulated[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_aux_loss_gets_the_task_loss_share_under_accumulation():
    loss = torch.tensor(2.0)
    labels = torch.tensor([[1, 2, -100, -100]])
    # Two of the accumulated batch's eight target tokens are here, so this micro-batch carries 2/8 of the aux term.
    combined = add_aux_loss(loss, torch.tensor(4.0), 0.5, labels, num_items_in_batch=8)
    torch.testing.assert_close(combined, torch.tensor(2.0 + 0.5 * 4.0 * 2 / 8))
    torch.testing.assert_close(add_aux_loss(loss, torch.tensor(4.0), 0.5, labels, None), torch.tensor(4.0))
    assert add_aux_loss(loss, None, 0.5, labels, 8) is loss


def _task_dataset(head: str, vocab_size: int) -> Dataset:
    """Six fixed-length examples with the columns a tokenised dataset has, plus a raw-text column Trainer drops."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (6, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, 12:] = 0
    columns = {"text": [f"example {i}" for i in range(6)], "input_ids": ids.tolist(), "attention_mask": mask.tolist()}
    if head == "masked_lm":
        columns["labels"] = ids.masked_fill(mask == 0, -100).tolist()
    elif head == "sequence_classification":
        columns["label"] = [i % 2 for i in range(6)]  # the name GLUE-style datasets use; the collator renames it
    else:
        columns["labels"] = torch.randint(5, vocab_size, (6, 6), generator=g).tolist()
    return Dataset.from_dict(columns)


@pytest.mark.parametrize("head", ["masked_lm", "sequence_classification", "conditional_generation"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_plain_trainer_trains_every_family_and_head_from_a_dataset(model_type, head, tmp_path):
    family = FAMILIES[model_type]
    config = load_config(family, "tiny")
    torch.manual_seed(0)
    model = family.heads[head](config)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seq2seq = head == "conditional_generation"
    arguments = (Seq2SeqTrainingArguments if seq2seq else TrainingArguments)(
        output_dir=str(tmp_path), per_device_train_batch_size=3, max_steps=2, use_cpu=True, report_to="none",
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = (Seq2SeqTrainer if seq2seq else Trainer)(
        model=model, args=arguments, train_dataset=_task_dataset(head, config.vocab_size)
    )
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    changed = {n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])}
    task_part = {
        "masked_lm": "lm_head.",
        "sequence_classification": "classifier.",
        "conditional_generation": "model.decoder.",
    }
    assert any(n.startswith(task_part[head]) for n in changed)
    assert any(".encoder.layers.0." in n for n in changed)
    if model_type == "smart_bird":
        # The sketch learns from its own loss on the head's labels, which reach it through the named `labels`.
        assert any(".sketch." in n for n in changed)

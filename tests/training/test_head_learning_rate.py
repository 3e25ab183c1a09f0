"""`attnzoo.training.head_learning_rate`: which parameters are a fine-tuned checkpoint's new head, and a `Trainer`
whose optimizer trains them at a rate of their own on the same schedule."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    TrainingArguments,
)

import attnzoo  # noqa: F401  (registers the families)
from attnzoo.training import FineTuningArguments, HeadLearningRateTrainer, new_head_parameters
from attnzoo.training.head_learning_rate import split_learning_rate
from source_checkout import REPO_ROOT

TINY = REPO_ROOT / "configs/models/dense_transformer/tiny.json"
HEAD_LR, BODY_LR = 1e-2, 1e-4


def _bert_config() -> BertConfig:
    return BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32,
    )  # fmt: skip


def test_the_new_head_is_what_the_checkpoint_did_not_provide_outside_the_base_model(tmp_path):
    # transformers' BERT from a headless checkpoint: its pooler is in the base model, the classifier is new.
    BertModel(_bert_config()).save_pretrained(tmp_path / "bert")
    bert, info = BertForSequenceClassification.from_pretrained(tmp_path / "bert", output_loading_info=True)
    assert new_head_parameters(bert, info["missing_keys"]) == ["classifier.weight", "classifier.bias"]
    # The zoo's classifier from its own classifier checkpoint: nothing is new.
    config = AutoConfig.from_pretrained(TINY)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "zoo")
    zoo, info = AutoModelForSequenceClassification.from_pretrained(tmp_path / "zoo", output_loading_info=True)
    assert new_head_parameters(zoo, info["missing_keys"]) == []
    # A conversion keeps BERT's pooler as `classifier.dense`: only the output layer is new. A method's own fresh
    # parameters (in the base model) are not the head's.
    missing = ["classifier.out_proj.weight", "classifier.out_proj.bias", "model.embeddings.word_embeddings.weight"]
    assert new_head_parameters(zoo, missing) == ["classifier.out_proj.weight", "classifier.out_proj.bias"]
    # A model built from a config: its whole head is new.
    head = new_head_parameters(zoo, None)
    assert head and set(head) == {name for name, _ in zoo.named_parameters() if name.startswith("classifier.")}


def _trainer(tmp_path, head_learning_rate: float | None, **arguments) -> HeadLearningRateTrainer:
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(TINY, num_labels=2))
    args = TrainingArguments(
        output_dir=str(tmp_path), learning_rate=BODY_LR, weight_decay=0.01, warmup_steps=0, max_steps=4,
        report_to="none", use_cpu=True, **arguments,
    )  # fmt: skip
    head = ["classifier.out_proj.weight", "classifier.out_proj.bias"] if head_learning_rate else []
    return HeadLearningRateTrainer(model=model, args=args, head_parameters=head, head_learning_rate=head_learning_rate)


def test_the_head_has_groups_of_its_own_with_trainers_decay_and_schedule(tmp_path):
    trainer = _trainer(tmp_path, HEAD_LR)
    trainer.create_optimizer_and_scheduler(num_training_steps=4)
    groups = trainer.optimizer.param_groups
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    owners = [names[id(p)] for group in groups for p in group["params"]]
    assert sorted(owners) == sorted(names.values()), "every parameter in exactly one group"
    for group in groups:
        in_head = {names[id(p)].startswith("classifier.out_proj.") for p in group["params"]}
        assert len(in_head) == 1 and group["lr"] == (HEAD_LR if in_head.pop() else BODY_LR)
    # Trainer's weight decay still applies by parameter: the head's weight decays, its bias does not.
    decay = {names[id(p)]: group["weight_decay"] for group in groups for p in group["params"]}
    assert decay["classifier.out_proj.weight"] == 0.01 and decay["classifier.out_proj.bias"] == 0.0
    # The linear schedule scales every group alike (the optimizer steps first, as in training: no gradient, no move).
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.lr_scheduler.step()
    rates = trainer.lr_scheduler.get_last_lr()
    assert rates[0] == pytest.approx(BODY_LR / 2) and max(rates) == pytest.approx(HEAD_LR / 2)


def _moves(trainer: HeadLearningRateTrainer) -> dict[str, float]:
    """The largest change of the head's and of the body's parameters after one training step."""
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    inputs = {"input_ids": torch.randint(5, 100, (4, 12)), "labels": torch.tensor([0, 1, 0, 1])}
    trainer.model.train()
    trainer.model(**inputs).loss.backward()
    trainer.optimizer.step()
    moved = {"head": 0.0, "body": 0.0}
    for name, p in trainer.model.named_parameters():
        part = "head" if name.startswith("classifier.out_proj.") else "body"
        moved[part] = max(moved[part], (p.detach() - before[name]).abs().max().item())
    return moved


def test_one_step_moves_the_head_by_its_own_rate(tmp_path):
    # Adam's first step moves a weight by about its learning rate (the sign of its gradient).
    plain = _moves(_trainer(tmp_path, None, lr_scheduler_type="constant"))
    own = _moves(_trainer(tmp_path, HEAD_LR, lr_scheduler_type="constant"))
    assert plain["head"] == pytest.approx(BODY_LR, rel=0.05) and own["head"] == pytest.approx(HEAD_LR, rel=0.05)
    assert own["body"] == pytest.approx(plain["body"], rel=1e-4)


def test_bad_uses_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="positive number"):
        FineTuningArguments(head_learning_rate=0.0)
    model = torch.nn.Linear(2, 2)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="no new head parameter"):
        HeadLearningRateTrainer(model=model, args=args, head_learning_rate=HEAD_LR)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not one passed in"):
        HeadLearningRateTrainer(
            model=model, args=args, optimizers=(optimizer, None), head_parameters=["weight"], head_learning_rate=0.1
        )
    trainer = HeadLearningRateTrainer(model=model, args=args, head_parameters=["head.weight"], head_learning_rate=1.0)
    with pytest.raises(ValueError, match="no parameter"):
        trainer.create_optimizer()
    with pytest.raises(ValueError, match="in no optimizer group"):
        split_learning_rate(torch.optim.SGD([model.weight], lr=0.1), [model.bias], HEAD_LR)

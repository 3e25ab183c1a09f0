"""A learning rate of its own for the new task head of a fine-tuned checkpoint.

A classifier fine-tuned from a pretrained encoder starts with a fresh output layer on top of pretrained features.
When those features are small (a sentence-embedding model's pooled states vary by hundredths), Adam, which moves every
weight by about the learning rate per step, changes the fresh layer's logits by hundredths over a whole short run at
an encoder's learning rate: the run ends near its first guess. A common remedy in fine-tuning (ULMFiT's discriminative
rates, a classifier learning rate in many recipes) is a larger rate for the new layer only; a run long enough for the
head to get away from its first guess may not need it.

The head is what the checkpoint did not provide outside the base model: for BERT's classifier its `classifier`
layer, for the zoo's its `classifier.out_proj` (the zoo keeps BERT's pooler as `classifier.dense`, which the
checkpoint provides). Both count the same parameters, so the two are trained alike.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import torch
from transformers import PreTrainedModel, Trainer


def new_head_parameters(model: PreTrainedModel, missing_keys: Iterable[str] | None) -> list[str]:
    """Names of the task head's parameters that `model`'s checkpoint did not provide.

    Args:
        model (`PreTrainedModel`): a model with a task head around its `base_model_prefix` module.
        missing_keys (`Iterable[str]` or `None`): the load's missing keys (transformers' loading info); `None` for a
            model built from a config (nothing was provided: the whole head is new).

    Returns:
        `list[str]`: the parameter names, in `named_parameters()` order.
    """
    base = f"{model.base_model_prefix}."
    missing = None if missing_keys is None else set(missing_keys)
    return [
        name
        for name, _ in model.named_parameters()
        if not name.startswith(base) and (missing is None or name in missing)
    ]


def check_head_learning_rate(value: float | None) -> None:
    """Refuse a head learning rate that is given but not a positive number."""
    if value is not None and not value > 0:
        raise ValueError(f"`head_learning_rate` must be a positive number, got {value}.")


def split_learning_rate(
    optimizer: torch.optim.Optimizer, parameters: Collection[torch.nn.Parameter], lr: float
) -> None:
    """Move `parameters` out of `optimizer`'s groups into groups of their own at `lr`, one per group they came from
    (so each keeps its group's weight decay and other settings). Call it before the first step and before a
    learning-rate scheduler reads the groups' rates.

    Raises:
        `ValueError`: a parameter is in none of the groups.
    """
    wanted = {id(p) for p in parameters}
    found: set[int] = set()
    new_groups = []
    for group in optimizer.param_groups:
        moved = [p for p in group["params"] if id(p) in wanted]
        if not moved:
            continue
        found.update(id(p) for p in moved)
        group["params"] = [p for p in group["params"] if id(p) not in wanted]
        new_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": moved, "lr": lr})
    if found != wanted:
        raise ValueError(f"{len(wanted - found)} of the head's {len(wanted)} parameters are in no optimizer group.")
    # An emptied group would still be stepped (and checkpointed); drop it.
    optimizer.param_groups[:] = [group for group in optimizer.param_groups if group["params"]]
    for group in new_groups:
        optimizer.add_param_group(group)


class HeadLearningRateTrainer(Trainer):
    """`Trainer` that trains the named parameters (a fine-tuned model's new head, [`new_head_parameters`]) at
    `head_learning_rate`, every other parameter as `TrainingArguments` says. The optimizer is Trainer's own (the class,
    settings and weight-decay groups of `TrainingArguments`); only the head's parameters move into groups of their own,
    which the learning-rate schedule scales like the others. With `head_learning_rate=None` it is `Trainer`.

    Args:
        head_parameters (`Collection[str]`): parameter names as the model's `named_parameters()` gives them.
        head_learning_rate (`float`, *optional*): their peak learning rate.
        *args, **kwargs: `Trainer`'s.
    """

    def __init__(
        self, *args: Any, head_parameters: Collection[str] = (), head_learning_rate: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        check_head_learning_rate(head_learning_rate)
        if head_learning_rate is not None:
            if not head_parameters:
                raise ValueError("`head_learning_rate` is given, but the model has no new head parameter.")
            if self.optimizer is not None:
                raise ValueError("`head_learning_rate` regroups Trainer's own optimizer, not one passed in.")
        self.head_parameters = tuple(head_parameters)
        self.head_learning_rate = head_learning_rate

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        fresh = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if fresh and self.head_learning_rate is not None:
            # By name on the model the optimizer was built for: under FSDP2 its parameters are new (sharded) objects.
            by_name = dict((self.model if model is None else model).named_parameters())
            absent = [name for name in self.head_parameters if name not in by_name]
            if absent:
                raise ValueError(f"The model has no parameter {absent[:3]} to train at `head_learning_rate`.")
            split_learning_rate(optimizer, [by_name[name] for name in self.head_parameters], self.head_learning_rate)
        return optimizer

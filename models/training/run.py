"""The start of every training program: arguments, logging, Trainer's column handling, resume point and seed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import Seq2SeqTrainingArguments, set_seed

from .arguments import ModelArguments, parse_arguments
from .builders import convert_source_checkpoint, resolve_checkpoint
from .callbacks import TimeLimitCallback, setup_logging


def start_run(
    dataclass_types: Sequence[type], argv: Sequence[str] | None = None
) -> tuple[tuple[Any, ...], str | None]:
    """Parse the program's argument dataclasses (the last one is the `TrainingArguments`) and prepare the run: a
    `ModelArguments.family` converts its BERT / RoBERTa checkpoint first (see [`convert_source_checkpoint`]).

    Returns:
        `(parsed arguments, checkpoint to resume from or None)`.
    """
    parsed = parse_arguments(dataclass_types, argv)
    training_args = parsed[-1]
    setup_logging(training_args)
    # The datasets built by the programs hold exactly the model inputs, so Trainer's signature-based column pruning
    # and label detection have nothing to add; naming the labels keeps custom heads with `**kwargs` working too.
    training_args.remove_unused_columns = False
    training_args.label_names = ["labels"]
    checkpoint = resolve_checkpoint(training_args)
    for args in parsed:
        if isinstance(args, ModelArguments) and args.family is not None:
            # A seq2seq program gets the BERT2BERT encoder-decoder.
            seq2seq = isinstance(training_args, Seq2SeqTrainingArguments)
            convert_source_checkpoint(args, training_args, seq2seq=seq2seq)
    set_seed(training_args.seed)
    return parsed, checkpoint


def train_and_evaluate(
    trainer: Any, *, train: bool, evaluate: bool, checkpoint: str | None, max_seconds: float | None = None
) -> dict[str, Any]:
    """Train (resuming from `checkpoint`; for at most `max_seconds` of wall time when given, see
    [`TimeLimitCallback`]; `max_seconds` has no effect without training), save model and state, then evaluate;
    returns the merged metrics (with `train_time_limited`, whether the time limit ended the training before its last
    step, when one was given)."""
    metrics: dict[str, Any] = {}
    if train:
        limit = TimeLimitCallback(max_seconds) if max_seconds is not None else None
        if limit is not None:
            trainer.add_callback(limit)
        try:
            result = trainer.train(resume_from_checkpoint=checkpoint)
        finally:
            if limit is not None:
                trainer.remove_callback(limit)
        trainer.save_model()
        trainer.save_state()
        metrics.update(result.metrics)
        if limit is not None:
            metrics["train_time_limited"] = limit.stopped
    if evaluate:
        metrics.update(trainer.evaluate())
    return metrics

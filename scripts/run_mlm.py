#!/usr/bin/env python
"""Masked-language-model pretraining of an attnzoo model with `Trainer` (single process, `accelerate launch`,
`torchrun`).

Examples:

```bash
# Tiny dense MLM on the bundled WikiText slice, with a locally trained tokenizer
python scripts/train_tokenizer.py --files tests/fixtures/data/text/wikitext_train.txt --vocab_size 4000 \
    --output_dir out/tokenizer
python scripts/run_mlm.py --config_path configs/models/dense_transformer/tiny.json \
    --tokenizer_name_or_path out/tokenizer \
    --train_file tests/fixtures/data/text/wikitext_train.txt \
    --validation_file tests/fixtures/data/text/wikitext_valid.txt \
    --max_seq_length 128 --max_steps 200 --output_dir out/mlm

# Warm start: the dense checkpoint above into a sparse family of the same size (name-for-name load)
python scripts/run_mlm.py --model_name_or_path out/mlm --config_path configs/models/sbm/tiny.json \
    --train_file tests/fixtures/data/text/wikitext_train.txt --max_seq_length 128 --max_steps 200 \
    --output_dir out/mlm-sbm
```
A recipe continues a small dense checkpoint at 4096 tokens: `configs/train/mlm_long_context_warm_start.yaml`.
Outputs in `output_dir`: checkpoints, the final model and tokenizer, `metrics.json`, `log_history.json` and
`training_curves.png`. Tensors of the starting checkpoint that the masked-LM model has no place for (a converted
BERT's pooler, which the classification head loads) are saved with the final model unchanged (`carried_keys` in
`metrics.json`).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import AutoModelForMaskedLM, Trainer, TrainerCallback, TrainingArguments

import attnzoo  # noqa: F401  (registers every family with the Auto classes)
from attnzoo.training import (
    DataReport,
    EpochSetterCallback,
    MLMCollator,
    MLMDataArguments,
    ModelArguments,
    build_model,
    carry_unloaded_tensors,
    finish_run,
    load_mlm_texts,
    load_tokenizer,
    mask_dataset,
    start_run,
    tokenize_pairs,
    train_and_evaluate,
)

logger = logging.getLogger(__name__)


def group_texts(tokenizer: Any, texts: list[str], block_size: int, report: DataReport, split: str) -> Dataset:
    """
    Tokenize texts (each as `[CLS] text [SEP]`), concatenate them and cut blocks of `block_size` tokens.

    The remainder of each chunk of 1000 texts is kept as a shorter block (padded in the batch), so no token is
    dropped; the number of such short blocks is reported.
    """
    dataset = Dataset.from_dict({"text": texts})

    def tokenize_and_group(batch: dict[str, list]) -> dict[str, list]:
        encoded = tokenizer(batch["text"], verbose=False)
        blocks: dict[str, list] = {key: [] for key in encoded}
        for key, rows in encoded.items():
            flat = [token for row in rows for token in row]
            blocks[key] = [flat[i : i + block_size] for i in range(0, len(flat), block_size)]
        return blocks

    grouped = dataset.map(tokenize_and_group, batched=True, remove_columns=["text"], desc=f"Grouping {split} texts")
    lengths = [len(ids) for ids in grouped["input_ids"]]
    report.add(f"{split}_texts", len(texts))
    report.add(f"{split}_tokens", sum(lengths))
    report.add(f"{split}_blocks", len(lengths))
    report.add(f"{split}_short_blocks", sum(length < block_size for length in lengths))
    return grouped


def line_by_line(tokenizer: Any, texts: list[str], max_length: int, report: DataReport, split: str) -> Dataset:
    """One example per text, truncated to `max_length` (the truncated ones are counted)."""
    encoded = tokenize_pairs(tokenizer, texts, None, max_length, report, split)
    report.add(f"{split}_texts", len(texts))
    return Dataset.from_dict(encoded)


def masked_accuracy(eval_prediction: Any) -> dict[str, float]:
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    keep = labels != -100
    return {"accuracy": float((predictions[keep] == labels[keep]).mean()) if keep.any() else float("nan")}


def argmax_logits(logits: Any, labels: Any) -> Any:
    # Keep only the predicted ids: gathering (batch, length, vocab) logits over the evaluation set would be huge.
    logits = logits[0] if isinstance(logits, tuple) else logits
    return logits.argmax(dim=-1)


def main(argv: Sequence[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """
    Run MLM pretraining.

    Args:
        argv: command-line arguments (a recipe file first, optionally); defaults to `sys.argv[1:]`.
        callbacks: extra `TrainerCallback`s (e.g. [`~attnzoo.training.StopAtStepCallback`]).

    Returns:
        The content of `metrics.json`.
    """
    (model_args, data_args, training_args), checkpoint = start_run(
        (ModelArguments, MLMDataArguments, TrainingArguments), argv
    )

    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path, model_args.cache_dir)
    model, model_info = build_model(AutoModelForMaskedLM, model_args, tokenizer)
    if data_args.max_seq_length > model.config.max_position_embeddings:
        raise ValueError(
            f"`max_seq_length` ({data_args.max_seq_length}) exceeds the model's `max_position_embeddings` "
            f"({model.config.max_position_embeddings}); raise it with `config_overrides` for a fresh model."
        )

    report = DataReport()
    train_texts = load_mlm_texts(data_args, "train") if (data_args.train_file or data_args.dataset_name) else []
    eval_texts = (
        load_mlm_texts(data_args, "validation") if (data_args.validation_file or data_args.dataset_name) else []
    )
    if not eval_texts and data_args.validation_split_percentage and train_texts:
        cut = max(1, len(train_texts) * data_args.validation_split_percentage // 100)
        eval_texts, train_texts = train_texts[-cut:], train_texts[:-cut]
        report.add("validation_texts_taken_from_train", cut)
    build = line_by_line if data_args.line_by_line else group_texts
    train_dataset = build(tokenizer, train_texts, data_args.max_seq_length, report, "train") if train_texts else None
    eval_dataset = build(tokenizer, eval_texts, data_args.max_seq_length, report, "validation") if eval_texts else None
    if train_dataset is not None and data_args.max_train_samples:
        train_dataset = _limit(train_dataset, data_args.max_train_samples, report, "train")
    if eval_dataset is not None and data_args.max_eval_samples:
        eval_dataset = _limit(eval_dataset, data_args.max_eval_samples, report, "validation")
    if train_dataset is None and eval_dataset is None:
        raise ValueError("No training or evaluation texts were found in the given data.")
    report.log()

    collator = MLMCollator(
        tokenizer,
        mlm_probability=data_args.mlm_probability,
        seed=training_args.seed,
        pad_to_multiple_of=data_args.pad_to_multiple_of,
    )
    if eval_dataset is not None:
        eval_dataset = mask_dataset(eval_dataset, collator)
    trainer = Trainer(
        model=model,
        args=training_args,
        data_collator=collator,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=masked_accuracy if eval_dataset is not None else None,
        preprocess_logits_for_metrics=argmax_logits if eval_dataset is not None else None,
        callbacks=[EpochSetterCallback(collator), *callbacks],
    )
    metrics = train_and_evaluate(
        trainer,
        train=train_dataset is not None,
        evaluate=eval_dataset is not None,
        checkpoint=checkpoint,
        max_seconds=data_args.max_train_seconds,
    )
    if train_dataset is not None and trainer.is_world_process_zero() and model_args.model_name_or_path is not None:
        # The saved model is the next run's start: keep what this one did not train (a converted BERT's pooler).
        model_info["carried_keys"] = carry_unloaded_tensors(
            model_args.model_name_or_path,
            training_args.output_dir,
            model_info.get("unexpected_keys", ()),
            model_args.cache_dir,
        )
    if "eval_loss" in metrics:
        metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 50.0))
    trainer.log_metrics("all", metrics)
    return finish_run(trainer, metrics, {"data": report.counts, "model": model_info})


def _limit(dataset: Dataset, limit: int, report: DataReport, split: str) -> Dataset:
    if len(dataset) <= limit:
        return dataset
    report.add(f"{split}_blocks_dropped_by_max_samples", len(dataset) - limit)
    return dataset.select(np.arange(limit))


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:
        # Bad arguments and bad data are user errors: one clear line, no traceback.
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)

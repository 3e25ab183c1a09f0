#!/usr/bin/env python
"""Fine-tune and evaluate an attnzoo model on a GLUE task or any text classification data set, with `Trainer`.

Examples:

```bash
# SST-2 from the original GLUE TSV files, from scratch with a local tokenizer
python scripts/run_glue.py --task_name sst2 --config_path configs/models/dense_transformer/tiny.json \
    --tokenizer_name_or_path out/tokenizer \
    --train_file tests/fixtures/data/glue/SST-2/train.tsv --validation_file tests/fixtures/data/glue/SST-2/dev.tsv \
    --max_steps 300 --output_dir out/sst2

# MNLI from the Hub (network), fine-tuning an MLM checkpoint
python scripts/run_glue.py --task_name mnli --model_name_or_path out/mlm --output_dir out/mnli

# AG News from a local file without a header (text in column 0, label in column 1)
python scripts/run_glue.py --config_path configs/models/smart_bird/tiny.json --tokenizer_name_or_path out/tokenizer \
    --train_file tests/fixtures/data/agnews/train.tsv --text_column 0 --label_column 1 --output_dir out/agnews

# Smart Bird's IMDB protocol (long documents; Hub data set, network)
python scripts/run_glue.py configs/train/smart_bird_classification_imdb.yaml
```
Metrics (official GLUE definitions: accuracy, F1, Matthews correlation, Pearson/Spearman) go to
`output_dir/metrics.json`, the final evaluation's per-example predictions to `output_dir/eval_predictions.tsv`
(index, label, prediction), the training curves to `output_dir/training_curves.png`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    TrainerCallback,
    TrainingArguments,
)

import attnzoo  # noqa: F401  (registers every family with the Auto classes)
from attnzoo.training import (
    ClassificationDataArguments,
    FineTuningArguments,
    HeadLearningRateTrainer,
    ModelArguments,
    build_model,
    classification_metrics,
    finish_run,
    glue_metrics,
    load_classification_splits,
    load_tokenizer,
    new_head_parameters,
    start_run,
    tokenize_pairs,
    train_and_evaluate,
)

logger = logging.getLogger(__name__)
PREDICTIONS_FILE = "eval_predictions.tsv"


def first_logits(logits: Any, labels: Any) -> Any:
    # Sparse families also return auxiliary outputs (attention density, aux loss); only the logits are scored.
    return logits[0] if isinstance(logits, tuple) else logits


def main(argv: Sequence[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """
    Run fine-tuning and evaluation.

    Args:
        argv: command-line arguments (a recipe file first, optionally); defaults to `sys.argv[1:]`.
        callbacks: extra `TrainerCallback`s (e.g. [`~attnzoo.training.StopAtStepCallback`]).

    Returns:
        The content of `metrics.json`.
    """
    (model_args, data_args, tuning_args, training_args), checkpoint = start_run(
        (ModelArguments, ClassificationDataArguments, FineTuningArguments, TrainingArguments), argv
    )

    data = load_classification_splits(data_args, model_args.cache_dir)
    regression = data.label_names is None
    if regression:
        task_fields: dict[str, Any] = {"num_labels": 1, "problem_type": "regression"}
    else:
        task_fields = {
            "num_labels": len(data.label_names),
            "id2label": dict(enumerate(data.label_names)),
            "label2id": {name: i for i, name in enumerate(data.label_names)},
            "problem_type": "single_label_classification",
        }
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path, model_args.cache_dir)
    model, model_info = build_model(AutoModelForSequenceClassification, model_args, tokenizer, **task_fields)
    if data_args.max_seq_length > model.config.max_position_embeddings:
        raise ValueError(
            f"`max_seq_length` ({data_args.max_seq_length}) exceeds the model's `max_position_embeddings` "
            f"({model.config.max_position_embeddings})."
        )

    datasets = {}
    for split, columns in data.splits.items():
        encoded = tokenize_pairs(
            tokenizer, columns["text"], columns["text_pair"], data_args.max_seq_length, data.report, split
        )
        encoded["labels"] = columns["label"]
        datasets[split] = Dataset.from_dict(encoded)
    data.report.log()
    train_dataset, eval_dataset = datasets.get("train"), datasets.get("validation")

    task = data_args.task_name
    # The latest evaluation's predictions (the final one's, once training ends), for `eval_predictions.tsv`.
    latest: dict[str, np.ndarray] = {}

    def compute_metrics(prediction: Any) -> dict[str, float]:
        logits = prediction.predictions
        predictions = np.squeeze(logits, -1) if regression else np.argmax(logits, axis=-1)
        latest.update(predictions=predictions, labels=prediction.label_ids)
        if task is not None:
            return glue_metrics(task, predictions, prediction.label_ids)
        return classification_metrics(predictions, prediction.label_ids)

    head_parameters: list[str] = []
    if tuning_args.head_learning_rate is not None:
        # A model built from a config has no loading report: its whole head is new.
        head_parameters = new_head_parameters(model, model_info.get("missing_keys"))
        model_info["head_parameters"] = head_parameters
    trainer = HeadLearningRateTrainer(
        head_parameters=head_parameters,
        head_learning_rate=tuning_args.head_learning_rate,
        model=model,
        args=training_args,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=data_args.pad_to_multiple_of),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=first_logits,
        callbacks=list(callbacks),
    )
    metrics = train_and_evaluate(
        trainer,
        train=train_dataset is not None,
        evaluate=eval_dataset is not None,
        checkpoint=checkpoint,
        max_seconds=data_args.max_train_seconds,
    )
    trainer.log_metrics("all", metrics)
    extra = {"task": task, "label_names": data.label_names, "data": data.report.counts, "model": model_info}
    payload = finish_run(trainer, metrics, extra)
    if latest and trainer.is_world_process_zero():
        write_predictions(Path(training_args.output_dir) / PREDICTIONS_FILE, latest["labels"], latest["predictions"])
    return payload


def write_predictions(path: Path, labels: np.ndarray, predictions: np.ndarray) -> None:
    """One row per validation example, in the validation file's order: its label and the model's prediction (class
    ids, or scores for regression), so that two runs can be compared example by example (a paired test)."""
    rows = ["index\tlabel\tprediction"]
    rows += [
        f"{i}\t{label}\t{prediction}" for i, (label, prediction) in enumerate(zip(labels, predictions, strict=True))
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:
        # Bad arguments and bad data are user errors: one clear line, no traceback.
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)

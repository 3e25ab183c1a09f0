#!/usr/bin/env python
"""Train and evaluate an attnzoo encoder-decoder on summarization with `Seq2SeqTrainer` (`predict_with_generate`),
scored with ROUGE-1/2/L/Lsum, distinct bigrams and, when the references state figures, the share of them reproduced
(`attnzoo.training.summary_metrics`).

Examples:

```bash
# CNN/DailyMail from the original .story files, split by the official URL lists
python scripts/run_summarization.py --config_path configs/models/dense_transformer/tiny.json \
    --tokenizer_name_or_path out/tokenizer \
    --train_file tests/fixtures/data/cnn_dailymail/cnn_stories \
    --train_url_list tests/fixtures/data/cnn_dailymail/url_lists/all_train.txt \
    --validation_file tests/fixtures/data/cnn_dailymail/cnn_stories \
    --validation_url_list tests/fixtures/data/cnn_dailymail/url_lists/all_val.txt \
    --max_source_length 512 --max_target_length 64 --predict_with_generate --max_steps 100 --output_dir out/cnndm

# PubMed in the Cohan et al. JSON-lines format, 4096-token inputs (a recipe)
python scripts/run_summarization.py configs/train/smart_bird_summarization_pubmed.yaml

# CNN/DailyMail from the Hub (network)
python scripts/run_summarization.py --dataset_name abisee/cnn_dailymail --dataset_config_name 3.0.0 ...
```
Generation settings (`num_beams`, `generation_max_new_tokens`, `no_repeat_ngram_size`, `length_penalty`) are written
into the model's generation config and saved with it. Outputs: `metrics.json`, `generated_predictions.txt`,
`training_curves.png`.
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
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)

import attnzoo  # noqa: F401  (registers every family with the Auto classes)
from attnzoo.training import (
    DataReport,
    GenerationLengthCallback,
    ModelArguments,
    SummarizationDataArguments,
    build_model,
    finish_run,
    load_summarization_splits,
    load_tokenizer,
    start_run,
    summary_metrics,
    tokenize_pairs,
    train_and_evaluate,
)

logger = logging.getLogger(__name__)


def encode(
    tokenizer: Any, columns: dict[str, list], data_args: Any, eos_token_id: int, report: DataReport, split: str
) -> Dataset:
    """
    Inputs as `[CLS] document [SEP]` cut to `max_source_length`; labels as `summary [SEP]` cut to
    `max_target_length` (the decoder starts from `decoder_start_token_id`, so labels carry no `[CLS]`). Truncated
    documents and summaries are counted separately.
    """
    encoded = tokenize_pairs(
        tokenizer,
        columns["document"],
        None,
        data_args.max_source_length,
        report,
        f"{split}_source",
        return_token_type_ids=False,
    )
    targets = tokenize_pairs(
        tokenizer,
        columns["summary"],
        None,
        data_args.max_target_length - 1,
        report,
        f"{split}_target",
        add_special_tokens=False,
    )
    encoded["labels"] = [ids + [eos_token_id] for ids in targets["input_ids"]]
    return Dataset.from_dict(encoded)


def main(argv: Sequence[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """
    Run summarization training and evaluation.

    Args:
        argv: command-line arguments (a recipe file first, optionally); defaults to `sys.argv[1:]`.
        callbacks: extra `TrainerCallback`s (e.g. [`~attnzoo.training.StopAtStepCallback`]).

    Returns:
        The content of `metrics.json`.
    """
    (model_args, data_args, training_args), checkpoint = start_run(
        (ModelArguments, SummarizationDataArguments, Seq2SeqTrainingArguments), argv
    )

    splits, report = load_summarization_splits(data_args, model_args.cache_dir)
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path, model_args.cache_dir)
    model, model_info = build_model(AutoModelForSeq2SeqLM, model_args, tokenizer)
    config = model.config
    if data_args.max_source_length > config.max_position_embeddings:
        raise ValueError(
            f"`max_source_length` ({data_args.max_source_length}) exceeds the model's `max_position_embeddings` "
            f"({config.max_position_embeddings})."
        )
    # The decoder reads at most `max_target_length` positions in training (the shifted labels) and
    # `generation_max_new_tokens` in generation (the start token and all generated tokens but the last).
    longest_target = max(data_args.max_target_length, data_args.generation_max_new_tokens)
    if longest_target > config.decoder_max_position_embeddings:
        raise ValueError(
            f"Targets of up to {longest_target} tokens (max_target_length / generation_max_new_tokens) exceed "
            f"the model's `decoder_max_position_embeddings` ({config.decoder_max_position_embeddings})."
        )
    generation = model.generation_config
    generation.max_new_tokens = data_args.generation_max_new_tokens
    generation.max_length = None
    generation.num_beams = data_args.num_beams
    generation.no_repeat_ngram_size = data_args.no_repeat_ngram_size
    generation.length_penalty = data_args.length_penalty
    generation.decoder_start_token_id = config.decoder_start_token_id
    generation.eos_token_id = config.eos_token_id
    generation.pad_token_id = config.pad_token_id

    datasets = {
        split: encode(tokenizer, columns, data_args, config.eos_token_id, report, split)
        for split, columns in splits.items()
    }
    report.log()
    train_dataset, eval_dataset = datasets.get("train"), datasets.get("validation")
    references = splits.get("validation", {}).get("summary", [])

    def compute_metrics(prediction: Any) -> dict[str, float]:
        generated = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        generated = np.where(generated < 0, tokenizer.pad_token_id, generated)
        texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
        # Score against the original reference text (its sentence lines feed ROUGE-Lsum), not decoded label ids.
        scores = summary_metrics(texts, references[: len(texts)])
        scores["gen_len"] = float(np.mean([(row != tokenizer.pad_token_id).sum() for row in generated]))
        if training_args.process_index == 0:
            out = Path(training_args.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "generated_predictions.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in texts))
        return scores

    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        data_collator=DataCollatorForSeq2Seq(
            tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=data_args.pad_to_multiple_of
        ),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
        callbacks=[GenerationLengthCallback(), *callbacks],
    )
    metrics = train_and_evaluate(
        trainer,
        train=train_dataset is not None,
        evaluate=eval_dataset is not None,
        checkpoint=checkpoint,
        max_seconds=data_args.max_train_seconds,
    )
    trainer.log_metrics("all", metrics)
    return finish_run(trainer, metrics, {"data": report.counts, "model": model_info})


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:
        # Bad arguments and bad data are user errors: one clear line, no traceback.
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)

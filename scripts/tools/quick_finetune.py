"""A short `Trainer` fine-tune of one family on the bundled IMDB reviews: does mixed-precision training run, stay
finite and learn on this device? The GPU validation (`scripts/tools/gpu_check.py`) runs it for every family.

No `datasets` needed (the GPU machine has none): the reviews are tokenized into a list of feature dicts, which
`Trainer` takes as a map-style dataset.
"""

from __future__ import annotations

import csv
import functools
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

from attnzoo.testing import config_from_file, family_by_name
from attnzoo.tokenization import train_wordpiece_tokenizer

REPO = Path(__file__).resolve().parents[2]  # scripts/tools/quick_finetune.py: the checkout
IMDB_FILE = REPO / "tests" / "fixtures" / "data" / "imdb" / "train.tsv"
#: Reviews held out for evaluation (the rest train).
EVAL_EXAMPLES = 64


def read_imdb(path: str | Path = IMDB_FILE) -> tuple[list[str], list[int]]:
    """Texts and 0/1 labels of a `text<TAB>label` file (the bundled IMDB slice), in a fixed shuffled order (the
    file is sorted by label, so a split of the file's order would hold one class only)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    random.Random(0).shuffle(rows)
    return [row["text"] for row in rows], [int(row["label"]) for row in rows]


@functools.lru_cache(maxsize=1)
def imdb_tokenizer(vocab_size: int = 8000):
    """A WordPiece tokenizer trained on the bundled IMDB reviews (cached per process)."""
    texts, _ = read_imdb()
    return train_wordpiece_tokenizer(texts, vocab_size=vocab_size, model_max_length=4096)


def _features(tokenizer, texts: list[str], labels: list[int], max_length: int) -> list[dict[str, Any]]:
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    return [
        {"input_ids": ids, "attention_mask": mask, "labels": label}
        for ids, mask, label in zip(encoded["input_ids"], encoded["attention_mask"], labels, strict=True)
    ]


def _accuracy(prediction) -> dict[str, float]:
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return {"accuracy": float((np.argmax(logits, -1) == prediction.label_ids).mean())}


def quick_finetune(
    family: str,
    output_dir: str | Path,
    *,
    size: str = "small",
    steps: int = 200,
    batch_size: int = 16,
    max_length: int = 512,
    learning_rate: float = 3e-4,
    precision: str = "bf16",
    use_cpu: bool = False,
    seed: int = 0,
    config_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune `family`'s sequence classifier from scratch on the bundled IMDB reviews with `Trainer`.

    Args:
        family (`str`): family name or model type.
        output_dir (`str` or `Path`): Trainer's output folder (nothing is saved there but its logs).
        size (`str`, *optional*, defaults to `"small"`): config file `configs/models/<family>/<size>.json`.
        steps (`int`, *optional*, defaults to 200): optimizer steps.
        batch_size (`int`, *optional*, defaults to 16): examples per step.
        max_length (`int`, *optional*, defaults to 512): reviews are truncated to this many tokens.
        learning_rate (`float`, *optional*, defaults to 3e-4): peak AdamW learning rate (linear decay, 10% warm-up).
        precision (`str`, *optional*, defaults to `"bf16"`): `"bf16"`, `"fp16"` (with Trainer's loss scaling) or
            `"fp32"`.
        use_cpu (`bool`, *optional*, defaults to `False`): train on the CPU even where CUDA exists (dry runs).
        seed (`int`, *optional*, defaults to 0): seed of the initialisation, data order and sampling.
        config_overrides (`dict`, *optional*): config fields to change (tests shrink the model with it).

    Returns:
        `dict` with `family`, `steps`, `first_loss` / `last_loss` (means of the first and last 10% of logged steps),
        `finite` (every logged loss and the final parameters), `eval_accuracy`, `train_seconds`,
        `train_samples_per_second`, `peak_memory_mb` (CUDA) and `device`.
    """
    if precision not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"`precision` must be 'bf16', 'fp16' or 'fp32', got {precision!r}.")
    tokenizer = imdb_tokenizer()
    texts, labels = read_imdb()
    overrides = {"vocab_size": len(tokenizer), "num_labels": 2, "max_position_embeddings": max_length}
    config_file = REPO / "configs" / "models" / family_by_name(family).name / f"{size}.json"
    config = config_from_file(family, config_file, **{**overrides, **(config_overrides or {})})
    torch.manual_seed(seed)
    model = family_by_name(family).sequence_classification_class(config)
    train = _features(tokenizer, texts[EVAL_EXAMPLES:], labels[EVAL_EXAMPLES:], max_length)
    evaluation = _features(tokenizer, texts[:EVAL_EXAMPLES], labels[:EVAL_EXAMPLES], max_length)
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=max(1, steps // 10),
        weight_decay=0.01,
        logging_steps=max(1, steps // 20),
        save_strategy="no",
        report_to=[],
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=use_cpu,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=_accuracy,
    )
    cuda = torch.cuda.is_available() and not use_cpu
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    metrics = trainer.evaluate()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    window = max(1, len(losses) // 10)
    finite = all(math.isfinite(loss) for loss in losses) and all(
        bool(torch.isfinite(p).all()) for p in model.parameters()
    )
    return {
        "family": family,
        "size": size,
        "precision": precision,
        "steps": trainer.state.global_step,
        "first_loss": float(np.mean(losses[:window])) if losses else None,
        "last_loss": float(np.mean(losses[-window:])) if losses else None,
        "finite": finite,
        "eval_accuracy": metrics.get("eval_accuracy"),
        "train_seconds": seconds,
        "train_samples_per_second": result.metrics.get("train_samples_per_second"),
        "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "device": str(trainer.args.device),
    }

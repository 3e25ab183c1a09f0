#!/usr/bin/env python
"""How much of IMDB's label each checkpoint's frozen features carry: a linear probe before any fine-tuning.

At the CPU profile's budget (60 steps of 8 reviews) the classifiers hardly move the encoder, so their accuracy is
mostly what the features they start from allow. This probe measures those features directly. Each checkpoint's
encoder is frozen and read over the first `--train` training reviews and all held-back reviews of the study's IMDB
split, each review read up to the model's length. A logistic regression is then fitted on the training features and
scored on the held-back ones. Its L2 strength is chosen by 5-fold cross-validation on the training features alone.
Three features are probed:

- `head`: what the checkpoint's classification head reads, `tanh(dense(pool(h)))`, with its own pooling
  (`classifier_pooling`: the first token in the dense family, the mean over the tokens in the sparse ones) and
  `dense` its `classifier.dense` (BERT's pooler after a conversion, carried through step 2);
- `cls`: the first token's last hidden state;
- `mean`: the mean of the last hidden states over the review's tokens.

    OMP_NUM_THREADS=1 python scripts/experiments/warm-start-real/feature_probe.py --work outputs/warm-start-real/cpu \\
        --checkpoints converted/dense_transformer-512 converted/sparse_transformer-1024 mlm/sparse_transformer-1024

Writes `<results>/feature_probe.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import attnzoo  # noqa: F401  (registers every family with the Auto classes)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the study's own modules, beside this file

import run as study_run  # noqa: E402

FEATURES = ("head", "cls", "mean")
#: The L2 strengths tried (inverse, as scikit-learn's `C`).
C_GRID = np.logspace(-4, 4, 10)


@torch.no_grad()
def encode(folder: Path, texts: list[str], batch_size: int = 8) -> dict[str, np.ndarray]:
    """The `FEATURES` of every text, `(len(texts), hidden)` each, in the order given."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    length = model.config.max_position_embeddings
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths together: little padding
    features = {name: np.zeros((len(texts), model.config.hidden_size), dtype=np.float32) for name in FEATURES}
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = tokenizer(
            [texts[i] for i in rows], truncation=True, max_length=length, padding=True, return_tensors="pt"
        )
        hidden = model.model(**batch)[0]  # (B, N, D)
        valid = batch["attention_mask"].to(hidden.dtype)[..., None]  # (B, N, 1)
        head = model.classifier
        features["head"][rows] = torch.tanh(head.dense(head.pooler(hidden, batch["attention_mask"]))).numpy()
        features["cls"][rows] = hidden[:, 0].numpy()
        features["mean"][rows] = ((hidden * valid).sum(1) / valid.sum(1)).numpy()
    return features


def probe(train: np.ndarray, train_labels: np.ndarray, held: np.ndarray, held_labels: np.ndarray) -> dict[str, Any]:
    """Held-back accuracy (%) of a logistic regression (features standardised) whose L2 strength 5-fold
    cross-validation on `train` chose from `C_GRID`."""

    def classifier(c: float) -> Any:
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))

    folds = StratifiedKFold(n_splits=5)
    cv = [cross_val_score(classifier(c), train, train_labels, cv=folds, scoring="accuracy").mean() for c in C_GRID]
    best = int(np.argmax(cv))
    fitted = classifier(C_GRID[best]).fit(train, train_labels)
    return {
        "accuracy": 100.0 * float((fitted.predict(held) == held_labels).mean()),
        "C": float(C_GRID[best]),
        "cv_accuracy": 100.0 * float(cv[best]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="the study's work folder (its data/ and models)")
    parser.add_argument("--checkpoints", nargs="+", required=True, help="folders under --work to probe")
    parser.add_argument("--train", type=int, default=400, help="training reviews the probe is fitted on")
    parser.add_argument("--results", type=Path, help="folder of the record (default: the study's results/cpu)")
    args = parser.parse_args(argv)
    root = study_run.ROOT
    work = args.work if args.work.is_absolute() else root / args.work
    train = study_run.read_jsonl(work / "data" / "imdb_train.jsonl")[: args.train]
    held = study_run.read_jsonl(work / "data" / "imdb_validation.jsonl")
    labels = {name: np.array([row["label"] for row in rows]) for name, rows in (("train", train), ("held", held))}
    record: dict[str, Any] = {
        "ran_on": study_run.git_state(),
        "train_reviews": len(train),
        "held_back_reviews": len(held),
        "rows": {},
    }
    for name in args.checkpoints:
        features = encode(work / name, [row["text"] for row in train + held])
        row: dict[str, Any] = {
            # `spread`: how much a feature varies between reviews (standard deviation, mean over dimensions), which
            # sets how far a fresh output layer's logits move per step.
            feature: probe(values[: len(train)], labels["train"], values[len(train) :], labels["held"])
            | {"spread": float(values.std(axis=0).mean())}
            for feature, values in features.items()
        }
        record["rows"][name] = row
        print(name, json.dumps(row), flush=True)
    results = args.results or study_run.STUDY / "results" / "cpu"
    path = (results if results.is_absolute() else root / results) / "feature_probe.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


if __name__ == "__main__":
    main()

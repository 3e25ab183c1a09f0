"""Offline metrics with the official definitions: GLUE (scikit-learn / scipy, as `evaluate`'s `glue` metric) and
ROUGE-1/2/L/Lsum (Google's `rouge_score` with Porter stemming, Lsum over newline-separated sentences).

No metric script is downloaded; the values agree with `evaluate.load("glue", task)` and `evaluate.load("rouge")`
(aggregated as plain means of per-example F-measures, times 100 for ROUGE).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from .data import split_sentences

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def glue_metrics(task: str, predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """
    The official metric(s) of a GLUE task.

    CoLA: Matthews correlation; STS-B: Pearson and Spearman correlations; MRPC and QQP: accuracy and F1 of the
    positive class; every other task: accuracy.

    Args:
        task (`str`): Hub configuration name (`"cola"`, `"stsb"`, ...).
        predictions: predicted class ids (scores for STS-B).
        labels: gold class ids (scores for STS-B).
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if task == "cola":
        return {"matthews_correlation": float(matthews_corrcoef(labels, predictions))}
    if task == "stsb":
        return {
            "pearson": float(pearsonr(predictions, labels)[0]),
            "spearmanr": float(spearmanr(predictions, labels)[0]),
        }
    if task in ("mrpc", "qqp"):
        return {
            "accuracy": float(accuracy_score(labels, predictions)),
            "f1": float(f1_score(labels, predictions)),
        }
    return {"accuracy": float(accuracy_score(labels, predictions))}


def classification_metrics(predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """Accuracy and macro-averaged F1 of a text classification data set (IMDB, AG News, ...)."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return {
        "accuracy": float(accuracy_score(labels, predictions)),
        "macro_f1": float(f1_score(labels, predictions, average="macro")),
    }


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """
    ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum F-measures (x100, mean over examples), with stemming.

    ROUGE-Lsum is the summary-level LCS over sentences: both sides are split into sentences with
    [`~attnzoo.training.split_sentences`] and joined by newlines, which is how `rouge_score` delimits them.
    ROUGE-L is computed on the text as a single sequence.
    """
    from rouge_score import rouge_scorer

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references.")
    if not predictions:
        raise ValueError("No predictions to score.")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for prediction, reference in zip(predictions, references, strict=True):
        scores = scorer.score("\n".join(split_sentences(reference)), "\n".join(split_sentences(prediction)))
        for key in ROUGE_TYPES:
            totals[key] += scores[key].fmeasure
    return {key: 100.0 * value / len(predictions) for key, value in totals.items()}

"""Offline metrics with the official definitions: GLUE (scikit-learn / scipy, as `evaluate`'s `glue` metric) and
ROUGE-1/2/L/Lsum (Google's `rouge_score` with Porter stemming, Lsum over newline-separated sentences).

No metric script is downloaded; the values agree with `evaluate.load("glue", task)` and `evaluate.load("rouge")`
(aggregated as plain means of per-example F-measures, times 100 for ROUGE).

Two summary checks of our own sit beside ROUGE: [`numbers_reproduced`], the share of a reference's figures that a
summary states (what ECTSum's bullet points are about), and [`distinct_ngrams`], which tells apart summaries that
read their documents from one string written for all of them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal

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


# A figure: digits with optional thousands separators and a decimal part, not glued to a word on its left (`q1`,
# `fy2021` and `covid19` name things; `$1.01`, `7.5%`, `2,850` and `2021` are figures).
_NUMBER = re.compile(r"(?<![A-Za-z0-9])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
# WordPiece decoding puts a space after the separator inside a figure (`$1.01` comes back as `$ 1. 01`).
_SPLIT_FIGURE = re.compile(r"(?<=\d)([.,]) (?=\d)")


def extract_numbers(text: str) -> list[str]:
    """
    The figures of `text` in order, each as a canonical decimal string (`"2,850.50"` -> `"2850.5"`, `"3.0"` -> `"3"`).

    A separator followed by one space between digits is read as inside the figure (`"1. 01"` is `1.01`): that is how
    a WordPiece tokenizer decodes figures, and both sides of a comparison are read the same way. The price: a
    sentence that ends in a figure and whose next one starts with digits (`"... in 2021. 5 analysts"`) gives one
    figure (`2021.5`). Digits glued to a letter on their left (`q1`, `fy2021`) are not figures.
    """
    joined = _SPLIT_FIGURE.sub(r"\1", text)
    return [format(Decimal(match.replace(",", "")).normalize(), "f") for match in _NUMBER.findall(joined)]


def numbers_reproduced(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """
    The share of a reference's figures (see [`extract_numbers`]) that its summary states, in percent: per example
    the figures both share, counted with multiplicity as ROUGE counts words, over the reference's; averaged over the
    examples whose reference states a figure.

    Args:
        predictions (`Sequence[str]`): generated summaries.
        references (`Sequence[str]`): their references, in the same order.

    Returns:
        `dict` with `numbers_reproduced` (percent), `numbers_scored` (examples with a figure in the reference) and
        `reference_numbers` (figures in those references).

    Raises:
        ValueError: the two lists differ in length, are empty, or no reference states a figure.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references.")
    if not predictions:
        raise ValueError("No predictions to score.")
    shares, total = [], 0
    for prediction, reference in zip(predictions, references, strict=True):
        wanted = Counter(extract_numbers(reference))
        if not wanted:
            continue
        found = wanted & Counter(extract_numbers(prediction))
        shares.append(sum(found.values()) / sum(wanted.values()))
        total += sum(wanted.values())
    if not shares:
        raise ValueError("No reference states a figure: the share of figures reproduced is undefined.")
    return {
        "numbers_reproduced": 100.0 * sum(shares) / len(shares),
        "numbers_scored": float(len(shares)),
        "reference_numbers": float(total),
    }


def distinct_ngrams(texts: Sequence[str], n: int = 2) -> dict[str, float]:
    """
    Distinct-n (Li et al., 2016): the different word n-grams of all `texts` over all their n-grams, in percent, with
    the count of different n-grams. Summaries that copy one template score low; the same summary for every document
    scores the share of one summary's n-grams in all.

    Args:
        texts (`Sequence[str]`): the summaries (lower-cased and split on whitespace).
        n (`int`, *optional*, defaults to 2): the n-gram order.

    Returns:
        `dict` with `distinct_<n>grams` (percent; 0 when no text has n words) and `different_<n>grams`.
    """
    if n < 1:
        raise ValueError(f"`n` must be a positive integer, got {n}.")
    grams: list[tuple[str, ...]] = []
    for text in texts:
        words = text.lower().split()
        grams.extend(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    different = len(set(grams))
    return {
        f"distinct_{n}grams": 100.0 * different / len(grams) if grams else 0.0,
        f"different_{n}grams": float(different),
    }


def summary_metrics(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """
    What a summarizer is scored on: [`rouge_scores`], [`distinct_ngrams`] of order 2 and, when a reference states a
    figure, [`numbers_reproduced`] (left out otherwise, as the share is then undefined).

    Args:
        predictions (`Sequence[str]`): generated summaries.
        references (`Sequence[str]`): their references, in the same order.

    Returns:
        `dict` of the three metrics' values, under their own keys.
    """
    scores = {**rouge_scores(predictions, references), **distinct_ngrams(predictions, 2)}
    if any(extract_numbers(reference) for reference in references):
        scores.update(numbers_reproduced(predictions, references))
    return scores

"""The byte n-gram yardstick of LRA Text."""

from __future__ import annotations

import random

import pytest

from attnzoo.evaluation.byte_ngrams import byte_ngram_accuracy


def _documents(count: int, seed: int) -> list[tuple[bytes, int]]:
    """Filler bytes, then a word that gives the label 100 bytes in: readable whole, invisible in the first 60."""
    rng = random.Random(seed)
    documents = []
    for index in range(count):
        filler = bytes(rng.choice(b"abcdefghij ") for _ in range(100))
        documents.append((filler + (b" superb " if index % 2 else b" awful ") + filler[:20], index % 2))
    return documents


def test_the_yardstick_reads_what_it_is_given_and_no_more():
    train, validation = _documents(200, 0), _documents(100, 1)
    assert byte_ngram_accuracy(train, validation) == 1.0
    cut = byte_ngram_accuracy([(t[:60], y) for t, y in train], [(t[:60], y) for t, y in validation])
    assert 0.3 <= cut <= 0.7  # the label lies beyond the cut: chance


def test_the_yardstick_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="two labels"):
        byte_ngram_accuracy([(b"abc", 1), (b"abd", 1)], [(b"abc", 0)])
    with pytest.raises(ValueError, match="at least one"):
        byte_ngram_accuracy([], [(b"abc", 0)])

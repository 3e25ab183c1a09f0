"""Fixtures of the long-input evaluation tests."""

from __future__ import annotations

import pytest

from attnzoo.evaluation import read_reviews
from source_checkout import REVIEWS_FILE


@pytest.fixture(scope="module")
def reviews_file(tmp_path_factory):
    """40 shipped reviews (20 per class), a few of them long, in the shipped file's layout."""
    reviews = read_reviews(REVIEWS_FILE)
    rows = [r for r in reviews if r[1] == 1][:20] + [r for r in reviews if r[1] == 0][:20]
    path = tmp_path_factory.mktemp("imdb") / "reviews.tsv"
    lines = ["text\tlabel"] + [f"{text.replace(chr(9), ' ')}\t{label}" for text, label in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

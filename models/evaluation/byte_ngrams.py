"""A shallow yardstick for LRA Text: a bag of byte n-grams read from the same truncated bytes the models get.

How much a length cut costs a model that needs no attention at all says how much reading further can be worth on this
data, so a gap between a sparse family at 4K and dense attention at 1K can be read against it.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Byte n-gram orders of the yardstick; sklearn's defaults otherwise (no setting was tuned on the validation split).
NGRAM_RANGE = (2, 5)


def byte_ngram_accuracy(
    train: Sequence[tuple[bytes, int]], validation: Sequence[tuple[bytes, int]], *, min_df: int = 2
) -> float:
    """Validation accuracy of a logistic regression on TF-IDF weighted byte 2- to 5-grams (sublinear counts).

    Args:
        train / validation: `(bytes, label)` pairs, already cut to what the models read.
        min_df: n-grams seen in fewer training documents are dropped.

    Raises:
        ValueError: `train` or `validation` is empty, or the training labels are all the same.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    if not train or not validation:
        raise ValueError("byte_ngram_accuracy needs at least one training and one validation example.")
    labels = [label for _, label in train]
    if len(set(labels)) < 2:
        raise ValueError("byte_ngram_accuracy needs training examples of at least two labels.")
    # latin-1 maps every byte to one character, so character n-grams are byte n-grams (a cut UTF-8 sequence stays).
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=NGRAM_RANGE, sublinear_tf=True, min_df=min_df)
    features = vectorizer.fit_transform([text.decode("latin-1") for text, _ in train])
    classifier = LogisticRegression(max_iter=2000).fit(features, labels)
    predictions = classifier.predict(vectorizer.transform([text.decode("latin-1") for text, _ in validation]))
    return float(sum(int(p == label) for p, (_, label) in zip(predictions, validation, strict=True)) / len(validation))

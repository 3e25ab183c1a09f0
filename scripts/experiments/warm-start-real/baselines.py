"""The extractive reference points of the summarization table: the transcript's first sentences (lead) and the greedy
extractive oracle, the transcript sentences that together match the reference best (an upper bound for any summary
made of whole transcript sentences, and a loose one for a written summary).

Both are scored like the models' summaries (`attnzoo.training.metrics`); the oracle chooses its sentences with the
same words ROUGE counts (`rouge_score`'s tokenizer with Porter stemming).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rouge_score.tokenizers import DefaultTokenizer

from attnzoo.training.metrics import rouge_scores

#: Lead lengths tried on the training calls; the best one is used on the validation calls.
LEAD_CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 10)


def lead(sentences: Sequence[str], k: int) -> str:
    """The first `k` sentences, one per line."""
    if k < 1:
        raise ValueError(f"A lead has at least one sentence, got k={k}.")
    return "\n".join(sentences[:k])


def choose_lead_length(
    documents: Sequence[Sequence[str]], references: Sequence[str], candidates: Sequence[int] = LEAD_CANDIDATES
) -> tuple[int, dict[int, float]]:
    """
    The lead length with the best mean ROUGE-2 on `documents` (training calls: the validation ones are not looked
    at), the shorter on a tie.

    Returns:
        `(k, {k: ROUGE-2 of every candidate})`.
    """
    scores = {k: rouge_scores([lead(doc, k) for doc in documents], references)["rouge2"] for k in candidates}
    best = max(scores.values())
    return min(k for k, score in scores.items() if score == best), scores


def _f1(overlap: int, chosen: int, wanted: int) -> float:
    if overlap == 0:
        return 0.0
    precision, recall = overlap / chosen, overlap / wanted
    return 2 * precision * recall / (precision + recall)


def _grams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def greedy_oracle(sentences: Sequence[str], reference: str, tokenizer: DefaultTokenizer | None = None) -> list[int]:
    """
    The indices (in document order) of the sentences a greedy search picks: each round adds the sentence that raises
    ROUGE-1 F + ROUGE-2 F of the chosen set against `reference` most, until no sentence raises it.

    N-grams are counted per sentence and summed, so a bigram across two chosen sentences does not count: the set is
    scored as separate sentences, which is what a summary made of them is.
    """
    tokenizer = tokenizer or DefaultTokenizer(use_stemmer=True)
    wanted_tokens = tokenizer.tokenize(reference)
    wanted = {n: _grams(wanted_tokens, n) for n in (1, 2)}
    totals = {n: max(1, sum(wanted[n].values())) for n in (1, 2)}
    grams = [{n: _grams(tokenizer.tokenize(sentence), n) for n in (1, 2)} for sentence in sentences]
    chosen: list[int] = []
    counts = {1: Counter(), 2: Counter()}
    best = 0.0
    while True:
        candidate, candidate_score = None, best
        for index, own in enumerate(grams):
            if index in chosen:
                continue
            score = 0.0
            for n in (1, 2):
                union = counts[n] + own[n]
                score += _f1(sum((union & wanted[n]).values()), sum(union.values()), totals[n])
            if score > candidate_score:
                candidate, candidate_score = index, score
        if candidate is None:
            return sorted(chosen)
        chosen.append(candidate)
        for n in (1, 2):
            counts[n] += grams[candidate][n]
        best = candidate_score


def oracle_summary(sentences: Sequence[str], reference: str, tokenizer: DefaultTokenizer | None = None) -> str:
    """The sentences [`greedy_oracle`] picks, one per line in document order."""
    return "\n".join(sentences[i] for i in greedy_oracle(sentences, reference, tokenizer))

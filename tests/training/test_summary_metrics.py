"""The summary checks beside ROUGE: the share of the reference's figures a summary states, and distinct bigrams."""

from __future__ import annotations

import pytest
from transformers import BertTokenizerFast

from attnzoo.training.metrics import distinct_ngrams, extract_numbers, numbers_reproduced, summary_metrics


def test_figures_are_read_as_values_and_names_are_not_figures():
    text = "q1 adjusted eps $1.01, revenue $2,850.50 million (up 7.50%); fy2021 guidance of 3.0 to 4 in 2021, 5 deals."
    assert extract_numbers(text) == ["1.01", "2850.5", "7.5", "3", "4", "2021", "5"]
    assert extract_numbers("no figures here, q4 and covid19 only") == []


def test_a_wordpiece_round_trip_keeps_the_figures(tmp_path):
    """BERT's tokenizer decodes `$1.01` as `$ 1. 01`: the figures of a decoded summary are those it was given."""
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "$", ".", ",", "%", "eps", "revenue", "million", "up"]
    vocabulary += [str(digit) for digit in range(10)] + ["01", "850", "50", "##5"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(str(tmp_path / "vocab.txt"))
    text = "eps $1.01, revenue $2,850.50 million, up 7.5%"
    decoded = tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True)
    assert decoded != text  # the spaces the decoding adds
    assert extract_numbers(decoded) == extract_numbers(text) == ["1.01", "2850.5", "7.5"]


def test_share_counts_each_figure_as_often_as_the_reference_states_it():
    references = ["eps $1.01; sees 2021 eps $1.01 to $1.10", "revenue $5 million", "no figure in this one"]
    predictions = ["eps $ 1. 01 and 1.10", "revenue 5.0 million, 5 and 5 again", "7 invented figures"]
    result = numbers_reproduced(predictions, references)
    # First: 1.01 once of twice, 1.10 yes, 2021 no -> 2 of 4; second: 5 of 5 -> 1 of 1 (extra copies do not count);
    # third: no figure to reproduce, not scored.
    assert result["numbers_reproduced"] == pytest.approx(100 * (2 / 4 + 1 / 1) / 2)
    assert (result["numbers_scored"], result["reference_numbers"]) == (2, 5)
    assert numbers_reproduced(references, references)["numbers_reproduced"] == 100.0
    assert numbers_reproduced(["nothing"] * 3, references)["numbers_reproduced"] == 0.0


def test_share_refuses_what_it_cannot_score():
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        numbers_reproduced(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="No predictions"):
        numbers_reproduced([], [])
    with pytest.raises(ValueError, match="No reference states a figure"):
        numbers_reproduced(["1 2 3"], ["no figures"])


def test_distinct_bigrams_tell_one_summary_for_all_from_different_ones():
    different = distinct_ngrams(["revenue rose 5%", "eps fell to $1", "sees strong year"])
    assert different == {"distinct_2grams": 100.0, "different_2grams": 7.0}
    constant = distinct_ngrams(["revenue rose 5%"] * 3)
    assert constant == {"distinct_2grams": pytest.approx(100 / 3), "different_2grams": 2.0}
    assert distinct_ngrams(["Revenue rose", "revenue ROSE"], n=2)["distinct_2grams"] == 50.0  # lower-cased
    assert distinct_ngrams(["one"])["distinct_2grams"] == 0.0
    with pytest.raises(ValueError, match="positive integer"):
        distinct_ngrams(["a b"], n=0)


def test_summary_metrics_score_the_figures_only_where_a_reference_states_one():
    predictions, references = ["revenue rose 5% to $2.1 billion", "sees a strong year"], ["revenue up 5%.", "eps $1."]
    scores = summary_metrics(predictions, references)
    assert {"rouge1", "rouge2", "rougeL", "rougeLsum", "distinct_2grams", "different_2grams"} <= set(scores)
    assert scores["numbers_reproduced"] == 50.0  # all of the first reference's figures, none of the second's
    assert scores["numbers_scored"] == 2.0
    # News summaries without figures: the share is undefined, so it is left out rather than an error mid-training.
    plain = summary_metrics(["the cat sat"], ["a cat sat down"])
    assert "numbers_reproduced" not in plain and plain["rouge1"] > 0

"""ListOps: the evaluator reproduces the original labels; the generator is seeded and keeps LRA's ranges."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from attnzoo.training.data.listops import (
    CLOSE,
    OPERATORS,
    ListOpsSettings,
    evaluate_listops,
    generate_listops,
    sample_listops,
    shallow_baselines,
)

ORIGINAL = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "listops" / "nangia2018_first100.tsv"


def test_evaluator_reproduces_every_label_of_the_original_test_rows():
    rows = [line.rstrip("\n").split("\t") for line in ORIGINAL.read_text().splitlines()]
    assert len(rows) == 100
    assert [evaluate_listops(expr.split()) for _, expr in rows] == [int(label) for label, _ in rows]


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[MED 1 2 3 4 ]", 2),  # int(2.5): the median of an even count is truncated
        ("[SM 9 9 [MIN 5 6 ] ]", 3),
        ("[MIN [MAX 1 2 ] [SM 5 5 ] ]", 0),
    ],
)
def test_evaluator_semantics(expression, value):
    assert evaluate_listops(expression.split()) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [("[MAX 1 2", "Unterminated"), ("1 ]", "outside"), ("[MAX ]", "no arguments"), ("[MAX 1 ] 2", "after the end")],
)
def test_malformed_expressions_are_refused(expression, message):
    with pytest.raises(ValueError, match=message):
        evaluate_listops(expression.split())


def test_generator_respects_lengths_depth_and_arity_and_is_seeded():
    settings = ListOpsSettings(min_length=60, max_length=200, max_depth=4, max_args=5)
    a = generate_listops(7, settings)
    b = generate_listops(7, settings)
    examples = [next(a) for _ in range(50)]
    assert examples == [next(b) for _ in range(50)]
    assert examples != [next(generate_listops(8, settings)) for _ in range(50)]
    for tokens, label in examples:
        assert 60 <= len(tokens) <= 200
        assert label == evaluate_listops(tokens)
        depth = deepest = 0
        arity: list[int] = []
        for token in tokens:
            if token in OPERATORS:
                depth += 1
                deepest = max(deepest, depth)
                if arity:
                    arity[-1] += 1
                arity.append(0)
            elif token == CLOSE:
                depth -= 1
                assert 2 <= arity.pop() <= 5
            else:
                arity[-1] += 1
        assert depth == 0 and deepest <= 4


def test_default_settings_are_lra_s_and_cover_every_class():
    settings = ListOpsSettings()
    assert (settings.min_length, settings.max_length, settings.max_depth, settings.max_args) == (500, 2000, 10, 10)
    rng = random.Random(0)
    labels = {sample_listops(rng)[1] for _ in range(200)}
    assert labels == set(range(10))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_length"):
        ListOpsSettings(min_length=10, max_length=5)
    with pytest.raises(ValueError, match="branch_probability"):
        ListOpsSettings(branch_probability=1.0)


def test_shallow_baselines_fit_on_train_and_score_validation():
    train = [(["[MAX", "9", "]"], 9), (["[MAX", "1", "9", "]"], 9), (["[MIN", "0", "]"], 0), (["[SM", "4", "]"], 4)]
    train += [(["[SM", "7", "]"], 7), (["[SM", "7", "0", "]"], 7), (["[MAX", "2", "9", "]"], 9)]
    validation = [(["[MAX", "9", "]"], 9), (["[MIN", "0", "]"], 0), (["[SM", "7", "]"], 7), (["[MED", "3", "]"], 3)]
    # Majority label 9 is right once; per operator MAX->9, MIN->0, SM->7, and the unseen MED falls back to 9.
    assert shallow_baselines(train, validation) == {"majority_class": 0.25, "first_operator": 0.75}
    with pytest.raises(ValueError, match="at least one"):
        shallow_baselines([], validation)


def test_the_first_operator_alone_scores_near_lra_transformer_level():
    # Why ListOps results near 36% say little about long-range reading: one token predicts that much.
    trees = generate_listops(3)
    train = [next(trees) for _ in range(600)]
    validation = [next(trees) for _ in range(400)]
    scores = shallow_baselines(train, validation)
    assert 0.12 <= scores["majority_class"] <= 0.24
    assert 0.30 <= scores["first_operator"] <= 0.45

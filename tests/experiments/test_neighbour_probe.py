"""`scripts/experiments/neighbour-probe/run.py`: the pair task gives a symbol away by its partner only; every row is
trained."""

from __future__ import annotations

import json
import math

import pytest

from attnzoo.evaluation.tasks import CLS_ID, FIRST_SYMBOL_ID, SEP_ID


def test_pair_task_pairs_each_symbol_with_a_fixed_function_of_it(load_script):
    probe = load_script("experiments/neighbour-probe/run")
    task = probe.pair_task(8, examples=50)
    stream = task.train_stream(0)
    examples = [next(stream) for _ in range(50)]
    assert task.length == 10 and task.vocab_size == FIRST_SYMBOL_ID + probe.PAIR_SYMBOLS
    partners = {}
    for ids, _ in examples:
        assert ids[0] == CLS_ID and ids[-1] == SEP_ID and len(ids) == 10
        symbols = [i - FIRST_SYMBOL_ID for i in ids[1:-1]]
        for first, second in zip(symbols[::2], symbols[1::2], strict=True):
            assert partners.setdefault(first, second) == second  # a function of the first symbol
    # ... and a one-to-one one, so either symbol of a pair gives the other away.
    assert len(set(partners.values())) == len(partners) > 30
    with pytest.raises(ValueError, match="even length"):
        probe.pair_task(7)


def test_probe_trains_every_row_on_the_same_batches_and_writes_the_curves(load_script, tmp_path):
    probe = load_script("experiments/neighbour-probe/run")
    output = tmp_path / "probe.json"
    argv = ["--length", "16", "--steps", "3", "--warmup_steps", "3"]
    argv += ["--families", "dense_transformer", "a2former", "--hf_bert"]
    results = probe.main([*argv, "--threads", "1", "--output", str(output)])
    assert json.loads(output.read_text()) == results
    assert list(results["rows"]) == ["dense_transformer", "a2former", "hf:bert"]
    # Three steps from initialisation: every row still predicts about uniformly over the task's symbols.
    for curve in results["rows"].values():
        assert len(curve) == 1 and curve[0]["loss"] == pytest.approx(math.log(FIRST_SYMBOL_ID + 40), abs=0.6)

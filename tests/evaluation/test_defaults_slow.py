"""Slow: every family's default classifier learns the majority-token task (issue 18's learning check)."""

from __future__ import annotations

import pytest

from attnzoo.registry import FAMILIES
from attnzoo.testing import majority_token_accuracy


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_default_classifier_learns_the_majority_token_task(model_type):
    assert majority_token_accuracy(FAMILIES[model_type].name) >= 0.9

"""Slow check: a tiny Sparse Transformer learns bundled SST-2 about as well as the dense family trained identically."""

from __future__ import annotations

import pytest

import attnzoo.sparse_transformer  # noqa: F401  (registers the family)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {},  # tiny.json: strided pattern, split heads, l = 8
        {"sparse_pattern": "fixed", "sparse_head_assignment": "merged", "sparse_stride": 8, "sparse_summary_size": 2},
    ],
    ids=["strided-split", "fixed-merged"],
)
def test_sst2_accuracy_within_five_points_of_dense(overrides):
    from attnzoo.testing import train_and_eval_sst2

    dense = train_and_eval_sst2("dense", {}, steps=300, seed=0)["accuracy"]
    sparse = train_and_eval_sst2("sparse_transformer", overrides, steps=300, seed=0)["accuracy"]
    assert sparse > 0.6, f"Sparse Transformer accuracy {sparse:.3f} is not well above chance"
    assert sparse >= dense - 0.05, f"Sparse Transformer {sparse:.3f} vs dense {dense:.3f}"

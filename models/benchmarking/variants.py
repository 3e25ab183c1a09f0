"""Benchmark variants: extra rows that `scripts/benchmark.py` times next to each family's default configuration.

A variant is a set of config overrides, or a function of the sequence length returning them (for settings that
must scale with `N`). Rows are named `<family>:<variant>` (`"sbm:fastrg-2%"`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

Overrides = dict | Callable[[int], dict]


def fastrg_fixed_degree(length: int) -> dict:
    """SBM's fastRG backend with about 60 keys per query at every N (1.5% of the pairs at N=4096):
    `exploration_delta = 0.01 * 4096 / N` and a membership-logit bias of `-2.6 - ln(N / 4096) / 2`."""
    # With a fixed delta the exploration edges alone are delta * N^2, so the paper's delta = 0.01 keeps every model
    # quadratic; a regularised model at a fixed degree needs delta ~ 1/N. The SBM part of p_ij scales like
    # sigmoid(bias)^2 ~ exp(2 * bias), so lowering the bias by ln(2) / 2 per doubling of N halves its density.
    scale = length / 4096
    return {
        "sampling_backend": "fastrg",
        "exploration_delta": min(0.01 / scale, 1.0),
        "membership_logit_bias": -2.6 - math.log(scale) / 2,
    }


#: Family name -> variant name -> overrides.
VARIANTS: dict[str, dict[str, Overrides]] = {
    "a2former": {"linear_weights": {"attention_weights": "linear"}},
    # The paper's FFN of 2x the width (the harness gives every family the same FFN, 4x), the dense "FAT" ablation
    # (attention over the pooled cross without sparsity), the paper's index predictor (untrained, its edges all land
    # near the middle of the sequence instead of around each key), and the global keys in one softmax with the
    # predicted edges (the default gives them their own: one more softmax group).
    "fsat": {
        "ffn_2x": {"intermediate_size": 512},
        "fat_dense": {"use_sparse": False},
        "paper_predictor": {"index_prior": "none"},
        "shared_global_softmax": {"global_key_softmax": "shared"},
    },
    # The default row is `sampling_backend="auto"`, which picks the dense-Bernoulli backend at an unregularised
    # model's ~26% density (an edge list of 26% of the N^2 pairs needs several GB at N=4096 and is slower than the
    # dense mask there). These put both backends at ~1.5% density with a constant membership-logit bias; trained
    # models reach such densities through the regulariser (`sparsity_weight` >= 1e-2 in the paper's Table 2).
    "sbm": {
        "bernoulli-2%": {"sampling_backend": "bernoulli", "membership_logit_bias": -2.6},
        "fastrg-2%": {"sampling_backend": "fastrg", "membership_logit_bias": -2.6},
        # Edges growing like N instead of N^2: how the fastRG backend's cost follows the number of edges.
        "fastrg-60/query": fastrg_fixed_degree,
        # The price of the default estimator: the dense backend's straight-through gradient for the unsampled pairs
        # (`ste_all_pairs=None`); `False` is the paper's estimator alone.
        "sampled-ste": {"ste_all_pairs": False},
    },
    # The deterministic top-K ablation of Figure 4 (no sampling at all): what the exact per-head sampler costs on
    # top of the sketch.
    "smart_bird": {"topk_ablation": {"sampling_function": "topk"}},
    # The default is split strided heads.
    "sparse_transformer": {
        "fixed_split": {"sparse_pattern": "fixed", "sparse_head_assignment": "split"},
        "fixed_merged": {"sparse_pattern": "fixed", "sparse_head_assignment": "merged"},
        "strided_merged": {"sparse_head_assignment": "merged"},
        # The other CUDA fast path: reshapes into SDPA and attnzoo's Triton edge kernel, against the FlexAttention
        # call that the default ("fast") takes on CUDA; the faster one should be the default.
        "triton_kernels": {"attention_backend": "triton"},
    },
}

"""FSAT's slot selection and index prior: the `floor(I_bar)` slots with -1 where dropped, and the prior cached per
(length, scale, device) against the one built from a lengths tensor."""

from __future__ import annotations

import torch

from attnzoo.fsat import FSATConfig
from attnzoo.fsat.attention_fsat import FSATAttention

N, D, H = 4, 8, 2


def module(**overrides) -> FSATAttention:
    torch.manual_seed(0)
    fields = {"vocab_size": 50, "hidden_size": D, "num_attention_heads": H, "intermediate_size": 2 * D}
    fields |= {"num_dominant_indices": 2, "num_random_indices": 0, "index_scale": "sequence_length", **overrides}
    return FSATAttention(FSATConfig(**fields)).eval()


def predictions() -> torch.Tensor:
    """`(1, H, N, 2)` predictions per key: in range, just below a boundary, at N, above it and NaN."""
    head = torch.tensor([[0.0, 0.99], [1.0, 3.999], [4.0, 7.5], [float("nan"), 2.5]])
    return torch.stack((head, head.flip(0)))[None]


def slots(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


def test_slots_hold_the_floor_of_each_prediction_and_drop_out_of_range_and_nan():
    selected = module().select_slots(predictions(), None)
    head = slots([[0, 0], [1, 3], [-1, -1], [-1, 2]])
    assert selected.query.is_contiguous()
    assert torch.equal(selected.query, torch.stack((head, head.flip(0)))[None])
    torch.testing.assert_close(selected.mean, predictions(), equal_nan=True)


def test_slots_of_padded_keys_and_to_padded_queries_are_dropped():
    valid = torch.tensor([[True, True, False, True]])  # a hole at position 2
    selected = module().select_slots(predictions(), valid)
    # Key 2 is padding (its slots go); query 2 is padding (the predictions 2.5 go).
    first = slots([[0, 0], [1, 3], [-1, -1], [-1, -1]])
    second = slots([[-1, -1], [-1, -1], [-1, -1], [0, 0]])
    assert torch.equal(selected.query, torch.stack((first, second))[None])


def test_the_cached_key_position_prior_equals_the_one_built_from_lengths():
    attention = module(num_dominant_indices=3)
    cross = torch.randn(2, 6, D)
    cached = attention.predict_indices(cross, None)  # scale N: the cached prior
    built = attention.predict_indices(cross, torch.tensor([6, 6]))  # a lengths tensor: built on the call
    assert torch.equal(cached, built)
    assert attention.predict_indices(cross, None) is not cached  # the prior is cached, not the predictions
    with torch.no_grad():  # written in the kernels' (b, h, j, m) order, the same values
        laid_out = attention.predict_indices(cross, None)
    assert laid_out.is_contiguous() and not cached.is_contiguous() and torch.equal(laid_out, cached)
    # Untrained keys predict around themselves: with a zero predictor, key j's predictions are j + 0.5.
    torch.nn.init.zeros_(attention.index_predictor.weight)
    torch.nn.init.zeros_(attention.index_predictor.bias)
    centred = attention.predict_indices(cross, None)
    torch.testing.assert_close(centred, (torch.arange(6) + 0.5).view(1, 1, 6, 1).expand_as(centred))

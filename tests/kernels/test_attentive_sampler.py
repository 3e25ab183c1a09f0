"""Smart Bird's Triton attentive sampler: the literal sampler's keys for the same noise, its torch reference's keys for
the same counter seed, and the literal sampler's inclusion frequencies.

On CPU the kernel runs under Triton's interpreter (`tests/conftest.py`), whose cost is per Triton call, so the shapes
are small; some still span several query blocks and key tiles (`_INTERPRETED_BLOCK_M`, `_INTERPRETED_BLOCK_N`), so the
per-tile skip and the merge of a row's kept keys across tiles run. With CUDA the same cases run compiled.
"""

from __future__ import annotations

import pytest
import torch

from attnzoo.smart_bird.philox import counter_noise_rows, philox4x32
from attnzoo.smart_bird.sampling import sample_keys, sample_keys_reference, score_bounds, sketch_logits
from triton_devices import TRITON_DEVICES as DEVICES

pytest.importorskip("triton")
from attnzoo.kernels.triton.sampling import (  # noqa: E402  (after the importorskip)
    _INTERPRETED_BLOCK_M,
    _INTERPRETED_BLOCK_N,
    attentive_sample_triton,
)

#: more query rows and keys than one interpreted block and tile hold
N, K = _INTERPRETED_BLOCK_N + 22, 3
assert N > _INTERPRETED_BLOCK_M


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def _sketch(scale: float, device: str, batch: int, length: int = N, seed: int = 1):
    """Random sketch rows; example 1 is padded from key 50, example 2 has fewer real keys (2) than K."""
    g = torch.Generator().manual_seed(seed)
    q_s, k_s = (torch.randn(batch, length, 4, generator=g) * scale for _ in range(2))
    key_valid = torch.ones(batch, length, dtype=torch.bool)
    if batch > 1:
        key_valid[1, 50:] = False
    if batch > 2:
        key_valid[2, 2:] = False
    return q_s.to(device), k_s.to(device), key_valid.to(device)


def _literal(q_s, k_s, key_valid, function: str, heads: int, noise: torch.Tensor | None):
    """The literal sampler's keys for `noise` (`"topk"`: the K largest logits, no noise)."""
    z = sketch_logits(q_s, k_s, key_valid, 0, q_s.shape[1])
    if function == "topk":
        vals, top = z.topk(K, dim=-1)
        shape = (z.shape[0], heads, *top.shape[1:])
        return top[:, None].expand(shape), (vals > float("-inf"))[:, None].expand(shape)
    return sample_keys_reference(score_bounds(z, torch.logsumexp(z, -1, keepdim=True), function), K, noise)


def _assert_same_keys(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Same valid slots and the same set of keys per (example, head, query). Both list the keys best first; only the
    order of keys whose fp32 scores are equal can differ (a tie `torch.topk` breaks its own way)."""
    (idx, valid), (ref_idx, ref_valid) = actual, expected
    assert torch.equal(valid, ref_valid)
    keys = torch.where(valid, idx, -1).sort(-1).values
    assert torch.equal(keys, torch.where(ref_valid, ref_idx, -1).sort(-1).values)


def _frequencies(idx: torch.Tensor, num_keys: int) -> torch.Tensor:
    """How often each key is among the selected ones, over every slot of `idx`, divided by the draws (rows)."""
    flat = idx.flatten().cpu()
    return torch.zeros(num_keys).scatter_add_(0, flat, torch.ones(flat.shape)) / (flat.numel() // idx.shape[-1])


def _assert_same_law(f_a: torch.Tensor, f_b: torch.Tensor, draws: int) -> None:
    """Two inclusion frequencies of `draws` draws each from one law: a z-score per key."""
    p = (f_a + f_b) / 2
    z = (f_a - f_b) / (2 * p * (1 - p) / draws).sqrt().clamp(min=1e-3)
    assert z.pow(2).mean() < 1.3  # ~1 for one law (a little less: keys with p near 0 or 1)
    assert z.abs().max() < 6.0


def test_counter_noise_is_philox_4x32_10():
    # Known answers of Philox-4x32-10 (Random123's kat_vectors): counter and key all zeros, then all ones.
    zero = torch.zeros(1, dtype=torch.long)
    assert [int(w) for w in philox4x32(zero, zero, zero, zero, zero)] == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8,
    ]  # fmt: skip
    ones, key = torch.full((1,), 0xFFFFFFFF), torch.tensor([-1])  # -1: both key words 0xFFFFFFFF
    assert [int(w) for w in philox4x32(key, ones, ones, ones, ones)] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD,
    ]  # fmt: skip


def test_counter_noise_is_standard_exponential_and_independent_across_counters():
    noise = counter_noise_rows(torch.tensor([7]), 2, 3, 0, 100, 400, per_example=True)  # (2, 3, 100, 400)
    flat = noise.flatten().double()
    # Kolmogorov-Smirnov distance to Exp(1) of 240,000 draws: about 0.0017 in expectation, 0.0033 at p = 0.001.
    empirical = torch.arange(1, flat.numel() + 1, dtype=torch.float64) / flat.numel()
    assert (empirical - (-torch.expm1(-flat.sort().values))).abs().max() < 0.0035
    # Neighbouring counters in every coordinate are uncorrelated (|r| ~ 0.002 expected for ~40,000 pairs).
    for dim in range(4):
        a, b = noise.narrow(dim, 0, noise.shape[dim] - 1), noise.narrow(dim, 1, noise.shape[dim] - 1)
        assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].abs() < 0.02, dim
    shared = counter_noise_rows(torch.tensor([7]), 2, 3, 0, 100, 400, per_example=False)
    assert shared.shape[0] == 1 and torch.equal(shared[0], noise[0])


@pytest.mark.parametrize(
    ("function", "scale", "batch", "length"),
    [
        # several query blocks and key tiles; flat sketches: every tile draws noise
        ("squared_inverse_log", 0.0, 3, N),
        ("random", 0.0, 3, N),
        # peaked sketches: most tiles are skipped
        ("squared_inverse_log", 3.0, 3, N),
        ("topk", 3.0, 3, N),
        # the other bounds, in one tile
        ("inverse_log", 1.0, 2, 64),
        ("raw", 1.0, 2, 64),
    ],
)
def test_kernel_returns_the_literal_samplers_keys_for_the_same_noise(function, scale, batch, length, device):
    q_s, k_s, key_valid = _sketch(scale, device, batch, length)
    noise = torch.empty(batch, 1, length, length).exponential_(generator=torch.Generator().manual_seed(2)).to(device)
    kw = {"num_heads": 1, "num_samples": K, "function": function}
    idx, valid = attentive_sample_triton(q_s, k_s, key_valid, seed=None, noise=noise, **kw)
    _assert_same_keys((idx, valid), _literal(q_s, k_s, key_valid, function, 1, noise))
    assert idx.dtype == torch.long and idx.shape == (batch, 1, length, K)
    assert valid[:2].all() and (batch < 3 or valid[2].sum(-1).eq(2).all())
    assert not (valid & ~torch.gather(key_valid[:, None, None].expand(batch, 1, length, length), 3, idx)).any()


def test_kernel_draws_the_keys_of_its_torch_reference_for_the_same_seed(device):
    # Scale 1.5: some rows take their K keys from the proposals, the others from the scan over both key tiles.
    q_s, k_s, key_valid = _sketch(1.5, device, batch=3)
    kw = {"num_heads": 1, "num_samples": K, "function": "squared_inverse_log", "method": "counter"}
    seed = torch.tensor([2**40 + 3], device=device)
    kernel = sample_keys(q_s, k_s, key_valid, backend="triton", seed=seed, **kw)
    _assert_same_keys(kernel, sample_keys(q_s, k_s, key_valid, backend="reference", seed=seed, **kw))
    idx, valid = kernel
    assert valid[2].sum(-1).eq(2).all() and valid[:2].all()


@pytest.mark.parametrize("per_example", [True, False])
def test_only_per_example_counters_give_two_copies_of_an_example_their_own_keys(per_example, device):
    q_s, k_s, key_valid = _sketch(0.0, device, batch=1, length=40)  # flat: the proposals settle every row
    twins = [t.expand(2, *t.shape[1:]) for t in (q_s, k_s, key_valid)]
    kw = {"num_heads": 1, "num_samples": K, "function": "squared_inverse_log", "method": "counter", "seed": 5}
    idx, valid = sample_keys(*twins, backend="triton", per_example=per_example, **kw)
    assert torch.equal(idx[0], idx[1]) == (not per_example)
    _assert_same_keys((idx, valid), sample_keys(*twins, backend="reference", per_example=per_example, **kw))


def test_an_examples_keys_do_not_depend_on_its_padding_without_per_example_counters(device):
    q_s, k_s, _ = _sketch(0.5, device, batch=1, length=40)
    padded = [torch.cat([t, torch.randn(1, 30, 4, device=device)], 1) for t in (q_s, k_s)]
    key_valid = torch.ones(1, 70, dtype=torch.bool, device=device)
    key_valid[:, 40:] = False
    kw = {"num_heads": 1, "num_samples": K, "function": "squared_inverse_log", "method": "counter", "seed": 5}
    alone = sample_keys(q_s, k_s, None, backend="triton", per_example=False, **kw)
    idx, valid = sample_keys(*padded, key_valid, backend="triton", per_example=False, **kw)
    _assert_same_keys((idx[:, :, :40], valid[:, :, :40]), alone)


# The law of the kernel's draws follows from its equality with the torch reference (above), whose inclusion
# frequencies tests/smart_bird/test_counter_sampler.py checks at three sketch scales; this direct check of the kernel
# takes minutes under the interpreter.
@pytest.mark.slow
def test_kernel_has_the_literal_samplers_inclusion_frequencies(device):
    # Every query row has the same sketch query, so the rows and heads of one call are independent draws for it.
    rows, heads = _INTERPRETED_BLOCK_M * 2, 2
    q_s, k_s, _ = _sketch(0.7, device, batch=1, length=rows, seed=3)
    q_s = q_s[:, :1].expand(1, rows, 4)
    kw = {"num_heads": heads, "num_samples": K, "function": "squared_inverse_log"}
    counter, _ = sample_keys(q_s, k_s, None, method="counter", backend="triton", seed=11, **kw)
    torch.manual_seed(0)
    literal, _ = sample_keys(q_s, k_s, None, method="literal", **kw)
    _assert_same_law(_frequencies(counter, rows), _frequencies(literal, rows), rows * heads)


def test_bad_inputs_are_refused_with_the_problem_named():
    q_s, k_s, _ = _sketch(1.0, "cpu", batch=1, length=8)
    kw = {"num_heads": 1, "num_samples": 2}
    with pytest.raises(ValueError, match="function"):
        attentive_sample_triton(q_s, k_s, None, function="softmax", seed=torch.tensor([0]), **kw)
    with pytest.raises(ValueError, match="seed"):
        attentive_sample_triton(q_s, k_s, None, function="raw", seed=None, **kw)
    with pytest.raises(ValueError, match="q_s and k_s"):
        attentive_sample_triton(q_s, k_s[:, :4], None, function="raw", seed=torch.tensor([0]), **kw)

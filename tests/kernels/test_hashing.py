"""The counter hash (`attnzoo.kernels.hashing`) and its Triton twin (`kernels/triton/hashing.py`): the torch code
equals the hash written out bit for bit, the kernel's dropout decisions equal the torch ones bit for bit, and the
keep masks have the law of dropout (keep rate 1 - p, no correlation between neighbours or seeds)."""

from __future__ import annotations

import pytest
import torch

import attnzoo.kernels.hashing as hashing
from attnzoo.kernels.hashing import counter_uniform, draw_seed, hashed_keep, keep_threshold, position_keep

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from attnzoo.kernels.triton import hashing as kernel_hashing  # noqa: E402
from triton_devices import TRITON_DEVICES as DEVICES  # noqa: E402


def _counter_uniform_reference(seed: int, num_heads: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    # The hash written out, one fresh tensor per op (int64 arithmetic wraps).
    h = torch.arange(num_heads, dtype=torch.int64)[:, None, None]
    x = (h + 1) * -0x61C8864680B583EB + rows[None, :, None] * -0x40A7B892E31B1A47
    x = x + cols[None, None, :] * -0x6B2FB644ECCEEE15 + seed
    x = x ^ ((x >> 31) & ((1 << 33) - 1))
    x = x * -0x40A7B892E31B1A47
    x = x ^ ((x >> 29) & ((1 << 35) - 1))
    x = x * -0x6B2FB644ECCEEE15
    x = x ^ ((x >> 32) & ((1 << 32) - 1))
    return ((x >> 40) & ((1 << 24) - 1)).to(torch.float32) / (1 << 24)


@pytest.mark.parametrize("seed", [0, 7, 2**62 + 12345])
@pytest.mark.parametrize("block_pairs", [1 << 16, 13])  # one block; blocks of 2 query rows, the last one partial
def test_counter_uniforms_equal_the_plain_hash_bit_for_bit(seed, block_pairs, monkeypatch):
    monkeypatch.setattr(hashing, "_CPU_BLOCK_PAIRS", block_pairs)
    rows, cols = torch.arange(50, 91), torch.tensor([0, 1, 5, 4095, 4096, 10**6])
    fast = counter_uniform(seed, 3, rows, cols)
    assert torch.equal(fast, _counter_uniform_reference(seed, 3, rows, cols))
    assert fast.dtype == torch.float32 and fast.min() >= 0 and fast.max() < 1
    # a seed on the device (dropout's) gives the same numbers as the int
    assert torch.equal(counter_uniform(torch.tensor(seed), 3, rows, cols), fast)


def test_counter_uniforms_do_not_depend_on_shapes():
    full = counter_uniform(3, 2, torch.arange(10), torch.arange(12))
    part = counter_uniform(3, 2, torch.arange(7, 10), torch.arange(12))
    torch.testing.assert_close(full[:, 7:], part, rtol=0, atol=0)
    assert 0.45 < full.mean() < 0.55


def test_the_kernels_hash_constants_are_the_torch_ones():
    assert (kernel_hashing.MIX1, kernel_hashing.MIX2, kernel_hashing.GOLDEN) == (
        hashing._MIX1,
        hashing._MIX2,
        hashing._GOLDEN,
    )


@triton.jit
def _keep_grid(SEED, OUT, num_rows, num_cols, threshold, ROWS: tl.constexpr, COLS: tl.constexpr):
    head = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    keep = kernel_hashing.keep_at(tl.load(SEED), head, rows[:, None], cols[None, :], threshold)
    ok = (rows[:, None] < num_rows) & (cols[None, :] < num_cols)
    tl.store(OUT + head * num_rows * num_cols + rows[:, None] * num_cols + cols[None, :], keep.to(tl.int8), mask=ok)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropout_p", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("seed", [3, 2**62 - 1])
def test_the_kernels_dropout_decisions_equal_the_torch_ones_bit_for_bit(device, dropout_p, seed):
    heads, n, m = 3, 11, 50
    seed_tensor = torch.tensor(seed, device=device)
    out = torch.zeros(heads, n, m, dtype=torch.int8, device=device)
    _keep_grid[(heads,)](seed_tensor, out, n, m, keep_threshold(dropout_p), ROWS=16, COLS=64)
    expected = hashed_keep(
        seed_tensor, heads, torch.arange(n, device=device), torch.arange(m, device=device), dropout_p
    )
    assert torch.equal(out.bool(), expected)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seed", [3, 2**62 - 1])
def test_the_out_of_place_decisions_equal_hashed_keep_bit_for_bit(index_dtype, seed):
    """`keep_decisions` (FlexAttention's `score_mod`, whose indices are int32 in its kernels) decides as the in-place
    hash, also at positions whose products with the constants overflow int64."""
    seed_tensor = torch.tensor(seed)
    rows = torch.tensor([0, 1, 7, 4_095, 70_000, 2**31 - 1])
    cols = torch.arange(0, 2**31 - 1, 2**25)
    for dropout_p in (0.1, 0.5):
        expected = hashed_keep(seed_tensor, 5, rows, cols, dropout_p)
        heads = torch.arange(5, dtype=index_dtype)[:, None, None]
        got = hashing.keep_decisions(
            seed_tensor, heads, rows.to(index_dtype)[None, :, None], cols.to(index_dtype)[None, None, :],
            keep_threshold(dropout_p),
        )  # fmt: skip
        assert torch.equal(got, expected)


def test_hashed_keep_has_the_law_of_dropout():
    seed = draw_seed(torch.device("cpu"), torch.Generator().manual_seed(0))
    keep = hashed_keep(seed, 4, torch.arange(256), torch.arange(256), 0.1)  # 262,144 decisions
    rate = keep.float().mean().item()
    assert abs(rate - 0.9) < 4 * (0.9 * 0.1 / keep.numel()) ** 0.5
    centred = keep.float() - rate
    # neighbouring keys, neighbouring queries and neighbouring heads decide independently
    for a, b in (
        (centred[..., 1:], centred[..., :-1]),
        (centred[:, 1:], centred[:, :-1]),
        (centred[1:], centred[:-1]),
    ):
        correlation = (a * b).mean() / centred.var()
        assert abs(correlation.item()) < 4 / a.numel() ** 0.5
    other = hashed_keep(seed + 1, 4, torch.arange(256), torch.arange(256), 0.1)
    agreement = (keep == other).float().mean().item()  # 0.82 for independent masks
    assert abs(agreement - 0.82) < 0.01


def test_keep_threshold_is_exact_at_the_ends_and_checks_p():
    assert keep_threshold(0.0) == 0 and keep_threshold(1.0) == 1 << 24
    assert keep_threshold(0.5) == 1 << 23
    assert hashed_keep(torch.tensor(1), 2, torch.arange(5), torch.arange(7), 0.0).all()
    assert not hashed_keep(torch.tensor(1), 2, torch.arange(5), torch.arange(7), 1.0).any()
    with pytest.raises(ValueError, match="dropout_p"):
        keep_threshold(1.5)


def test_position_keep_is_the_hash_at_head_0_row_0_and_keeps_1_minus_p():
    seed = torch.tensor(99)
    keep = position_keep(seed, 50_000, 0.3)
    assert keep.shape == (50_000,) and keep.dtype == torch.bool
    assert abs(keep.float().mean().item() - 0.7) < 4 * (0.21 / 50_000) ** 0.5
    expected = hashed_keep(seed, 1, torch.zeros(1, dtype=torch.int64), torch.arange(50_000), 0.3)[0, 0]
    assert torch.equal(keep, expected)
    assert torch.equal(position_keep(seed, 10, 0.3), keep[:10])  # a position's decision does not depend on the size


def test_a_seed_that_is_not_a_0d_int64_tensor_is_refused_by_name():
    from attnzoo.kernels.dropout import call_dropout

    cpu = torch.device("cpu")
    settings = {"dropout_p": 0.1, "fused": True, "materialise": lambda s: s, "device": cpu}
    with pytest.raises(ValueError, match="keep_seed must be a \\(\\) int64 tensor"):
        call_dropout(None, torch.tensor([1]), None, global_rows=0, training=True, **settings)
    with pytest.raises(ValueError, match="global_seed must be a \\(\\) int64 tensor"):
        call_dropout(None, None, torch.tensor(1, dtype=torch.int32), global_rows=1, training=True, **settings)
    # without dropout no seed is drawn or checked
    assert call_dropout(None, None, None, global_rows=1, training=False, **settings) == (None, None, None)


def test_a_call_with_global_rows_draws_both_seeds_at_once():
    """The slots' and the rows' seeds come from one draw (one op per layer), and differ; a seed the caller gives is
    kept and only the other is drawn."""
    from attnzoo.kernels.dropout import call_dropout

    settings = {"dropout_p": 0.1, "training": True, "fused": True, "materialise": lambda s: s}
    cpu = torch.device("cpu")
    _, keep_seed, rows_seed = call_dropout(
        None, None, None, global_rows=2, device=cpu, generator=torch.Generator().manual_seed(3), **settings
    )
    expected = torch.randint(1 << 62, (2,), dtype=torch.int64, generator=torch.Generator().manual_seed(3))
    assert keep_seed.shape == rows_seed.shape == () and keep_seed.dtype == rows_seed.dtype == torch.int64
    assert torch.equal(torch.stack([keep_seed, rows_seed]), expected) and keep_seed != rows_seed
    given = torch.tensor(7)
    _, keep_seed, rows_seed = call_dropout(None, given, None, global_rows=1, device=cpu, **settings)
    assert keep_seed is given and rows_seed is not None and rows_seed != given
    _, keep_seed, rows_seed = call_dropout(None, None, None, global_rows=0, device=cpu, **settings)
    assert keep_seed is not None and rows_seed is None

"""The FlexAttention helpers of `attnzoo.kernels.flex` and the dispatch's choice of them: tile lists as
`create_block_mask` builds them, the per-head permutation forward and backward against plain indexing, and the CPU
forward against dense masked attention."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
from torch.nn.attention.flex_attention import create_block_mask

from attnzoo.kernels import dense_masked_attention, flex
from attnzoo.kernels.dispatch import uses_flex_attention
from attnzoo.kernels.flex import PositionPermutation, block_mask_from_tiles, flex_block_attention, with_mask_mod
from attnzoo.kernels.hashing import hashed_keep


def _band(b, h, q_idx, kv_idx):
    return ((q_idx - kv_idx).abs() <= 20) | (kv_idx == 0)


def _tiles(block_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense `(H, Q, K)` partial and full tile flags of a batch-1 BlockMask."""
    heads, rows = block_mask.kv_num_blocks.shape[1:]
    cols = block_mask.kv_indices.shape[-1]
    dense = []
    for counts, indices in (
        (block_mask.kv_num_blocks, block_mask.kv_indices),
        (block_mask.full_kv_num_blocks, block_mask.full_kv_indices),
    ):
        listed = torch.arange(cols) < counts[0, ..., None]  # (H, Q, K): the first `count` entries are the tiles
        flags = torch.zeros(heads, rows, cols, dtype=torch.bool)
        dense.append(flags.scatter_(-1, indices[0].long(), listed))
    return dense[0], dense[1]


@pytest.mark.parametrize("block", [(16, 16), (32, 16), (16, 32)])
def test_block_mask_from_tiles_lists_the_tiles_as_create_block_mask_does(block):
    expected = create_block_mask(_band, 1, 2, 100, 100, device="cpu", BLOCK_SIZE=block)
    partial, full = _tiles(expected)
    built = block_mask_from_tiles(
        partial, full, q_block=block[0], kv_block=block[1], seq_lengths=(100, 100), mask_mod=_band
    )
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(built, name), getattr(expected, name)), name
    for name in ("kv_indices", "full_kv_indices", "q_indices", "full_q_indices"):
        counts = getattr(built, name.replace("indices", "num_blocks"))
        listed = torch.arange(getattr(built, name).shape[-1]) < counts[..., None]
        assert torch.equal(getattr(built, name)[listed], getattr(expected, name)[listed]), name
    assert built.BLOCK_SIZE == expected.BLOCK_SIZE and built.seq_lengths == expected.seq_lengths
    # Without full tiles every tile goes through the mask rule.
    only_partial = block_mask_from_tiles(
        partial | full, None, q_block=block[0], kv_block=block[1], seq_lengths=(100, 100), mask_mod=_band
    )
    assert only_partial.full_kv_num_blocks is None
    assert torch.equal(only_partial.kv_num_blocks, expected.kv_num_blocks + expected.full_kv_num_blocks)


def test_overlapping_partial_and_full_tiles_raise():
    tiles = torch.ones(1, 2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="both partial and full"):
        block_mask_from_tiles(tiles, tiles, q_block=16, kv_block=16, seq_lengths=(32, 32), mask_mod=_band)


def test_cpu_forward_equals_dense_masked_attention_and_gives_zero_rows_without_keys():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 100, 8, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(2, 100, dtype=torch.bool)
    valid[1, 60:] = False
    valid[1, 0] = False

    def padded_band(b, h, q_idx, kv_idx):
        return _band(b, h, q_idx, kv_idx) & valid[b, kv_idx] & (q_idx < 90)  # rows from 90 on attend nothing

    block_mask = create_block_mask(_band, 1, 2, 100, 100, device="cpu", BLOCK_SIZE=16)
    out = flex_block_attention(q, k, v, with_mask_mod(block_mask, padded_band), scale=0.3)
    i, j = torch.arange(100)[:, None], torch.arange(100)[None, :]
    mask = (((i - j).abs() <= 20) | (j == 0)) & valid[:, None, None, :] & (i < 90)
    expected, _ = dense_masked_attention(q, k, v, mask, scale=0.3)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert not out[:, :, 90:].any()


@pytest.mark.parametrize("layout", ["heads_split", "contiguous"])
def test_position_permutation_equals_indexing_forward_and_backward(layout):
    torch.manual_seed(0)
    batch, heads, length, dim = 2, 3, 11, 4
    table = torch.stack([torch.randperm(length) for _ in range(heads)])
    permutation = PositionPermutation(table)
    if layout == "heads_split":  # (B, N, H, d) memory, as the attention's head split leaves q, k and v
        x = torch.randn(batch, length, heads, dim, dtype=torch.float64).transpose(1, 2)
    else:
        x = torch.randn(batch, heads, length, dim, dtype=torch.float64)
    x.requires_grad_(True)
    out = permutation.apply(x)
    expected = torch.stack([x[:, h, table[h]] for h in range(heads)], dim=1)
    assert torch.equal(out, expected)
    assert out.stride() == x.stride()  # the memory layout is kept (no copy where the kernels read either)
    grad = torch.randn_like(out)
    assert torch.equal(*(torch.autograd.grad(y, x, grad)[0] for y in (out, expected)))
    restored = permutation.undo(permutation.apply(x))
    assert torch.equal(restored, x)
    assert torch.equal(torch.autograd.grad(restored, x, grad)[0], grad)
    # A layout that is neither is read through a copy, with the same values.
    odd = x.detach().permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    assert torch.equal(permutation.apply(odd), expected.detach())


def test_dispatch_takes_flex_for_fast_on_cuda_only():
    pytest.importorskip("triton")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    takes = functools.partial(uses_flex_attention, head_dim=64)
    assert takes("fast", cuda, torch.bfloat16, torch.bfloat16, torch.bfloat16)
    assert takes("fast", cuda, torch.float32)
    # fp64 stays on the torch paths, as with the Triton kernels
    assert not takes("fast", cuda, torch.float64)
    assert not takes("fast", cuda, torch.float32, torch.bfloat16)
    assert not takes("fast", cpu, torch.float32)  # no FlexAttention backward on CPU
    assert not takes("triton", cuda, torch.float32)  # attnzoo's own Triton kernels
    assert not takes("reference", cuda, torch.float32)
    # inductor's CUDA FlexAttention compiles heads of 16 and more
    assert uses_flex_attention("fast", cuda, torch.float32, head_dim=16)
    assert not uses_flex_attention("fast", cuda, torch.float32, head_dim=8)
    with pytest.raises(ValueError, match="attention_backend"):
        takes("flash", cuda, torch.float32)


def _dropout_case(
    width: int, dropout_p: float, seed: int, length: int = 100, device: str = "cpu", tile: int = 16, head_dim: int = 8
):
    """q, k, v (fp64, with gradients), a padded band BlockMask and its dense mask, and the hashed keep mask; the
    last tenth of the queries attend nothing, the second example's keys from 60% on are padding."""
    torch.manual_seed(0)
    shape = (2, 2, length, head_dim)
    q, k, v = (torch.randn(shape, dtype=torch.float64, device=device, requires_grad=True) for _ in range(3))
    valid = torch.ones(2, length, dtype=torch.bool, device=device)
    valid[1, length * 6 // 10 :] = False
    silent = length * 9 // 10

    def band(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= width

    def padded_band(b, h, q_idx, kv_idx):
        return band(b, h, q_idx, kv_idx) & valid[b, kv_idx] & (q_idx < silent)

    tiles = create_block_mask(band, 1, 2, length, length, device=device, BLOCK_SIZE=tile)
    positions = torch.arange(length, device=device)
    i, j = positions[:, None], positions[None, :]
    mask = ((i - j).abs() <= width) & valid[:, None, None, :] & (i < silent)
    keep_seed = torch.tensor(seed, device=device)
    keep = hashed_keep(keep_seed, 4, positions, positions, dropout_p).view(2, 2, length, length)
    return (q, k, v), with_mask_mod(tiles, padded_band), mask, keep_seed, keep


@pytest.mark.parametrize(("width", "dropout_p"), [(20, 0.1), (20, 0.7), (1, 0.7)])
def test_dropout_equals_dense_attention_with_the_hashed_mask_forward_and_backward(width, dropout_p, monkeypatch):
    """The two calls and the rescale are the dropped-out softmax: the kept entries of `hashed_keep`'s mask, scaled
    by 1 / (1 - p), over the full normaliser; rows whose every pair is dropped (width 1 at p = 0.7: a third of the
    rows) and rows without pairs give zeros and finite gradients."""
    # torch refuses FlexAttention's backward on CPU before it runs its (device-independent) eager backward: lift it.
    monkeypatch.setattr(torch_flex, "_validate_device", lambda *args: None)
    (q, k, v), block_mask, mask, keep_seed, keep = _dropout_case(width, dropout_p, seed=987654321)
    out = flex_block_attention(q, k, v, block_mask, scale=0.3, dropout_p=dropout_p, keep_seed=keep_seed)
    expected, _ = dense_masked_attention(q, k, v, mask, scale=0.3, dropout_p=dropout_p, training=True, keep=keep)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    for got, want in zip(grads, torch.autograd.grad(expected, (q, k, v), grad), strict=True):
        assert got.isfinite().all()
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    all_dropped = (mask & ~keep).sum(-1).bool() & ~(mask & keep).any(-1)  # rows with pairs, every one dropped
    assert all_dropped.any() or width > 1  # width 1 at p = 0.7 has such rows: the case is tested
    assert not out[all_dropped].any() and not out[:, :, 90:].any()


def test_dropout_depends_on_the_seed_and_drops_everything_at_one():
    inputs, block_mask, mask, keep_seed, _ = _dropout_case(20, 0.1, seed=1)
    q, k, v = (t.detach() for t in inputs)
    with torch.no_grad():
        one = flex_block_attention(q, k, v, block_mask, scale=0.3, dropout_p=0.1, keep_seed=keep_seed)
        other = flex_block_attention(q, k, v, block_mask, scale=0.3, dropout_p=0.1, keep_seed=keep_seed + 1)
        plain = flex_block_attention(q, k, v, block_mask, scale=0.3)
        assert not torch.allclose(one, other) and not torch.allclose(one, plain)
        assert torch.equal(
            flex_block_attention(q, k, v, block_mask, scale=0.3, dropout_p=0.0, keep_seed=keep_seed), plain
        )
        assert not flex_block_attention(q, k, v, block_mask, scale=0.3, dropout_p=1.0, keep_seed=keep_seed).any()


@pytest.mark.gpu
def test_dropout_on_cuda_equals_the_reference_forward_and_backward():
    """The compiled kernels with the hash in their `score_mod`, in bf16, against fp32 dense attention with the same
    mask (rows without pairs and padding included); head dim 16, the smallest the compiled kernels take."""
    (q, k, v), block_mask, mask, keep_seed, keep = _dropout_case(
        20, 0.1, seed=5, length=256, device="cuda", tile=128, head_dim=16
    )
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    high = [t.detach().float().requires_grad_() for t in low]
    out = flex_block_attention(*low, block_mask, scale=0.3, dropout_p=0.1, keep_seed=keep_seed)
    expected, _ = dense_masked_attention(*high, mask, scale=0.3, dropout_p=0.1, training=True, keep=keep)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    grad = torch.randn_like(expected)
    (out.float() * grad).sum().backward()
    (expected * grad).sum().backward()
    for got, want in zip(low, high, strict=True):
        torch.testing.assert_close(got.grad.float(), want.grad, rtol=5e-2, atol=5e-2)


@pytest.mark.slow
def test_the_compiled_dropout_score_mod_decides_as_the_eager_one():
    """Inductor compiles the counter hash inside the `score_mod` (its CPU template: the trace CUDA's kernels are made
    from, with another code generator, and forward only) and drops the entries the eager hash drops. About a minute
    of compiling."""
    inputs, block_mask, _, keep_seed, _ = _dropout_case(20, 0.3, seed=11, length=256, tile=128)
    q, k, v = (t.detach().float() for t in inputs)
    score_mod = flex.dropout_score_mod(keep_seed, q.shape[1], 0.3)
    compiled = torch.compile(torch_flex.flex_attention, dynamic=False)
    with torch.no_grad():
        eager = torch_flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=0.3)
        got = compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=0.3)
        plain = torch_flex.flex_attention(q, k, v, block_mask=block_mask, scale=0.3)
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(eager, plain, atol=1e-3)

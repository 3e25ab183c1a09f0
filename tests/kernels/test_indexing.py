from __future__ import annotations

import torch

from attnzoo.kernels import batch_head_offsets, flatten_heads, unflatten_heads


def test_flatten_roundtrip_is_a_view():
    x = torch.randn(2, 3, 5, 4)
    flat = flatten_heads(x)
    assert flat.shape == (30, 4)
    assert flat.data_ptr() == x.data_ptr()
    assert torch.equal(unflatten_heads(flat, 2, 3, 5), x)


def test_batch_head_offsets_map_local_to_flat_rows():
    B, H, N = 2, 3, 5
    x = torch.randn(B, H, N, 4)
    offsets = batch_head_offsets(B, H, N, x.device)
    assert offsets.shape == (B, H, 1)
    idx = torch.randint(0, N, (B, H, 7))
    flat_idx = idx + offsets  # (B, H, 7)
    expected = torch.gather(x, 2, idx[..., None].expand(B, H, 7, 4))
    assert torch.equal(flatten_heads(x)[flat_idx], expected)

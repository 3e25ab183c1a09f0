"""Guards against a densifying backward: at B*H*N = 16384 rows a dense (R, C) gradient would be 1 GiB."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from attnzoo.kernels import edge_attention, gathered_attention

B, H, N, D, K = 1, 4, 4096, 64, 16
MAX_SAVED_BYTES = 64 * 2**20
MAX_PEAK_RSS_BYTES = 256 * 2**20


def _rss_field(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux only)
    except OSError:
        return False
    return True


def _measure(run):
    """Saved bytes of the autograd graph and peak RSS increase (None where unsupported) of one forward+backward."""
    saved = 0

    def pack(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    can_track_rss = _reset_peak_rss()
    before = _rss_field("VmRSS") if can_track_rss else 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, inputs = run()
    out.backward(torch.ones_like(out))
    peak = _rss_field("VmHWM") - before if can_track_rss else None
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in inputs)
    return saved, peak


def _qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, N, D, generator=g, requires_grad=True) for _ in range(3)]


def _check(run):
    run()  # warm-up: first calls allocate thread pools and MKL buffers
    start = time.perf_counter()
    saved, peak = _measure(run)
    elapsed = time.perf_counter() - start
    assert saved < MAX_SAVED_BYTES, f"saved {saved / 2**20:.1f} MiB"
    if peak is not None:
        assert peak < MAX_PEAK_RSS_BYTES, f"peak RSS grew by {peak / 2**20:.1f} MiB"
    assert elapsed < 10.0, f"forward+backward took {elapsed:.1f} s"


def test_gathered_backward_stays_linear_in_edges():
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, N, (B, H, N, K), generator=g)
    valid = torch.rand(B, H, N, K, generator=g) < 0.9

    def run():
        return gathered_attention(q, k, v, idx, valid, dropout_p=0.1, training=True), (q, k, v)

    _check(run)


def test_edge_backward_stays_linear_in_edges():
    q, k, v = (t.view(B * H * N, D) for t in _qkv())
    g = torch.Generator().manual_seed(2)
    num_edges = B * H * N * K
    rows = torch.randint(0, B * H * N, (num_edges,), generator=g)
    cols = torch.randint(0, B * H * N, (num_edges,), generator=g)
    bias = torch.randn(num_edges, generator=g, requires_grad=True)
    weight = torch.rand(num_edges, generator=g, requires_grad=True)

    def run():
        out = edge_attention(q, k, v, rows, cols, logit_bias=bias, edge_weight=weight, dropout_p=0.1, training=True)
        return out, (bias, weight)

    _check(run)


def test_no_grad_forward_builds_no_graph():
    q, k, v = (t.detach() for t in _qkv())
    idx = torch.randint(0, N, (B, H, N, K), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = gathered_attention(q, k, v, idx)
    assert out.grad_fn is None and out.shape == (B, H, N, D)

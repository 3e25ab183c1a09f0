"""SBM's Triton fastRG sampler (`attnzoo.kernels.triton.fastrg`) against its torch reference (`attnzoo.sbm.fastrg`):
the same graph bit for bit for the same generator (counter hashes and integer inverse CDFs), and fastRG's law.

On CPU the kernels run under Triton's interpreter (`tests/conftest.py`), whose cost is per program, so the shapes
are small; several draw and edge-list blocks (`BLOCK_SLOTS`) still run, and the equality cases shrink the table
steps (`BLOCK_TABLE`, `TABLE_TILE`) so that a table row takes several steps. With CUDA the same cases run compiled.
"""

from __future__ import annotations

import pytest
import torch

import attnzoo.sbm.fastrg as fastrg
from attnzoo.kernels.dispatch import fastrg_sampler
from attnzoo.sbm.fastrg import FastRGKernels, StructuralPairs, edges_from_sorted_ids, fastrg_edges
from triton_devices import TRITON_DEVICES as DEVICES

pytest.importorskip("triton")
import attnzoo.kernels.triton.fastrg as kernel  # noqa: E402  (after the importorskip)

FIELDS = ("rows", "cols", "sampled", "duplicate", "attended", "crow", "head_counts")
B, H, N, M, K = 2, 3, 37, 41, 8


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def _memberships(device: str, seed: int = 0):
    """Memberships of two sequences (the second padded on both sides, a hole among the first's keys)."""
    g = torch.Generator().manual_seed(seed)
    query_valid = torch.ones(B, N, dtype=torch.bool)
    query_valid[1, 30:] = False
    key_valid = torch.ones(B, M, dtype=torch.bool)
    key_valid[1, 20:] = False
    key_valid[0, 5] = False
    q_memb = torch.rand(B, H, N, K, generator=g) * query_valid[:, None, :, None]
    k_memb = torch.rand(B, H, M, K, generator=g) * key_valid[:, None, :, None]
    blocks = torch.rand(H, K, K, generator=g)
    blocks = blocks / blocks.sum((1, 2), keepdim=True)
    structural = torch.randint(0, B * H * N * M, (B, H, N, 2), generator=g)
    structural[..., 0] = (torch.arange(B * H * N).view(B, H, N) * M) + torch.arange(N).clamp(max=M - 1)  # diagonal
    structural = torch.where(torch.rand(B, H, N, 2, generator=g) < 0.6, structural, -1)
    return [t.to(device) for t in (q_memb, k_memb, blocks, query_valid, key_valid, structural)]


#: a window of three diagonals around `j = i + query_offset + 1` and two global columns
WINDOW = StructuralPairs(first=0, diagonals=3, columns=2)


def _graphs(device: str, *, padded: bool, causal: bool, structural: str | None, reserve, seed: int = 5):
    """The reference's and the fused sampler's graphs; `structural`: `"ids"` (given), `"pairs"` ([`WINDOW`])."""
    q_memb, k_memb, blocks, query_valid, key_valid, struct = _memberships(device)
    kwargs = {
        "delta": 0.05, "query_valid": query_valid if padded else None, "key_valid": key_valid if padded else None,
        "causal": causal, "query_offset": 3 if causal else 0,
        "structural": {"ids": struct, "pairs": WINDOW, None: None}[structural], "reserve": reserve,
    }  # fmt: skip
    kernels = FastRGKernels(*fastrg_sampler("triton", torch.device(device)))
    return [
        fastrg_edges(q_memb, k_memb, blocks, generator=torch.Generator(device).manual_seed(seed), kernels=k, **kwargs)
        for k in (None, kernels)
    ]


def _assert_same_graph(reference, fused) -> None:
    for name in FIELDS:
        assert torch.equal(getattr(reference, name), getattr(fused, name)), name
    assert reference.slots == fused.slots and torch.equal(reference.seed, fused.seed)
    assert torch.equal(reference.drawn, fused.drawn)


def test_the_stream_and_quantisation_constants_are_the_reference_samplers():
    assert (kernel.EXPLORATION_STREAM, kernel.CDF_UNITS) == (fastrg._EXPLORATION_STREAM, fastrg._CDF_UNITS)


@pytest.mark.parametrize(
    "padded,causal,structural",
    [
        (False, False, None),
        (True, False, "ids"),
        (True, True, "pairs"),
        (False, True, "pairs"),
        (True, False, "pairs"),
    ],
    ids=["plain", "padded-given-ids", "padded-causal-window", "causal-window", "padded-window"],
)
def test_the_fused_sampler_draws_the_reference_graph(device, padded, causal, structural, monkeypatch):
    # table rows of 16 entries per step (N, M > 16: the running sum carries over steps), 4 rows per step
    monkeypatch.setattr(kernel, "BLOCK_TABLE", 16)
    monkeypatch.setattr(kernel, "TABLE_TILE", 64)
    # 150 fastRG slots: fewer than the draws (about 1500), so the drop of the draws past them is compared too.
    reference, fused = _graphs(device, padded=padded, causal=causal, structural=structural, reserve=lambda e: 150)
    assert int(reference.drawn) > reference.slots, "the test should overflow the fastRG slots"
    assert reference.rows.numel() > 2 * kernel.BLOCK_SLOTS, "the test should span several blocks"
    _assert_same_graph(reference, fused)
    assert reference.duplicate.any() and reference.attended.any()


def test_the_fused_sampler_with_every_draw_in_a_slot_and_int64_ids(device, monkeypatch):
    reference, fused = _graphs(device, padded=True, causal=False, structural="ids", reserve=lambda e: 4000)
    assert int(reference.drawn) < reference.slots
    _assert_same_graph(reference, fused)
    # The fused edge list keeps the int32 ids' width (every index fits), the reference int64.
    assert fused.rows.dtype == fused.cols.dtype == torch.int32 and reference.cols.dtype == torch.int64
    monkeypatch.setattr(fastrg, "_INT32_PAIRS", 0)
    wide = _graphs(device, padded=True, causal=False, structural="ids", reserve=lambda e: 4000)
    assert wide[0].rows.dtype == wide[1].cols.dtype == torch.int64
    _assert_same_graph(*wide)
    _assert_same_graph(reference, wide[1])  # the ids' width changes nothing


@pytest.mark.parametrize(
    "n,m,heads,offset",
    [(5, 7, 4, 0), (4096, (1 << 19) - 1, 2, 1 << 31)],
    ids=["small-ids", "ids-up-to-2^32-stored-less-2^31"],
)
def test_the_edge_list_kernel_reads_sorted_ids_as_the_reference(device, n, m, heads, offset):
    g = torch.Generator().manual_seed(3)
    num_rows = heads * n
    sentinel = (1 << 31) - 1
    # Ids spread over the whole range (with offset 2^31: both signs stored, and the last row), repeats included.
    spread = torch.randint(0, num_rows * m, (500,), generator=g)
    ids = torch.cat([spread, spread[:100], torch.tensor([0, num_rows * m - 1])])
    sorted_ids, order = torch.sort(ids, stable=True)
    stored = torch.cat([(sorted_ids - offset).to(torch.int32), torch.full((90,), sentinel, dtype=torch.int32)])
    order = torch.cat([order, torch.arange(order.numel(), order.numel() + 90)])
    stored, order = stored.to(device), order.to(device)
    kwargs = {"num_drawn": 500, "n": n, "m": m, "num_rows": num_rows, "sentinel": sentinel, "offset": offset}
    want = edges_from_sorted_ids(stored, order, **kwargs)
    got = kernel.fastrg_edge_list_triton(stored, order, **kwargs)
    for name, a, b in zip(FIELDS, want, got, strict=True):
        assert torch.equal(a.cpu(), b.cpu()), name
    # Both read the ids themselves back, not their stored form.
    rows, cols = want[0][:-90].cpu(), want[1][:-90].cpu()
    assert torch.equal(rows, sorted_ids // m) and torch.equal(cols, rows // n * m + sorted_ids % m)
    assert torch.equal(want[5].cpu(), torch.searchsorted(rows, torch.arange(num_rows + 1)))
    assert want[3].any() and not want[4][-90:].any(), "repeats and padding are in the test"
    # The per-head counts are those of the flags.
    heads_of = rows // n
    for column, flags in enumerate((want[2], want[4])):
        counts = torch.bincount(heads_of[flags[:-90].cpu()], minlength=heads)
        assert torch.equal(want[6][:, column].cpu(), counts.to(want[6].dtype)) and counts.min() > 0


def test_the_fused_samplers_edges_follow_fastrgs_law(device):
    """One call samples 2 x 150 heads with the same memberships, independent graphs: each pair's frequency is its
    presence probability `1 - exp(-(p + δ))` (0 outside the real pairs), within 5 standard errors."""
    heads, n, m, k, delta = 150, 6, 5, 3, 0.05
    g = torch.Generator().manual_seed(11)
    query_valid = torch.tensor([[True] * n, [True] * (n - 2) + [False] * 2])
    key_valid = torch.tensor([[True] * m, [False] + [True] * (m - 1)])
    q_one = torch.rand(2, 1, n, k, generator=g) * query_valid[:, None, :, None]
    k_one = torch.rand(2, 1, m, k, generator=g) * key_valid[:, None, :, None]
    block = torch.rand(1, k, k, generator=g)
    block = block / block.sum()
    p = q_one @ block @ k_one.transpose(-1, -2)  # (2, 1, n, m)
    allowed = query_valid[:, None, :, None] & key_valid[:, None, None, :]
    presence = torch.where(allowed, 1 - torch.exp(-(p + delta)), 0.0).double()[:, 0]  # (2, n, m)
    graph = fastrg_edges(
        q_one.expand(2, heads, n, k).to(device), k_one.expand(2, heads, m, k).to(device),
        block.expand(heads, k, k).to(device), delta=delta, query_valid=query_valid.to(device),
        key_valid=key_valid.to(device), causal=False, query_offset=0, structural=None,
        generator=torch.Generator(device).manual_seed(12),
        kernels=FastRGKernels(*fastrg_sampler("triton", torch.device(device))),
    )  # fmt: skip
    rows, cols = graph.rows[graph.attended].cpu(), graph.cols[graph.attended].cpu()
    counts = torch.zeros(2 * heads * n * m, dtype=torch.float64)
    counts[rows * m + cols % m] += 1
    frequency = counts.view(2, heads, n, m).mean(1)
    assert not frequency[presence == 0].any(), "no edge from a padded query, none to a padded key"
    inside = presence > 0
    error = (presence[inside] * (1 - presence[inside]) / heads).sqrt()
    assert ((frequency[inside] - presence[inside]).abs() / error).max() < 5


def test_the_dispatch_picks_the_fused_sampler_only_on_the_triton_path():
    assert fastrg_sampler("fast", torch.device("cpu")) is None
    assert fastrg_sampler("reference", torch.device("cpu")) is None
    if not torch.cuda.is_available():
        assert fastrg_sampler("triton", torch.device("cpu")) == (
            kernel.fastrg_pair_ids_triton,
            kernel.fastrg_edge_list_triton,
        )

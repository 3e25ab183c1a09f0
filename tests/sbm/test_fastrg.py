"""The fastRG sampler of SBM attention (`attnzoo.sbm.fastrg`) and its slot budget (`attnzoo.sbm.budget`).

The law is tested statistically against the formula (a pair is present with probability `1 - exp(-(p_ij + δ))`,
independently) and against the sampler it replaced (float64 inverse CDFs, `torch.unique`, written out below): edge
frequencies per pair over many draws, with a chi-square bound that the tests also show a slightly wrong law fails.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import attnzoo.sbm.attention_sbm as attention_sbm
import attnzoo.sbm.fastrg as fastrg
from attnzoo.sbm import SBMAttention, SBMConfig
from attnzoo.sbm.budget import EdgeBudget
from attnzoo.sbm.fastrg import draw_categorical, fastrg_edges, poisson_slots, slot_bits

# ----- the sampler this one replaced, as the law's second witness ----------------------------------------------


def _previous_categorical(weights, which, generator):
    """Inverse CDF over one global float64 cumulative sum (the previous sampler's method)."""
    num_rows, length = weights.shape
    cum = weights.double().reshape(-1).cumsum(0)
    ends = cum.view(num_rows, length)[:, -1]
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    u = torch.rand(which.shape, dtype=torch.float64, generator=generator)
    flat = torch.searchsorted(cum, starts[which] + u * (ends[which] - starts[which]), right=True)
    return (flat - which * length).clamp(0, length - 1)


def _previous_pairs(q_memb, k_memb, blocks, delta, query_valid, key_valid, causal, generator):
    """Merged pair ids `((b*H + h)*n + i)*m + j` of the previous sampler: block pair `(u, v)` ∝ `y_u Ŝ_uv z_v`,
    `i ∝ Q̂[:, u]`, `j ∝ K̂[:, v]`, exploration over the real pairs, causal thinning, `torch.unique`."""
    B, H, n, k = q_memb.shape
    m = k_memb.shape[2]
    y, z = q_memb.sum(2).reshape(B * H, k), k_memb.sum(2).reshape(B * H, k)
    mass = (y[:, :, None] * blocks.repeat(B, 1, 1) * z[:, None, :]).reshape(B * H, k * k).double()
    owner = torch.repeat_interleave(torch.arange(B * H), torch.poisson(mass.sum(-1), generator=generator).long())
    pair = _previous_categorical(mass, owner, generator)
    i = _previous_categorical(q_memb.transpose(2, 3).reshape(B * H * k, n), owner * k + pair // k, generator)
    j = _previous_categorical(k_memb.transpose(2, 3).reshape(B * H * k, m), owner * k + pair % k, generator)
    q_ok = torch.ones(B, n) if query_valid is None else query_valid.double()
    k_ok = torch.ones(B, m) if key_valid is None else key_valid.double()
    rate = (delta * q_ok.sum(-1) * k_ok.sum(-1)).repeat_interleave(H)
    owner_d = torch.repeat_interleave(torch.arange(B * H), torch.poisson(rate, generator=generator).long())
    i_d = _previous_categorical(q_ok, owner_d // H, generator)
    j_d = _previous_categorical(k_ok, owner_d // H, generator)
    owner, i, j = torch.cat([owner, owner_d]), torch.cat([i, i_d]), torch.cat([j, j_d])
    if causal:
        keep = j <= i
        owner, i, j = owner[keep], i[keep], j[keep]
    return torch.unique((owner * n + i) * m + j)


# ----- the law ---------------------------------------------------------------------------------------------------

B, H, N, M, K = 2, 2, 6, 5, 3
DRAWS = 1200


def _toy(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query_valid = torch.tensor([[True] * N, [True] * (N - 2) + [False] * 2])
    key_valid = torch.tensor([[True] * M, [True] * (M - 1) + [False]])
    q_memb = torch.rand(B, H, N, K, generator=g) * 0.9 * query_valid[:, None, :, None]
    k_memb = torch.rand(B, H, M, K, generator=g) * 0.9 * key_valid[:, None, :, None]
    blocks = torch.rand(H, K, K, generator=g)
    blocks = blocks / blocks.sum((-1, -2), keepdim=True)
    return q_memb, k_memb, blocks, query_valid, key_valid


def _presence(q_memb, k_memb, blocks, delta, query_valid, key_valid, causal):
    """Probability that each pair is an edge, `(B, H, N, M)`: 1 - exp(-(p + δ)) on the allowed pairs."""
    p = q_memb @ blocks @ k_memb.transpose(-1, -2)
    allowed = query_valid[:, None, :, None] & key_valid[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(N, M, dtype=torch.bool).tril()
    return torch.where(allowed, 1 - torch.exp(-(p + delta)), 0.0).double()


def _chi_square(counts, presence, draws):
    """Σ (c - D π)² / (D π (1 - π)) over the pairs with 0 < π < 1, and their number."""
    inside = (presence > 0) & (presence < 1)
    expected = draws * presence[inside]
    return float(((counts[inside] - expected) ** 2 / (expected * (1 - presence[inside]))).sum()), int(inside.sum())


def _bound(pairs: int) -> float:
    # mean + 6 standard deviations of a chi-square with `pairs` degrees of freedom
    return pairs + 6 * math.sqrt(2 * pairs)


@pytest.mark.parametrize("causal", [False, True])
def test_edge_frequencies_follow_the_formula_and_the_previous_sampler(causal):
    q_memb, k_memb, blocks, query_valid, key_valid = _toy()
    delta = 0.05
    presence = _presence(q_memb, k_memb, blocks, delta, query_valid, key_valid, causal)
    new = torch.zeros(B * H * N * M, dtype=torch.float64)
    old = torch.zeros_like(new)
    g_new, g_old = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    for _ in range(DRAWS):
        graph = fastrg_edges(
            q_memb, k_memb, blocks, delta=delta, query_valid=query_valid, key_valid=key_valid, causal=causal,
            query_offset=0, structural=None, generator=g_new,
        )  # fmt: skip
        pairs = graph.rows[graph.attended] * M + graph.cols[graph.attended] % M
        assert pairs.unique().numel() == pairs.numel(), "a pair is attended once"
        assert graph.sampled[graph.attended].all()
        new[pairs] += 1
        old[_previous_pairs(q_memb, k_memb, blocks, delta, query_valid, key_valid, causal, g_old)] += 1
    new, old = new.view(B, H, N, M), old.view(B, H, N, M)
    assert not new[presence == 0].any(), "no edge to a padded or future key, none from a padded query"
    statistic, pairs = _chi_square(new, presence, DRAWS)
    assert statistic < _bound(pairs), (statistic, pairs)
    # The two samplers against each other: (c1 - c2)^2 / (c1 + c2) per pair is about chi-square(1) for equal laws.
    both = (new + old)[presence > 0]
    two_sample = float(((new - old)[presence > 0] ** 2 / both.clamp(min=1)).sum())
    assert two_sample < _bound(pairs), (two_sample, pairs)
    # The bound has the power to see a law that is a little off: 20% less fastRG probability, or no exploration.
    for wrong in (0.8 * (q_memb @ blocks @ k_memb.transpose(-1, -2)), None):
        if wrong is None:
            off = _presence(q_memb, k_memb, blocks, 0.0, query_valid, key_valid, causal)
        else:
            off = torch.where(presence > 0, 1 - torch.exp(-(wrong + delta)), 0.0).double()
        assert _chi_square(new, off, DRAWS)[0] > 2 * _bound(pairs)


def test_draw_counts_per_pair_are_poisson_with_mean_p():
    q_memb, k_memb, blocks, *_ = _toy(seed=3)
    p = (q_memb @ blocks @ k_memb.transpose(-1, -2)).double()
    g = torch.Generator().manual_seed(4)
    counts = torch.zeros(DRAWS, B * H * N * M, dtype=torch.float64)
    for d in range(DRAWS):
        owner, i, j = fastrg.fastrg_multigraph(q_memb, k_memb, blocks, g)
        counts[d].index_add_(0, (owner * N + i) * M + j, torch.ones(i.shape, dtype=torch.float64))
    mean, var = counts.mean(0).view_as(p), counts.var(0).view_as(p)
    inside = p > 0
    # Poisson: mean p and variance p per pair, within 5 standard errors (of the mean sqrt(p / D), of the sample
    # variance sqrt((p + 2 p^2) / D): the Poisson fourth central moment is p + 3 p^2).
    p = p[inside]
    assert ((mean[inside] - p).abs() / (p / DRAWS).sqrt()).max() < 5
    assert ((var[inside] - p).abs() / ((p + 2 * p**2) / DRAWS).sqrt()).max() < 5


def test_categorical_draws_follow_the_weights_and_never_pick_a_zero_weight():
    weights = torch.tensor([[0.0, 3.0, 1e-6, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0, 5.0]])
    draws = 1 << 16
    # Stratified bits: every 2^31 / draws-th integer, so frequencies are exact up to quantisation.
    bits = (torch.arange(draws) * ((1 << 31) // draws)).long()
    for row in (0, 2):
        picked = draw_categorical(weights, torch.full((draws,), row), bits)
        freq = torch.bincount(picked, minlength=5).double() / draws
        torch.testing.assert_close(freq, (weights[row] / weights[row].sum()).double(), atol=2.0 / draws, rtol=0)
        assert not freq[weights[row] == 0].any()


def test_slot_bits_depend_on_the_position_only():
    seed = torch.tensor(12345)
    long, short = slot_bits(seed, 1000, 0), slot_bits(seed, 10, 0)
    assert torch.equal(long[:10], short)
    assert not torch.equal(slot_bits(seed, 10, 1), short), "streams differ"
    low = (long & ((1 << 31) - 1)).double() / (1 << 31)
    assert abs(low.mean().item() - 0.5) < 0.05 and abs(low.var().item() - 1 / 12) < 0.01


def test_graph_does_not_depend_on_the_slots_reserved():
    q_memb, k_memb, blocks, query_valid, key_valid = _toy(seed=5)
    kwargs = {
        "delta": 0.05, "query_valid": query_valid, "key_valid": key_valid, "causal": False, "query_offset": 0,
        "structural": None,
    }  # fmt: skip
    exact = fastrg_edges(q_memb, k_memb, blocks, generator=torch.Generator().manual_seed(6), **kwargs)
    drawn = int(exact.drawn)
    roomy = fastrg_edges(
        q_memb, k_memb, blocks, generator=torch.Generator().manual_seed(6), reserve=lambda e: drawn + 50, **kwargs
    )
    tight = fastrg_edges(
        q_memb, k_memb, blocks, generator=torch.Generator().manual_seed(6), reserve=lambda e: drawn - 5, **kwargs
    )
    edges = [(g.rows[g.attended], g.cols[g.attended], g.sampled[g.attended]) for g in (exact, roomy, tight)]
    assert exact.slots == drawn and roomy.slots == drawn + 50 and int(roomy.drawn) == drawn
    for a, b in zip(edges[0], edges[1], strict=True):
        assert torch.equal(a, b)
    # Too few slots drop the last draws only: the tight graph is the exact one less at most 5 pairs.
    exact_pairs = set((edges[0][0] * 1000 + edges[0][1]).tolist())
    tight_pairs = set((edges[2][0] * 1000 + edges[2][1]).tolist())
    assert tight_pairs <= exact_pairs and len(exact_pairs) - len(tight_pairs) <= 5
    assert int(tight.drawn) > tight.slots
    # Padding comes last and is marked by the row one past the end.
    assert torch.all(roomy.rows[~roomy.attended & ~roomy.duplicate] == roomy.num_rows)
    assert torch.all(roomy.rows[:-1] <= roomy.rows[1:])


def test_int64_pair_ids_give_the_same_graph(monkeypatch):
    q_memb, k_memb, blocks, query_valid, key_valid = _toy(seed=7)
    structural = torch.full((B, H, N, 2), -1)
    structural[..., 0] = (torch.arange(B * H * N).view(B, H, N) * M) + torch.arange(N).clamp(max=M - 1)  # diagonal
    kwargs = {
        "delta": 0.1, "query_valid": None, "key_valid": None, "causal": False, "query_offset": 0,
        "structural": structural,
    }  # fmt: skip
    graphs = []
    for limit in (fastrg._INT32_PAIRS, 0):
        monkeypatch.setattr(fastrg, "_INT32_PAIRS", limit)
        graphs.append(fastrg_edges(q_memb, k_memb, blocks, generator=torch.Generator().manual_seed(8), **kwargs))
    for name in ("rows", "cols", "sampled", "duplicate", "attended"):
        assert torch.equal(getattr(graphs[0], name), getattr(graphs[1], name)), name
    graph = graphs[0]
    diagonal = graph.attended & (graph.rows % N == graph.cols % M) & (graph.rows % N < M)
    assert diagonal.sum() == B * H * M, "every structural diagonal pair is attended once"
    assert graph.duplicate.any(), "the test should repeat a pair"


def test_pair_ids_sort_as_int32_up_to_2_to_the_32():
    # The benchmark's base size at 16,384 tokens (batch 1, 12 heads: ids up to about 3.2e9) sorts int32 ids ...
    assert fastrg.int32_pairs(12 * 16384, 16384, 16384)
    # ... a batch of two does not, nor does a flat key column past int32 (one query row a head, 2^31 keys).
    assert not fastrg.int32_pairs(2 * 12 * 16384, 16384, 16384)
    assert not fastrg.int32_pairs(2, 1, 1 << 31) and fastrg.int32_pairs(2, 1, (1 << 30) - 1)
    # The largest fitting graph's ids (below 2^32) are stored in order, the padding's sentinel past every one.
    largest = (1 << 32) - 1
    stored = torch.tensor([0, (1 << 31) - 1, 1 << 31, largest - 1]) - fastrg._INT32_OFFSET
    assert stored.to(torch.int32).tolist() == sorted(stored.tolist()) and stored.max() < fastrg._INT32_MAX


def test_poisson_slots_hold_the_count():
    g = torch.Generator().manual_seed(9)
    for mean in (0.0, 0.5, 30.0, 4e4):
        draws = torch.poisson(torch.full((20000,), mean, dtype=torch.float64), generator=g)
        assert draws.max() <= poisson_slots(mean)


# ----- the budget: slots on an accelerator without reading the device -------------------------------------------


def _attention(**overrides) -> SBMAttention:
    config = SBMConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        num_clusters=8, sampling_backend="fastrg", membership_logit_bias=-1.0, attention_probs_dropout_prob=0.1,
        local_window=2, sparsity_weight=0.3, **overrides,
    )  # fmt: skip
    torch.manual_seed(0)
    attn = SBMAttention(config)
    attn.init_method_weights()
    return attn


def _train_step(attn: SBMAttention, seed: int):
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(3), requires_grad=True)
    key_valid = torch.tensor([[True] * 24, [True] * 17 + [False] * 7])
    torch.manual_seed(seed)
    out = attn(x, key_valid)
    ((out.hidden_states * torch.linspace(-1, 1, 32)).sum() + out.aux_loss).backward()
    return out.hidden_states.detach(), out.density, x.grad, {n: p.grad.clone() for n, p in attn.named_parameters()}


def test_budget_reserves_without_reading_the_device_and_gives_the_exact_graph(monkeypatch):
    exact = _attention().train()
    budget = _attention().train()
    monkeypatch.setattr(attention_sbm, "reads_draw_counts", lambda kernel: False)
    reads = []
    original = EdgeBudget.reserve

    def spy(self, expected, pairs):
        reads.append(self.rate is None)  # a call without history reads the device
        return original(self, expected, pairs)

    monkeypatch.setattr(EdgeBudget, "reserve", spy)
    for seed in range(3):
        with_budget = _train_step(budget, seed)
        monkeypatch.setattr(attention_sbm, "reads_draw_counts", lambda kernel: True)
        reference = _train_step(exact, seed)
        monkeypatch.setattr(attention_sbm, "reads_draw_counts", lambda kernel: False)
        for got, want in zip(with_budget[:3], reference[:3], strict=True):
            torch.testing.assert_close(got, want)
        for name, grad in reference[3].items():
            torch.testing.assert_close(with_budget[3][name], grad, msg=name)
    assert reads == [True, False, False], "the first call reads the expected count, later ones reuse earlier calls'"
    assert budget.edge_budget.rate > 0


def test_budget_overflow_warns_on_the_next_call(monkeypatch):
    attn = _attention().train()
    monkeypatch.setattr(attention_sbm, "reads_draw_counts", lambda kernel: False)
    monkeypatch.setattr(EdgeBudget, "headroom", 0.05)  # far too few slots
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train_step(attn, 0)  # the first call drops draws, but nobody has read its counts yet
    with pytest.warns(RuntimeWarning, match="encoder layer 0: a fastRG graph drew .* dropped"):
        _train_step(attn, 1)

"""Method tests of SBM attention (methods.md §5.7): limits, kernels, straight-through gradients, fastRG law,
padding/causal structure, initial density, eval determinism, the decoder sites and the density callback."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnzoo.sbm  # noqa: F401  (registers the family)
from attnzoo.core.attention import DenseAttention
from attnzoo.core.compat import get_cache
from attnzoo.kernels import dense_masked_attention, edge_attention, gated_attention
from attnzoo.sbm import SBMAttention, SBMConfig, SBMForConditionalGeneration, SBMForSequenceClassification
from attnzoo.sbm.callbacks import SBMDensityCallback
from attnzoo.sbm.fastrg import fastrg_edges, fastrg_multigraph
from attnzoo.sbm.sampling import DenseMaskSTE, EdgeSTE
from attnzoo.testing import assert_same_gradients


def make_config(**overrides) -> SBMConfig:
    base = {
        "vocab_size": 200,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "num_clusters": 16,
        "attention_probs_dropout_prob": 0.0,
        "hidden_dropout_prob": 0.0,
        "decoder_layers": 1,
        # The paper's attention alone; global tokens are tested in tests/models/test_global_tokens.py.
        "num_global_tokens": 0,
    }
    base.update(overrides)
    return SBMConfig(**base)


def make_attention(config: SBMConfig, seed: int = 0, **kwargs) -> SBMAttention:
    torch.manual_seed(seed)
    attn = SBMAttention(config, **kwargs)
    for module in attn.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.2)
    attn.init_method_weights()
    return attn


def qkv(B=2, H=4, n=12, m=None, d=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return (
        torch.randn(B, H, n, d, generator=g),
        torch.randn(B, H, m, d, generator=g),
        torch.randn(B, H, m, d, generator=g),
    )


# ----- limits and kernels ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("training", [True, False])
def test_all_ones_probabilities_equal_dense_attention(training):
    # Memberships saturate at 1 and Ŝ sums to 1, so p_ij = 1 for every pair: SBM attends everywhere.
    config = make_config(membership_logit_bias=60.0, exploration_delta=0.0)
    attn = make_attention(config).train(training)
    dense = DenseAttention(config)
    dense.load_state_dict(attn.state_dict(), strict=False)
    x = torch.randn(2, 10, 32)
    key_valid = torch.tensor([[True] * 10, [True] * 7 + [False] * 3])
    out = attn(x, key_valid)
    ref = dense(x, key_valid)
    torch.testing.assert_close(out.hidden_states[0], ref.hidden_states[0])
    torch.testing.assert_close(out.hidden_states[1, :7], ref.hidden_states[1, :7])
    torch.testing.assert_close(out.density, torch.ones(2, 4))


def test_block_matrix_sums_to_one_and_probabilities_in_unit_interval():
    attn = make_attention(make_config())
    blocks = attn.block_matrix()
    torch.testing.assert_close(blocks.sum((-1, -2)), torch.ones(4))
    q, k, _ = qkv()
    probs = attn.memberships(q, None) @ blocks @ attn.memberships(k, None).transpose(-1, -2)
    assert probs.min() >= 0 and probs.max() <= 1


def test_edge_list_equals_dense_masked_attention_for_a_fixed_mask():
    q, k, v = (t.requires_grad_() for t in qkv(B=1, H=2, n=9, d=4))
    mask = torch.rand(1, 2, 9, 9, generator=torch.Generator().manual_seed(3)) < 0.3
    mask[0, 1, 4] = False  # a row without edges gives zeros
    flat = mask.reshape(-1).nonzero().squeeze(1)
    rows, cols = flat // 9, (flat // 81) * 9 + flat % 9
    ones = torch.ones(rows.shape, requires_grad=True)
    out = edge_attention(q.reshape(-1, 4), k.reshape(-1, 4), v.reshape(-1, 4), rows, cols, logit_bias=ones - 1)
    grad = torch.randn(1, 2, 9, 4)
    (out.view(1, 2, 9, 4) * grad).sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref, _ = dense_masked_attention(q, k, v, mask)
    (ref * grad).sum().backward()
    torch.testing.assert_close(out.view(1, 2, 9, 4), ref)
    assert torch.all(out.view(1, 2, 9, 4)[0, 1, 4] == 0)
    for a, t in zip(got, (q, k, v), strict=True):
        torch.testing.assert_close(a, t.grad)


@pytest.mark.parametrize(
    "backend,variant,training,all_pairs,dropout",
    [
        ("bernoulli", "official", True, False, 0.0),
        ("bernoulli", "official", False, False, 0.0),
        ("bernoulli", "paper", True, False, 0.0),
        ("bernoulli", "official", True, True, 0.0),
        ("bernoulli", "paper", True, True, 0.0),
        ("bernoulli", "official", True, True, 0.3),  # the gated attention's dropout (same keep mask in both paths)
        ("fastrg", "official", True, False, 0.0),
        ("fastrg", "official", False, False, 0.0),
        ("fastrg", "paper", True, False, 0.0),
    ],
)
def test_fast_path_equals_reference_on_the_same_graph(backend, variant, training, all_pairs, dropout):
    config = make_config(
        sampling_backend=backend, ste_variant=variant, sparsity_weight=0.5, local_window=4, ste_all_pairs=all_pairs,
        attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    results = []
    for reference in (False, True):
        config.attention_backend = "reference" if reference else "fast"
        attn = make_attention(config).train(training)
        x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(5), requires_grad=True)
        key_valid = torch.tensor([[True] * 11, [True] * 8 + [False] * 3])
        torch.manual_seed(7)  # same training-mode samples
        out = attn(x, key_valid)
        loss = (out.hidden_states * torch.linspace(-1, 1, 32)).sum()
        if training:
            loss = loss + out.aux_loss
        loss.backward()
        grads = {name: p.grad for name, p in attn.named_parameters()}
        results.append((out.hidden_states.detach(), out.density, grads, x.grad))
    (out_f, dens_f, grads_f, xg_f), (out_r, dens_r, grads_r, xg_r) = results
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dens_f, dens_r)
    torch.testing.assert_close(xg_f, xg_r, atol=1e-5, rtol=1e-4)
    assert_same_gradients(grads_f, grads_r, rtol=1e-4, atol=1e-5)
    assert grads_f["clusters"].abs().sum() > 0


# ----- straight-through estimator and regulariser ---------------------------------------------------------------


def _dense_ste_setup(variant: str, clip: float = 1.0):
    q, k, v = qkv(B=1, H=2, n=6, d=4)
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(1, 2, 6, 6, generator=gen, requires_grad=True)
    sampled = torch.rand(1, 2, 6, 6, generator=gen) < 0.5
    blocked = (~sampled).float()
    counts = sampled.sum((-1, -2)).float()
    logits = (q, k, 0.5) if variant == "paper" else None
    bias, counts_out = DenseMaskSTE.apply(probs, blocked, None, counts, clip, logits)
    grad_out = torch.randn(1, 2, 6, 4, generator=gen) * 10
    return q, k, v, probs, sampled, bias, counts_out, grad_out


@pytest.mark.parametrize("variant", ["official", "paper"])
def test_ste_gradient_is_the_clipped_logit_gradient_on_sampled_edges_only(variant):
    q, k, v, probs, sampled, bias, _, grad_out = _dense_ste_setup(variant)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.5)
    (out * grad_out).sum().backward()
    # Definition: the gradient w.r.t. a zero added to each sampled logit (official), times the logit (paper).
    zero = torch.zeros(1, 2, 6, 6, requires_grad=True)
    scores = q @ k.transpose(-1, -2) * 0.5
    logits = (scores + zero).masked_fill(~sampled, float("-inf"))
    ((logits.softmax(-1) @ v) * grad_out).sum().backward()
    expected = zero.grad * (scores if variant == "paper" else 1.0)
    expected = expected.clamp(-1, 1).masked_fill(~sampled, 0.0)
    torch.testing.assert_close(probs.grad, expected)
    assert torch.all(probs.grad[~sampled] == 0)
    assert probs.grad.abs().max() <= 1.0
    assert (expected.abs() == 1.0).any(), "the test should exercise the clip"


@pytest.mark.parametrize("variant", ["official", "paper"])
def test_all_pairs_ste_gives_every_allowed_pair_its_gate_gradient(variant):
    q, k, v = qkv(B=1, H=2, n=6, d=4)
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(1, 2, 6, 6, generator=gen, requires_grad=True)
    allowed = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    allowed[..., 5] = False  # a padded key
    sampled = (torch.rand(1, 2, 6, 6, generator=gen) < 0.5) & allowed
    sampled[0, 0, 2] = False  # a row without edges
    counts = sampled.sum((-1, -2)).float()
    logits = (q, k, 0.5) if variant == "paper" else None
    gate, counts = DenseMaskSTE.apply(probs, (~sampled).float(), None, counts, 1.0, logits, True, allowed)
    out, _ = gated_attention(q, k, v, gate, scale=0.5)
    empty = ~sampled.any(-1, keepdim=True)
    grad_out = torch.randn(1, 2, 6, 4, generator=gen) * 10
    ((out * grad_out).sum() + 0.03 * counts.sum()).backward()

    # Definition: the mask as a continuous gate on the softmax weights, differentiated at the sampled 0/1 values.
    gate = sampled.float().requires_grad_()
    scores = q @ k.transpose(-1, -2) * 0.5
    gated = gate * (scores - scores.amax(-1, keepdim=True)).exp()
    ref = (gated / gated.sum(-1, keepdim=True).clamp(min=1e-30)) @ v
    ((ref * grad_out).sum()).backward()
    expected = gate.grad.masked_fill(empty, 0.0) * (scores if variant == "paper" else 1.0)
    expected = (expected + 0.03).clamp(-1, 1).masked_fill(~allowed, 0.0)
    torch.testing.assert_close(probs.grad, expected)
    assert torch.all(probs.grad[0, 0, 2, :5] == 0.03), "a row without edges gets only the regulariser's gradient"
    inner = expected.abs() < 1
    assert (inner & ~sampled & allowed & ~empty).any(), "unsampled pairs must get an unclipped gate gradient"
    assert (expected.abs() == 1.0).any(), "the test should exercise the clip"


@pytest.mark.parametrize(
    "overrides",
    [{}, {"ste_variant": "paper", "sparsity_weight": 0.5}, {"ste_all_pairs": False, "sparsity_weight": 0.5}],
)
def test_global_columns_graph_equals_the_whole_graph(overrides, monkeypatch):
    """With global columns only, the sampler keeps the graph of those columns, `(B, H, n, g)`, instead of the whole
    `(B, H, n, m)` one: outputs, counts and every gradient must be those of the whole graph."""
    import attnzoo.sbm.attention_sbm as attention_sbm

    config = make_config(num_global_tokens=3, exploration_delta=0.05, ste_clip=0.05, **overrides)
    hidden = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(3))
    key_valid = torch.tensor([[True] * 20, [True] * 15 + [False] * 5])
    compact = attention_sbm.SBMAttention.sample_dense

    def whole_graph(self, probs, delta, allowed, offset, sampling):
        blocked, sampled = compact(self, probs, delta, allowed, offset, sampling)
        whole = blocked == 0  # outside the global columns every attended pair was sampled
        whole[..., : sampled.shape[-1]] = sampled
        return blocked, whole

    results = []
    for sampler in (compact, whole_graph):
        monkeypatch.setattr(attention_sbm.SBMAttention, "sample_dense", sampler)
        attn = make_attention(config).train()
        x = hidden.clone().requires_grad_()
        torch.manual_seed(11)
        out = attn(x, key_valid)
        loss = (out.hidden_states * key_valid[..., None]).pow(2).sum() + out.aux_loss
        loss.backward()
        grads = {name: p.grad.clone() for name, p in attn.named_parameters() if p.grad is not None}
        results.append((out.hidden_states.detach(), out.aux_loss.detach(), x.grad, grads))
    (h1, a1, x1, g1), (h2, a2, x2, g2) = results
    torch.testing.assert_close(h1, h2)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(x1, x2)
    assert g1.keys() == g2.keys() and "clusters" in g1
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], msg=name)


def test_all_pairs_ste_scores_no_padded_future_or_attended_pair(monkeypatch):
    import attnzoo.sbm.attention_sbm as attention_sbm

    seen, original = {}, DenseMaskSTE.apply

    def record(probs, blocked, sampled, *args):
        probs.register_hook(lambda grad: seen.setdefault("grad", grad))
        attend, counts = original(probs, blocked, sampled, *args)
        seen["sampled"], seen["gate"] = sampled, attend.detach().clone()
        return attend, counts

    monkeypatch.setattr(attention_sbm.DenseMaskSTE, "apply", record)
    config = make_config(ste_all_pairs=True, local_window=2)
    attn = make_attention(config, is_causal=True).train()
    key_valid = torch.tensor([[True] * 10, [True] * 7 + [False] * 3])
    out = attn(torch.randn(2, 10, 32), key_valid)
    (out.hidden_states * torch.randn(2, 10, 32)).sum().backward()
    grad, gate, sampled = seen["grad"], seen["gate"], seen["sampled"]
    assert sampled.shape == grad.shape, "the window makes the sampler keep the whole graph"
    assert not grad[1, :, :, 7:].any() and not grad[1, :, 7:].any(), "padded keys and queries"
    assert not grad.triu(1).any(), "the future"
    assert not grad[(gate == 1) & ~sampled].any(), "attended structural pairs that were not sampled"
    unsampled = (
        (gate == 0)
        & torch.ones(10, 10, dtype=torch.bool).tril()
        & (key_valid[:, None, None] & key_valid[:, None, :, None])
    )
    assert grad[unsampled].abs().sum() > 0, "allowed pairs that were not sampled get their gate gradient"
    assert grad[sampled].abs().sum() > 0
    assert attn.clusters.grad.abs().sum() > 0


def test_all_pairs_attention_dropout_keeps_one_minus_p_of_the_weights(monkeypatch):
    import attnzoo.sbm.attention_sbm as attention_sbm

    seen, original = {}, attention_sbm.gated_attention

    def record(*args, keep=None, **kwargs):
        seen["keep"] = keep
        return original(*args, keep=keep, **kwargs)

    monkeypatch.setattr(attention_sbm, "gated_attention", record)
    attn = make_attention(make_config(attention_probs_dropout_prob=0.2)).train()
    attn(torch.randn(4, 40, 32), None).hidden_states.sum().backward()
    keep = seen["keep"]
    assert set(keep.unique().tolist()) == {0.0, 1.0 / 0.8}
    assert abs((keep > 0).float().mean().item() - 0.8) < 0.01
    attn.eval()
    seen.clear()
    attn(torch.randn(4, 40, 32), None)
    assert "keep" not in seen, "eval mode runs no gated attention (and no dropout)"


def test_output_attentions_keeps_the_all_pairs_gradient_with_global_tokens():
    # With global tokens and `output_attentions`, the output is rebuilt from the returned weights: the unsampled
    # pairs' gradient must travel with the weights (it was lost when only the discarded output carried it).
    config = make_config(num_global_tokens=2, sparsity_weight=0.5, ste_all_pairs=True)
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(4))
    key_valid = torch.tensor([[True] * 12, [True] * 9 + [False] * 3])
    results = []
    for output_attentions in (False, True):
        attn = make_attention(config).train()
        torch.manual_seed(5)  # the same graphs
        out = attn(x, key_valid, output_attentions=output_attentions)
        ((out.hidden_states * key_valid[..., None]).pow(2).sum() + out.aux_loss).backward()
        results.append((out.hidden_states.detach(), {n: p.grad for n, p in attn.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0])
    assert_same_gradients(results[1][1], results[0][1], rtol=1e-4, atol=0.0, atol_of_largest=1e-6)


def test_unsampled_pairs_get_the_gradient_the_config_names():
    # The attention hands `ste_unsampled_gradient` to the gated attention; with the same graph the outputs agree
    # and only the unsampled pairs' straight-through gradient (hence the memberships' gradients) differs.
    results = {}
    for chosen in ("opening", "derivative"):
        config = make_config(ste_all_pairs=True, ste_unsampled_gradient=chosen)
        attn = make_attention(config).train()
        x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(2))
        torch.manual_seed(4)
        out = attn(x, torch.ones(2, 12, dtype=torch.bool))
        out.hidden_states.pow(2).sum().backward()
        results[chosen] = (out.hidden_states.detach(), attn.clusters.grad.clone(), attn.v_proj.weight.grad.clone())
    (h1, c1, v1), (h2, c2, v2) = results.values()
    torch.testing.assert_close(h1, h2, rtol=0, atol=0)
    torch.testing.assert_close(v1, v2, rtol=0, atol=0)  # the values' gradient does not see the closed pairs
    assert not torch.allclose(c1, c2), "the memberships' gradient must follow the closed pairs' estimator"


def test_unsampled_gradient_field_is_checked_and_old_checkpoints_keep_the_derivative(tmp_path):
    import json

    with pytest.raises(ValueError, match="ste_unsampled_gradient"):
        make_config(ste_unsampled_gradient="secant")
    SBMConfig().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    assert saved["ste_unsampled_gradient"] == "opening" and "transformers_version" in saved
    del saved["ste_unsampled_gradient"]
    path.write_text(json.dumps(saved))
    # saved before the field existed: trained with the gate's derivative, and it loads so
    assert SBMConfig.from_pretrained(tmp_path).ste_unsampled_gradient == "derivative"
    assert SBMConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4}).ste_unsampled_gradient == "opening"


def test_all_pairs_ste_needs_the_dense_backend():
    with pytest.raises(ValueError, match="ste_all_pairs"):
        make_config(ste_all_pairs=True, sampling_backend="fastrg")


def test_regulariser_gradient_reaches_every_sampled_probability():
    _, _, _, probs, sampled, _, counts, _ = _dense_ste_setup("official", clip=10.0)
    weight = 0.37
    (weight * counts.sum()).backward()
    torch.testing.assert_close(probs.grad, sampled.float() * weight)


def test_regulariser_of_the_module_is_lambda_times_mean_density():
    config = make_config(sparsity_weight=0.2)
    attn = make_attention(config).train()
    out = attn(torch.randn(2, 10, 32))
    torch.testing.assert_close(out.aux_loss, 0.2 * out.density.mean() / config.num_hidden_layers)


def test_edge_ste_gradient_matches_dense_definition():
    gen = torch.Generator().manual_seed(0)
    q_memb = torch.rand(7, 3, generator=gen, requires_grad=True)
    ks = torch.rand(5, 3, generator=gen, requires_grad=True)
    rows = torch.tensor([0, 0, 2, 3, 3, 3, 6])
    cols = torch.tensor([1, 4, 0, 0, 2, 3, 4])
    sampled = torch.tensor([True, True, False, True, True, True, True])
    crow = torch.searchsorted(rows, torch.arange(8))
    bias = EdgeSTE.apply(lambda a, b: (a, b), rows, cols, crow, sampled, None, None, False, 1.0, False, q_memb, ks)
    assert torch.all(bias == 0)
    grad_m = torch.tensor([0.5, -3.0, 2.0, 0.1, 0.2, -0.3, 4.0])
    (bias * grad_m).sum().backward()
    g = torch.zeros(7, 5)
    g[rows, cols] = (grad_m * sampled).clamp(-1, 1)
    torch.testing.assert_close(q_memb.grad, g @ ks.detach())
    torch.testing.assert_close(ks.grad, g.t() @ q_memb.detach())


def test_edge_ste_bias_drops_duplicates_scales_the_bias_gradient_and_counts_unscaled():
    """The bias is -inf at the duplicates; with a gradient scale (the paper variant's logit) the bias gradient is
    scaled and the counts' gradient is not: as `logit * (m - 1)` and `m * sampled` of a mask `m` of ones."""
    gen = torch.Generator().manual_seed(2)
    rows = torch.tensor([0, 0, 2, 3, 3, 3, 6])
    cols = torch.tensor([1, 4, 0, 0, 2, 3, 4])
    crow = torch.searchsorted(rows, torch.arange(8))
    sampled = torch.tensor([True, True, False, True, True, False, True])
    duplicate = torch.tensor([False, False, False, False, False, True, False])
    logits = torch.randn(7, generator=gen)
    grad_bias, grad_counts = torch.randn(7, generator=gen), torch.randn(7, generator=gen)
    factors = [torch.rand(7, 3, generator=gen), torch.rand(5, 3, generator=gen)]
    q_memb, ks = (t.clone().requires_grad_() for t in factors)
    bias, counted = EdgeSTE.apply(
        lambda a, b: (a, b), rows, cols, crow, sampled, duplicate, logits, True, 10.0, False, q_memb, ks
    )
    assert torch.equal(bias, torch.where(duplicate, float("-inf"), 0.0))
    assert torch.equal(counted, sampled.float())
    (torch.where(duplicate, 0.0, bias * grad_bias).sum() + (counted * grad_counts).sum()).backward()
    # the same gradients through an explicit mask of ones
    mask = torch.ones(7, requires_grad=True)
    ((logits * (mask - 1.0) * grad_bias).sum() + (mask * sampled * grad_counts).sum()).backward()
    g = torch.zeros(7, 5)
    g[rows, cols] = (mask.grad * sampled).clamp(-10, 10)
    torch.testing.assert_close(q_memb.grad, g @ factors[1])
    torch.testing.assert_close(ks.grad, g.t() @ factors[0])


def test_edge_ste_that_recomputes_its_factors_gives_the_gradient_of_saved_ones():
    gen = torch.Generator().manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    rows = torch.tensor([0, 0, 1, 3, 3, 5, 6])
    cols = torch.tensor([1, 4, 0, 2, 2, 3, 4])
    crow = torch.searchsorted(rows, torch.arange(8))
    sampled = torch.tensor([True, True, True, True, False, True, True])
    grad_m = torch.randn(7, generator=gen) * 3

    def factors(queries, keys):  # (7, 2) and (5, 2)
        return torch.sigmoid(net(queries)), torch.sigmoid(net(keys)) * 0.5

    def identity(a, b):
        return a, b

    results, saved_widths = [], []
    for recompute in (True, False):
        net.zero_grad()
        queries = torch.randn(7, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
        keys = torch.randn(5, 3, generator=torch.Generator().manual_seed(3), requires_grad=True)
        widths = set()

        def pack(t, widths=widths):
            widths.add(t.shape[-1] if t.dim() == 2 else None)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            inputs = (factors, queries, keys, *net.parameters()) if recompute else (identity, *factors(queries, keys))
            bias = EdgeSTE.apply(inputs[0], rows, cols, crow, sampled, None, None, False, 1.0, False, *inputs[1:])
        (bias * grad_m).sum().backward()
        results.append([queries.grad, keys.grad, *(p.grad for p in net.parameters())])
        saved_widths.append(widths)
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)
    assert results[0][2].abs().sum() > 0
    assert 2 not in saved_widths[0] and 2 in saved_widths[1], "the factors (width 2) are saved only without recompute"


@pytest.mark.parametrize(
    "overrides",
    [{"position_embedding_type": "rotary"}, {"shared_membership_mlp": False, "ste_variant": "paper"}],
    ids=["rotary", "headwise-paper"],
)
def test_fastrg_layer_recomputing_its_memberships_gives_the_gradients_of_saved_ones(overrides, monkeypatch):
    """The layer's recomputation makes the memberships the sampler read (same queries, keys, masks and rotation),
    and against a run that makes them in forward and keeps them (the estimator with the identity), every gradient
    is the same."""
    config = make_config(sampling_backend="fastrg", sparsity_weight=0.5, local_window=2, **overrides)
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(5))
    key_valid = torch.tensor([[True] * 11, [True] * 8 + [False] * 3])
    sampler_read = []

    def recording_sampler(q_memb, k_memb, blocks, **kwargs):
        sampler_read.append((q_memb.flatten(0, 2), (k_memb @ blocks.transpose(-1, -2)).flatten(0, 2)))
        return fastrg_edges(q_memb, k_memb, blocks, **kwargs)

    def saved_factors(factors, rows, cols, crow, sampled, duplicate, scale, counted, clip, triton, queries, keys, *_):
        made = factors(queries, keys)
        for got, want in zip(made, sampler_read[-1], strict=True):
            torch.testing.assert_close(got, want)
        options = (duplicate, scale, counted, clip, triton)
        return EdgeSTE.apply(lambda a, b: (a, b), rows, cols, crow, sampled, *options, *made)

    monkeypatch.setattr("attnzoo.sbm.attention_sbm.fastrg_edges", recording_sampler)
    results = []
    for recompute in (True, False):
        if not recompute:
            monkeypatch.setattr("attnzoo.sbm.attention_sbm.EdgeSTE", type("Saved", (), {"apply": saved_factors}))
        attn = make_attention(config).train()
        inputs = x.clone().requires_grad_()
        torch.manual_seed(7)  # the same graph
        out = attn(inputs, key_valid)
        ((out.hidden_states * torch.linspace(-1, 1, 32)).sum() + out.aux_loss).backward()
        results.append(({name: p.grad for name, p in attn.named_parameters()}, inputs.grad))
    (grads, x_grad), (want, x_want) = results
    torch.testing.assert_close(x_grad, x_want)
    assert_same_gradients(grads, want, rtol=1e-5, atol=1e-6)
    assert all(want[name].abs().sum() > 0 for name in want if name.startswith(("clusters", "membership_mlp")))


# ----- fastRG law ------------------------------------------------------------------------------------------------


def _toy_memberships():
    gen = torch.Generator().manual_seed(0)
    q_memb = torch.rand(1, 1, 6, 3, generator=gen) * 0.9
    k_memb = torch.rand(1, 1, 5, 3, generator=gen) * 0.9
    blocks = torch.rand(1, 3, 3, generator=gen)
    blocks = blocks / blocks.sum()
    return q_memb, k_memb, blocks, (q_memb @ blocks @ k_memb.transpose(-1, -2))[0, 0]


def test_fastrg_counts_are_poisson_with_mean_sum_p_and_pair_means_p():
    q_memb, k_memb, blocks, p = _toy_memberships()
    gen = torch.Generator().manual_seed(1)
    draws = 4000
    totals, pair_counts = [], torch.zeros(6, 5)
    for _ in range(draws):
        _, i, j = fastrg_multigraph(q_memb, k_memb, blocks, gen)
        totals.append(i.numel())
        pair_counts.index_put_((i, j), torch.ones(i.numel()), accumulate=True)
    totals = torch.tensor(totals, dtype=torch.float64)
    mean = p.sum().item()
    assert abs(totals.mean().item() - mean) < 4 * math.sqrt(mean / draws)
    assert abs(totals.var().item() - mean) < 0.15 * mean  # Poisson: variance equals the mean
    torch.testing.assert_close(pair_counts / draws, p, atol=0.03, rtol=0)


def test_fastrg_inclusion_after_dedup_is_one_minus_exp_minus_p():
    q_memb, k_memb, blocks, p = _toy_memberships()
    gen = torch.Generator().manual_seed(2)
    draws = 4000
    hits = torch.zeros(30)
    for _ in range(draws):
        graph = fastrg_edges(
            q_memb, k_memb, blocks, delta=0.0, query_valid=None, key_valid=None, causal=False, query_offset=0,
            structural=None, generator=gen,
        )  # fmt: skip
        rows, cols, sampled = (t[graph.attended] for t in (graph.rows, graph.cols, graph.sampled))
        assert sampled.all() and torch.unique(rows * 5 + cols).numel() == rows.numel()
        hits[rows * 5 + cols] += 1
    torch.testing.assert_close(hits.view(6, 5) / draws, 1 - torch.exp(-p), atol=0.03, rtol=0)


@pytest.mark.parametrize("backend,expected", [("bernoulli", 0.2), ("fastrg", 1 - math.exp(-0.2))])
def test_exploration_alone_gives_density_delta(backend, expected):
    config = make_config(membership_logit_bias=-60.0, exploration_delta=0.2, sampling_backend=backend)
    attn = make_attention(config).train()
    density = torch.stack([attn(torch.randn(4, 64, 32)).density for _ in range(5)]).mean()
    assert abs(density.item() - expected) < 0.01


# ----- structure: padding, causal, cross, initial density --------------------------------------------------------


@pytest.mark.parametrize("backend", ["bernoulli", "fastrg"])
def test_no_edge_to_padded_keys_or_future_keys(backend):
    config = make_config(sampling_backend=backend, membership_logit_bias=2.0, local_window=4, add_self_loops=True)
    attn = make_attention(config, is_causal=True).train()
    key_valid = torch.tensor([[True] * 16, [True] * 10 + [False] * 6])
    out = attn(torch.randn(2, 16, 32), key_valid, output_attentions=True)
    weights = out.attn_weights
    assert torch.all(weights[1, :, :, 10:] == 0)
    assert torch.all(weights.triu(1) == 0)
    assert weights[0].sum(-1).sub(1).abs().max() < 1e-5  # self loops: every real row attends somewhere
    assert not torch.isnan(out.hidden_states).any()


def test_cross_attention_samples_bipartite_graphs():
    config = make_config()
    attn = make_attention(config, is_cross_attention=True).train()
    enc = torch.randn(2, 9, 32)
    key_valid = torch.tensor([[True] * 9, [True] * 4 + [False] * 5])
    out = attn(torch.randn(2, 5, 32), key_valid, key_value_states=enc, output_attentions=True)
    assert out.attn_weights.shape == (2, 4, 5, 9)
    assert torch.all(out.attn_weights[1, :, :, 4:] == 0)


@pytest.mark.parametrize("backend,low,high", [("bernoulli", 0.24, 0.28), ("fastrg", 0.21, 0.25)])
def test_initial_density_is_about_a_quarter(backend, low, high):
    config = make_config(sampling_backend=backend, hidden_size=64, num_clusters=128)
    model = SBMForSequenceClassification(config).train()
    out = model(input_ids=torch.randint(5, 200, (2, 100)))
    assert low < out.attention_density.mean().item() < high


def test_low_density_variant_starts_below_two_percent():
    config = make_config(sampling_backend="fastrg", membership_logit_bias=-2.6, hidden_size=64, num_clusters=128)
    model = SBMForSequenceClassification(config).train()
    density = model(input_ids=torch.randint(5, 200, (2, 120))).attention_density.mean().item()
    assert 0.01 < density < 0.02


def test_auto_backend_follows_expected_density():
    x = torch.randn(1, 64, 32)
    dense_like = make_attention(make_config(sampling_backend="auto"))
    sparse_like = make_attention(make_config(sampling_backend="auto", membership_logit_bias=-4.0))
    q, k, _ = dense_like.project_qkv(x, None, None)
    pairs = torch.tensor([64.0 * 64])
    for attn, want in ((dense_like, "bernoulli"), (sparse_like, "fastrg")):
        args = (attn.memberships(q, None), attn.memberships(k, None), attn.block_matrix(), 0.01, pairs, True)
        assert attn.choose_backend(*args) == want


# ----- eval determinism, decoding, config -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["bernoulli", "fastrg"])
def test_eval_is_deterministic_and_seeded(backend):
    config = make_config(sampling_backend=backend)
    model = SBMForSequenceClassification(config).eval()
    ids = torch.randint(5, 200, (2, 30))
    a, b = model(input_ids=ids).logits, model(input_ids=ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    model.config.sampling_seed = 1
    for layer in model.model.encoder.layers:
        layer.attention.eval_seed = SBMAttention(model.config, layer_idx=layer.attention.layer_idx).eval_seed
    assert not torch.equal(model(input_ids=ids).logits, a)


def test_incremental_decoding_matches_full_decoding_in_eval():
    config = make_config()
    model = SBMForConditionalGeneration(config).eval()
    ids = torch.randint(5, 200, (2, 12))
    dec = torch.randint(5, 200, (2, 6))
    full = model(input_ids=ids, decoder_input_ids=dec).logits
    enc = model.get_encoder()(input_ids=ids)
    step = model(encoder_outputs=enc, decoder_input_ids=dec[:, :5], use_cache=True)
    last = model(encoder_outputs=enc, decoder_input_ids=dec[:, 5:], cache=get_cache(step))
    torch.testing.assert_close(last.logits[:, -1], full[:, -1], atol=1e-5, rtol=1e-4)
    generated = model.generate(input_ids=ids, max_new_tokens=4, num_beams=2)
    assert generated.shape[0] == 2


# fastRG, and "auto" with a threshold that picks it (an untrained model's expected density is about a quarter)
FASTRG_EVAL = [
    pytest.param({"sampling_backend": "fastrg"}, id="fastrg"),
    pytest.param({"sampling_backend": "auto", "auto_density_threshold": 0.9}, id="auto"),
]


def _padded_pair(short: int = 30, long: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose first example (`short` tokens) is right-padded to the second's `long`; `(ids, mask)`."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 200, (2, long), generator=g)
    mask = torch.ones_like(ids)
    ids[0, short:], mask[0, short:] = 0, 0
    return ids, mask


@pytest.mark.parametrize("overrides", FASTRG_EVAL)
def test_eval_graph_of_an_example_does_not_depend_on_its_batch(overrides):
    # One fastRG multigraph per call, from one generator, coupled every example of the batch.
    torch.manual_seed(0)
    model = SBMForSequenceClassification(make_config(**overrides)).eval()
    ids, mask = _padded_pair()
    with torch.no_grad():
        alone = model(input_ids=ids[:1, :30]).logits[0]
        batched = model(input_ids=ids, attention_mask=mask).logits[0]
        second = model(input_ids=ids.flip(0), attention_mask=mask.flip(0)).logits[1]
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(second, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides", FASTRG_EVAL)
def test_decoding_under_fastrg_is_the_same_with_and_without_cache_and_padding(overrides):
    # Decoder sites draw each pair from its own counter-based uniform in eval: a step's single query gets the graph
    # that full recomputation gives it, and padded decoder positions draw nothing for the real ones.
    torch.manual_seed(0)
    model = SBMForConditionalGeneration(make_config(initializer_range=0.3, **overrides)).eval()
    ids, mask = _padded_pair()
    dec = torch.randint(5, 200, (2, 8), generator=torch.Generator().manual_seed(4))
    dec_mask = torch.ones_like(dec)
    dec_mask[0, 5:] = 0
    other_padding = dec.clone()
    other_padding[0, 5:] = 7
    with torch.no_grad():
        source = {"encoder_outputs": model.get_encoder()(input_ids=ids, attention_mask=mask), "attention_mask": mask}
        full = model(**source, decoder_input_ids=dec).logits
        step = model(**source, decoder_input_ids=dec[:, :7], use_cache=True)
        last = model(**source, decoder_input_ids=dec[:, 7:], cache=get_cache(step))
        padded = [
            model(**source, decoder_input_ids=d, decoder_attention_mask=dec_mask).logits for d in (dec, other_padding)
        ]
        settings = {"max_new_tokens": 8, "do_sample": False, "eos_token_id": None}
        generated = model.generate(input_ids=ids, attention_mask=mask, **settings)
        alone = model.generate(input_ids=ids[:1, :30], **settings)
    torch.testing.assert_close(last.logits[:, -1], full[:, -1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded[0][0, :5], padded[1][0, :5], atol=1e-6, rtol=0)
    assert torch.equal(generated[:1], alone)


def test_most_likely_graph_keeps_its_threshold_under_fastrg():
    # `sample_at_eval=False` attends to the pairs with p + δ >= 0.5 whatever the backend (fastRG's law is for the
    # sampled decoder graphs only).
    torch.manual_seed(0)
    # Varied probabilities, on both sides of 0.5 and ln 2 (an untrained model's are all about equal).
    fields = {"sample_at_eval": False, "membership_logit_bias": 2.0, "initializer_range": 1.0}
    bernoulli = SBMForSequenceClassification(make_config(**fields)).eval()
    fastrg = SBMForSequenceClassification(make_config(sampling_backend="fastrg", **fields)).eval()
    fastrg.load_state_dict(bernoulli.state_dict())
    ids, mask = _padded_pair()
    with torch.no_grad():
        expected, out = bernoulli(input_ids=ids, attention_mask=mask), fastrg(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(out.logits, expected.logits, rtol=0, atol=0)
    torch.testing.assert_close(out.attention_density, expected.attention_density, rtol=0, atol=0)
    assert 0.05 < expected.attention_density.mean() < 0.95


def test_decoder_sites_can_fall_back_to_dense():
    model = SBMForConditionalGeneration(make_config(sbm_in_decoder=False, sbm_in_cross_attention=False))
    layer = model.model.decoder.layers[0]
    assert not layer.self_attn.use_sbm and not hasattr(layer.cross_attn, "clusters")
    assert model.model.encoder.layers[0].attention.use_sbm


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_clusters", 0),
        ("exploration_delta", 1.5),
        ("sparsity_weight", -1.0),
        ("ste_variant", "other"),
        ("ste_clip", 0.0),
        ("local_window", -2),
        ("sampling_backend", "dgl"),
        ("auto_density_threshold", 0.0),
    ],
)
def test_bad_config_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        make_config(**{field: value})


def test_density_callback_logs_mean_density_per_layer():
    config = make_config()
    model = SBMForSequenceClassification(config).train()
    callback = SBMDensityCallback()
    callback.on_train_begin(None, None, None, model=model)
    model(input_ids=torch.randint(5, 200, (2, 20)))
    logs: dict[str, float] = {}
    callback.on_log(None, None, None, model=model, logs=logs)
    assert set(logs) == {"sbm_density/layer_0", "sbm_density/layer_1", "sbm_density/mean"}
    assert all(0 < value < 1 for value in logs.values())


def test_dense_backend_low_density_eval_forward_and_backward():
    """Regression: at low density in eval the dense backend's mask is a view; the STE must still run."""
    import attnzoo
    from source_checkout import load_config

    config = load_config(
        "sbm", "tiny", sampling_backend="bernoulli", membership_logit_bias=-2.6, attention_probs_dropout_prob=0.0
    )
    model = attnzoo.SBMModel(config).eval()
    ids = torch.randint(5, config.vocab_size, (1, 96))
    out = model(input_ids=ids)
    out.last_hidden_state.pow(2).mean().backward()
    assert torch.isfinite(out.last_hidden_state).all()
    assert out.attention_density.mean() < 0.1


def test_fixed_degree_benchmark_variant_keeps_keys_per_query_constant():
    # The benchmark's "fastrg-60/query" rows: edges must grow like N (not N^2) for the growth figures to mean anything.
    from attnzoo.benchmarking import ModelSize
    from attnzoo.benchmarking.variants import fastrg_fixed_degree
    from attnzoo.sbm import SBMModel

    assert fastrg_fixed_degree(8192)["exploration_delta"] * 8192 == pytest.approx(0.01 * 4096)
    size = ModelSize(num_hidden_layers=1)
    degrees = []
    for length in (1024, 4096):
        torch.manual_seed(0)
        model = SBMModel(SBMConfig(**size.config_kwargs(length), **fastrg_fixed_degree(length))).eval()
        with torch.no_grad():
            density = model(input_ids=torch.randint(5, size.vocab_size, (1, length))).attention_density.mean()
        degrees.append(float(density) * length)
    assert 40 < degrees[0] < 80 and 40 < degrees[1] < 80, degrees
    assert abs(degrees[0] - degrees[1]) < 0.15 * degrees[1], degrees

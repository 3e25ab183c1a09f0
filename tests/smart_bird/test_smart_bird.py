"""Method tests of Smart Bird (methods.md section 1.7) and of its exact fast sampler."""

from __future__ import annotations

import pytest
import torch

from attnzoo.core.attention import DenseAttention
from attnzoo.core.masking import attention_bool_mask
from attnzoo.smart_bird import (
    SmartBirdAttention,
    SmartBirdConfig,
    SmartBirdForMaskedLM,
    SmartBirdForSequenceClassification,
    SmartBirdModel,
    sample_keys,
    sample_keys_reference,
)
from attnzoo.smart_bird.sampling import score_bounds, sketch_logits

FUNCTIONS = ("squared_inverse_log", "inverse_log", "raw", "random")


def tiny_config(**overrides) -> SmartBirdConfig:
    fields = {
        "vocab_size": 200,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "num_samples": 6,
        # The paper's attention alone; global tokens are tested in tests/models/test_global_tokens.py.
        "num_global_tokens": 0,
    }
    fields.update(overrides)
    return SmartBirdConfig(**fields)


def sketch(B: int, N: int, scale: float, seed: int = 0, d: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, d, generator=g) * scale, torch.randn(B, N, d, generator=g) * scale


def literal(q_s, k_s, key_valid, function, K, noise):
    z = sketch_logits(q_s, k_s, key_valid, 0, q_s.shape[1])
    return sample_keys_reference(score_bounds(z, torch.logsumexp(z, -1, keepdim=True), function), K, noise)


def inclusion(idx: torch.Tensor, valid: torch.Tensor, N: int) -> torch.Tensor:
    """Frequency with which each (query, key) pair is selected, over the batch and heads: (N, N)."""
    counts = torch.zeros(N, N + 1)
    flat = torch.where(valid, idx, N).permute(2, 0, 1, 3).reshape(N, -1)
    counts.scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float32))
    return counts[:, :N] / (idx.shape[0] * idx.shape[1])


# --- configuration -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_samples", 0),
        ("sketch_hidden_size", 0),
        ("sketch_num_layers", 0),
        ("sampling_function", "softmax"),
        ("eval_sampling", "argmax"),
        ("sampling_method", "gumbel"),
        ("sketch_loss_weight", -1.0),
    ],
)
def test_bad_fields_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})


def test_causal_or_cross_use_is_refused():
    with pytest.raises(ValueError, match="causal"):
        SmartBirdAttention(tiny_config(), is_causal=True)
    with pytest.raises(ValueError, match="cross"):
        SmartBirdAttention(tiny_config(), is_cross_attention=True)


# --- sampling law --------------------------------------------------------------------------------------------------


def test_log_space_scores_order_keys_like_the_papers_uniform_scores():
    q_s, k_s = sketch(1, 30, 2.0)
    z = sketch_logits(q_s, k_s, None, 0, 30)
    log_alpha = z.log_softmax(-1).double()
    u = torch.rand(1, 30, 30, dtype=torch.float64)
    for function, p in [
        ("squared_inverse_log", (1 / log_alpha) ** 2),
        ("inverse_log", -1 / log_alpha),
        ("raw", log_alpha.exp()),
    ]:
        literal_scores = u * p  # s ~ U(0, p) of Eq. (3)
        log_scores = u.log() + score_bounds(z, torch.logsumexp(z, -1, keepdim=True), function).double()
        assert torch.equal(literal_scores.argsort(-1), log_scores.argsort(-1)), function


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("scale", [0.0, 0.3, 1.0, 4.0])
@pytest.mark.parametrize(("method", "chunk_elements"), [("thinning", None), ("literal", None), ("literal", 2000)])
def test_fast_sampler_returns_the_literal_samplers_indices_for_the_same_noise(function, scale, method, chunk_elements):
    B, N, H, K = 2, 96, 3, 5
    q_s, k_s = sketch(B, N, scale, seed=1)
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[1, 70:] = False
    noise = torch.empty(B, H, N, N).exponential_(generator=torch.Generator().manual_seed(2))
    # num_candidates=8 forces thinning's head stage, exactness check and fallback at this small length; the literal
    # method (CUDA's default) ignores it, and a small chunk splits its rows into several chunks.
    idx, valid = sample_keys(
        q_s,
        k_s,
        key_valid,
        num_heads=H,
        num_samples=K,
        function=function,
        noise=noise,
        num_candidates=8,
        method=method,
        chunk_elements=chunk_elements,
    )
    ref_idx, ref_valid = literal(q_s, k_s, key_valid, function, K, noise)
    assert torch.equal(valid, ref_valid)
    assert torch.equal(torch.where(valid, idx, -1), torch.where(ref_valid, ref_idx, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("function", FUNCTIONS)
def test_cuda_default_sampler_returns_the_literal_samplers_indices_for_the_same_noise(function):
    # On CUDA `method="auto"` is the literal sampler, here in several chunks of rows: the reference's indices for the
    # same noise (both on CUDA; the 4-dim sketch keeps the chunked and the whole logits within an ulp).
    B, N, H, K = 2, 300, 4, 7
    q_s, k_s = (t.cuda() for t in sketch(B, N, 1.0, seed=1))
    key_valid = torch.ones(B, N, dtype=torch.bool, device="cuda")
    key_valid[1, 200:] = False
    noise = torch.empty(B, H, N, N).exponential_(generator=torch.Generator().manual_seed(2)).cuda()
    kw = {"num_heads": H, "num_samples": K, "function": function, "noise": noise}
    idx, valid = sample_keys(q_s, k_s, key_valid, chunk_elements=50_000, **kw)
    ref_idx, ref_valid = literal(q_s, k_s, key_valid, function, K, noise)
    assert torch.equal(valid, ref_valid)
    assert torch.equal(torch.where(valid, idx, -1), torch.where(ref_valid, ref_idx, -1))


def test_sampling_method_is_checked():
    q_s, k_s = sketch(1, 16, 1.0, seed=1)
    with pytest.raises(ValueError, match="method"):
        sample_keys(q_s, k_s, None, num_heads=1, num_samples=2, function="squared_inverse_log", method="gumbel")


@pytest.mark.parametrize("scale", [0.0, 0.6, 3.0])
def test_fast_sampler_without_given_noise_has_the_literal_samplers_distribution(scale):
    # Thinning draws no per-key noise: compare inclusion frequencies with the literal sampler's over many draws.
    N, K, reps = 64, 4, 800
    q_s, k_s = sketch(1, N, scale, seed=3)
    q_s, k_s = q_s.expand(reps, N, 4).contiguous(), k_s.expand(reps, N, 4).contiguous()
    torch.manual_seed(0)
    kw = {"num_heads": 1, "num_samples": K, "function": "squared_inverse_log", "num_candidates": 6}
    fast = sample_keys(q_s, k_s, None, method="thinning", **kw)
    slow = sample_keys(q_s, k_s, None, method="literal", **kw)
    f_fast, f_slow = inclusion(*fast, N), inclusion(*slow, N)
    p = (f_fast + f_slow) / 2
    z = (f_fast - f_slow) / (2 * p * (1 - p) / reps).sqrt().clamp(min=1e-3)
    assert z.pow(2).mean() < 1.3  # ~1 when unbiased; a biased fallback shows up as a large excess
    assert z.abs().max() < 6.0


def test_inclusion_frequency_increases_with_sketch_weight_and_random_is_uniform():
    N, K, reps = 40, 4, 2000
    # One query whose sketch weights strictly increase with the key index.
    k_s = torch.zeros(1, N, 4)
    k_s[0, :, 0] = torch.linspace(-1, 1, N)
    q_s = torch.zeros(1, N, 4)
    q_s[0, :, 0] = 1.0
    q_s, k_s = q_s.expand(reps, N, 4).contiguous(), k_s.expand(reps, N, 4).contiguous()
    torch.manual_seed(0)
    freq = inclusion(*sample_keys(q_s, k_s, None, num_heads=1, num_samples=K, function="squared_inverse_log"), N)[0]
    smooth = freq.unfold(0, 8, 8).mean(-1)  # block means: monotone beyond sampling noise
    assert torch.all(smooth[1:] > smooth[:-1])
    uniform = inclusion(*sample_keys(q_s, k_s, None, num_heads=1, num_samples=K, function="random"), N)[0]
    torch.testing.assert_close(uniform, torch.full((N,), K / N), atol=0.035, rtol=0)


def test_squared_inverse_log_spreads_over_more_keys_than_raw_weights():
    N, K, reps = 64, 4, 500
    q_s, k_s = sketch(1, N, 2.0, seed=5)
    q_s, k_s = q_s.expand(reps, N, 4).contiguous(), k_s.expand(reps, N, 4).contiguous()
    kw = {"num_heads": 1, "num_samples": K}
    distinct = {
        f: (inclusion(*sample_keys(q_s, k_s, None, function=f, **kw), N) > 0).sum().item()
        for f in ("raw", "squared_inverse_log")
    }
    assert distinct["squared_inverse_log"] > distinct["raw"]


def test_padded_keys_are_never_selected_and_short_rows_have_invalid_slots():
    B, N, H, K = 3, 50, 4, 12
    q_s, k_s = sketch(B, N, 1.0)
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[1, 5:] = False  # fewer real keys than K
    key_valid[2] = False  # a fully padded sample
    for function in (*FUNCTIONS, "topk"):
        idx, valid = sample_keys(q_s, k_s, key_valid, num_heads=H, num_samples=K, function=function)
        picked = torch.gather(key_valid[:, None, None, :].expand(B, H, N, N), 3, idx)
        assert not (valid & ~picked).any(), function
        assert valid[1].sum(-1).eq(5).all() and not valid[2].any()
        assert valid[0].all()
        # Keys are distinct within a row.
        assert (torch.where(valid, idx, -torch.arange(1, K + 1)).sort(-1).values.diff(dim=-1) != 0).all()


def test_heads_sample_independently_and_a_seeded_generator_repeats_the_draw():
    q_s, k_s = sketch(1, 300, 0.5)
    kw = {"num_heads": 4, "num_samples": 10, "function": "squared_inverse_log"}
    a, _ = sample_keys(q_s, k_s, None, generator=torch.Generator().manual_seed(7), **kw)
    b, _ = sample_keys(q_s, k_s, None, generator=torch.Generator().manual_seed(7), **kw)
    assert torch.equal(a, b)
    sets = a.sort(-1).values
    assert (sets[:, 0] != sets[:, 1]).any(-1).float().mean() > 0.9


def test_long_rows_are_sampled_in_chunks_without_head_by_length_squared_memory():
    # 1024^2 * 4 heads of noise would be 16 MB; with small chunks only (rows x N) tensors are ever built.
    q_s, k_s = sketch(1, 1024, 0.0)
    idx, valid = sample_keys(
        q_s, k_s, None, num_heads=4, num_samples=20, function="squared_inverse_log", chunk_elements=2**16
    )
    assert valid.all() and idx.shape == (1, 4, 1024, 20)
    # Flat sketch: every key is equally likely, across the whole row.
    assert idx.float().mean().sub(511.5).abs() < 10


# --- attention -----------------------------------------------------------------------------------------------------


def run_attention(config, q, k, v, key_valid, sketch_qk):
    attn = SmartBirdAttention(config, layer_idx=0).eval()
    attn.sketch = sketch_qk
    return attn, attn.attend(q, k, v, key_valid)


def test_k_at_least_length_equals_dense_softmax_attention():
    B, H, N, d = 2, 4, 24, 8
    config = tiny_config(num_samples=64)
    q, k, v = (torch.randn(B, H, N, d) for _ in range(3))
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[1, 17:] = False
    _, out = run_attention(config, q, k, v, key_valid, sketch(B, N, 1.0))
    dense = DenseAttention(config).eval()
    expected = dense.dense_reference(q, k, v, attention_bool_mask(key_valid, N, N, False)).hidden_states
    torch.testing.assert_close(out.hidden_states[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.hidden_states[1, :, :17], expected[1, :, :17], atol=1e-5, rtol=1e-5)


def test_fast_path_equals_reference_path_in_outputs_and_gradients():
    B, H, N, d = 2, 4, 50, 8
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[0, 41:] = False
    qk = sketch(B, N, 1.0)
    results = []
    for backend in ("fast", "reference"):
        q, k, v = (torch.randn(B, H, N, d, generator=torch.Generator().manual_seed(i)) for i in range(3))
        for t in (q, k, v):
            t.requires_grad_(True)
        _, out = run_attention(tiny_config(attention_backend=backend), q, k, v, key_valid, qk)
        out.hidden_states.pow(2).sum().backward()
        results.append((out.hidden_states, q.grad, k.grad, v.grad, out.density))
    for fast, ref in zip(*results, strict=True):
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    # Density, per example: K of the example's real keys per real query.
    expected = torch.tensor([6 / 41, 6 / 50])[:, None].expand(B, H)
    torch.testing.assert_close(results[0][4], expected)


def test_attention_weights_live_only_on_sampled_real_keys():
    B, H, N, d = 1, 4, 40, 8
    config = tiny_config()
    q, k, v = (torch.randn(B, H, N, d) for _ in range(3))
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[0, 30:] = False
    attn = SmartBirdAttention(config, layer_idx=0).eval()
    attn.sketch = sketch(B, N, 1.0)
    weights = attn.attend(q, k, v, key_valid, output_attentions=True).attn_weights
    assert ((weights > 0).sum(-1)[0, :, :30] == config.num_samples).all()
    assert weights[..., 30:].abs().max() == 0


def test_eval_topk_mode_uses_the_same_top_sketch_keys_for_every_head():
    attn = SmartBirdAttention(tiny_config(eval_sampling="topk"), layer_idx=0).eval()
    q_s, k_s = sketch(1, 40, 1.0)
    attn.sketch = (q_s, k_s)
    idx, _ = attn.select(torch.zeros(1, 4, 40, 8), None)
    expected = sketch_logits(q_s, k_s, None, 0, 40).topk(6).indices
    assert all(torch.equal(idx[:, h].sort(-1).values, expected.sort(-1).values) for h in range(4))


def test_short_rows_and_fully_padded_samples_stay_finite():
    config = tiny_config(num_samples=20)
    model = SmartBirdModel(config).train()
    ids = torch.randint(5, 200, (3, 30))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    mask[2] = 0
    out = model(input_ids=ids, attention_mask=mask)
    assert torch.isfinite(out.last_hidden_state).all()
    out.last_hidden_state.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# --- sketch network ------------------------------------------------------------------------------------------------


def test_main_loss_never_reaches_the_sketch_and_sketch_loss_reaches_only_the_sketch():
    torch.manual_seed(0)
    model = SmartBirdForSequenceClassification(tiny_config(num_labels=3)).train()
    ids = torch.randint(5, 200, (2, 30), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, labels=torch.tensor([0, 2]))
    names, params = zip(*model.named_parameters(), strict=True)
    main = torch.autograd.grad(out.loss - out.aux_loss, params, allow_unused=True, retain_graph=True)
    aux = torch.autograd.grad(out.aux_loss, params, allow_unused=True)
    for name, g_main, g_aux in zip(names, main, aux, strict=True):
        in_sketch = ".sketch." in name
        assert in_sketch != (g_main is not None and bool(g_main.any())), name
        if name.endswith("sketch.pool_score.bias"):
            # The pooling softmax does not move when every score moves by the same bias: its gradient is zero up to
            # rounding (exactly zero on some inputs), so it is checked to be negligible rather than nonzero.
            assert g_aux is not None and g_aux.abs().max() < 1e-6, name
            continue
        assert in_sketch == (g_aux is not None and bool(g_aux.any())), name


def test_sketch_loss_is_weighted_and_frozen_sketch_has_none():
    ids, labels = torch.randint(5, 200, (2, 30)), torch.tensor([0, 1])
    # Auxiliary losses are training terms (eval outputs carry none); without dropout the sketch loss is deterministic.
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    torch.manual_seed(0)
    a = SmartBirdForSequenceClassification(tiny_config(**no_dropout)).train()(input_ids=ids, labels=labels).aux_loss
    torch.manual_seed(0)
    b = SmartBirdForSequenceClassification(tiny_config(sketch_loss_weight=0.5, **no_dropout)).train()(
        input_ids=ids, labels=labels
    )
    torch.testing.assert_close(b.aux_loss, 0.5 * a)
    assert SmartBirdForSequenceClassification(tiny_config()).eval()(input_ids=ids, labels=labels).aux_loss is None
    frozen = SmartBirdForSequenceClassification(tiny_config(sketch_freeze=True))
    assert frozen(input_ids=ids, labels=labels).aux_loss is None
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if ".sketch." in n)


def test_masked_lm_sketch_trains_with_a_masked_lm_loss():
    model = SmartBirdForMaskedLM(tiny_config()).train()
    ids = torch.randint(5, 200, (2, 30))
    labels = torch.full_like(ids, -100)
    labels[:, ::5] = ids[:, ::5]
    out = model(input_ids=ids, labels=labels)
    assert torch.isfinite(out.aux_loss) and out.aux_loss > 0
    out.aux_loss.backward()
    assert model.model.encoder.sketch.input_proj.weight.grad.abs().sum() > 0


def test_pca_initialisation_projects_embeddings_on_their_principal_axes():
    model = SmartBirdModel(tiny_config())
    model.init_sketch_from_main_embeddings()
    weight = model.encoder.embeddings.word_embeddings.weight.detach()
    coords = model.encoder.sketch.input_proj(weight).detach()  # (V, 4)
    torch.testing.assert_close(coords.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    variances = coords.var(0)
    assert torch.all(variances[:-1] >= variances[1:])
    centred = weight - weight.mean(0)
    top = torch.linalg.svdvals(centred)[:4] ** 2 / (weight.shape[0] - 1)
    torch.testing.assert_close(variances, top, rtol=1e-4, atol=1e-6)


def test_eval_attention_weights_of_an_example_shorter_than_k_in_a_batch_equal_the_fast_path():
    # Its unused slots point at key 0 (valid False); building the dense mask with `scatter_` let them erase a key 0
    # that was sampled, so `output_attentions=True` attended differently from the fast path (by 1e-2).
    torch.manual_seed(0)
    model = SmartBirdModel(tiny_config(num_samples=20)).eval()
    ids = torch.randint(5, 200, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, 8:], mask[1, 8:] = 0, 0  # 8 real tokens: fewer than K = 20
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask).last_hidden_state
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        alone = model(input_ids=ids[1:, :8], output_attentions=True)
    torch.testing.assert_close(out.last_hidden_state[:, :8], fast[:, :8], rtol=1e-5, atol=1e-6)
    for batched, single in zip(out.attentions, alone.attentions, strict=True):
        torch.testing.assert_close(batched[1, :, :8, :8], single[0], rtol=1e-5, atol=1e-6)
        assert torch.all((batched[1, :, :8, :8] > 0).sum(-1) == 8)  # fewer real keys than K: every one attended


# --- loading for another label count ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_labels", [3, 1])
def test_a_masked_lm_checkpoint_fine_tunes_on_another_label_count(tmp_path, num_labels):
    """Every checkpoint holds the sketch's own classifier (a masked-LM one its untrained 2-label one): it loads fresh
    for another label count, as the classification head does, and everything else loads as saved."""
    source = SmartBirdForMaskedLM(tiny_config())
    source.save_pretrained(tmp_path)
    model, info = SmartBirdForSequenceClassification.from_pretrained(
        tmp_path, num_labels=num_labels, output_loading_info=True
    )
    assert model.model.encoder.sketch.classifier.weight.shape == (num_labels, model.config.sketch_hidden_size)
    assert {name for name, _, _ in info["mismatched_keys"]} == {
        "model.encoder.sketch.classifier.weight",
        "model.encoder.sketch.classifier.bias",
    }
    saved = source.model.state_dict()
    for name, tensor in model.model.state_dict().items():
        if "sketch.classifier" not in name:
            torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0, msg=name)
    labels = torch.randint(num_labels, (2,)) if num_labels > 1 else torch.randn(2)
    model(input_ids=torch.randint(5, 200, (2, 16)), labels=labels).loss.backward()


def test_other_size_mismatches_still_stop_the_load(tmp_path):
    SmartBirdForSequenceClassification(tiny_config(num_labels=1)).save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match=r"classifier\.out_proj\.bias: checkpoint \(1,\), model \(3,\)"):
        SmartBirdForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    model = SmartBirdForSequenceClassification.from_pretrained(tmp_path, num_labels=3, ignore_mismatched_sizes=True)
    assert model.classifier.out_proj.weight.shape[0] == 3

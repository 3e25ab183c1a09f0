"""A²-Former method tests (methods.md §2.7): positions, interpolation, gradients, limits, causality, padding."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, DynamicCache

from attnzoo.a2former import (
    A2FormerAttention,
    A2FormerConfig,
    A2FormerForConditionalGeneration,
    A2FormerForSequenceClassification,
    A2FormerModel,
)
from attnzoo.kernels import dense_masked_attention, gathered_attention
from attnzoo.testing import assert_same_gradients, probe_loss
from source_checkout import REPO_ROOT, load_config

HIDDEN, HEADS, POINTS = 32, 4, 5


def _config(**overrides) -> A2FormerConfig:
    fields = {
        "vocab_size": 100,
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "max_position_embeddings": 128,
        "num_sample_points": POINTS,
        "attention_probs_dropout_prob": 0.0,
        "hidden_dropout_prob": 0.0,
        # The paper's attention alone; global tokens are tested in tests/models/test_global_tokens.py.
        "num_global_tokens": 0,
    }
    fields.update(overrides)
    return A2FormerConfig(**fields)


def _attention(dtype=torch.float64, **overrides) -> A2FormerAttention:
    torch.manual_seed(0)
    attn = A2FormerAttention(_config(**overrides), is_causal=overrides.pop("is_causal", False)).to(dtype)
    attn.init_method_weights()
    with torch.no_grad():
        attn.offset_weight.normal_(0.0, 2.0)  # data-dependent offsets, so the tests exercise them
    return attn.eval()


def _qkv(B, N, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, HEADS, N, HIDDEN // HEADS, generator=g, dtype=dtype, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_sample_points", 0),
        ("attention_weights", "softmax"),
        ("offset_bias_init", "random"),
        ("offset_scale", 0.0),
        ("position_bound", "wrap"),
        ("length_projection", 1000),
    ],
)
def test_bad_config_fields_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        _config(**{field: value})


def test_linear_weights_refuse_rotary_positions():
    """The linear weights never take q . k: rotary positions would silently leave the model without positions."""
    with pytest.raises(ValueError, match="rotary.*attention_weights='linear'"):
        _config(attention_weights="linear", position_embedding_type="rotary")
    assert _config(attention_weights="linear", position_embedding_type="sinusoidal").attention_weights == "linear"


def test_repository_configs_load_through_auto_config():
    for size in ("tiny", "small", "base"):
        config = AutoConfig.from_pretrained(REPO_ROOT / "configs" / "models" / "a2former" / f"{size}.json")
        assert isinstance(config, A2FormerConfig) and config.num_sample_points == 10


def test_initial_offsets_are_distinct_per_head_and_point():
    attn = A2FormerAttention(_config(num_sample_points=10))
    attn.init_method_weights()
    grid = attn.offset_bias.view(HEADS, 10)
    for head in grid:
        assert head.unique().numel() == 10 and not (head == 0).any()
    assert grid.abs().amax(-1).unique().numel() == HEADS  # heads start with different reach
    zeros = A2FormerAttention(_config(offset_bias_init="zeros"))
    zeros.init_method_weights()
    assert not zeros.offset_bias.any()


def test_initial_positions_do_not_depend_on_offset_scale():
    x = torch.randn(1, 7, HIDDEN)
    offsets = []
    for scale in (1.0, 8.0):
        attn = A2FormerAttention(_config(offset_scale=scale))
        attn.init_method_weights()
        offsets.append(attn.predict_offsets(x)[0])
    torch.testing.assert_close(offsets[0], offsets[1])


def test_integer_positions_equal_a_plain_gather():
    attn = _attention()
    q, k, v = _qkv(2, 12)
    offsets = torch.randint(-15, 15, (2, HEADS, 12, POINTS)).double()
    out = attn.attend(q, k, v, None, offsets=offsets).hidden_states
    _, i0, _, _ = attn.sample_positions(offsets, None, 12)
    torch.testing.assert_close(out, gathered_attention(q, k, v, i0), atol=1e-12, rtol=0)


def test_interpolate_then_project_equals_project_then_interpolate():
    attn = _attention()
    x = torch.randn(1, 9, HIDDEN, dtype=torch.float64)
    positions = torch.rand(1, HEADS, 9, POINTS, dtype=torch.float64) * 8
    i0 = positions.floor().long()
    w1 = (positions - i0)[..., None]
    projected = attn._split(attn.k_proj(x))  # (1, H, N, d)

    def lerp(t):  # (1, H, N, d) at the positions -> (1, H, N, K, d)
        gather = lambda i: t[0, torch.arange(HEADS)[:, None, None], i[0]][None]  # noqa: E731
        return (1 - w1) * gather(i0) + w1 * gather(i0 + 1)

    per_head_x = x[:, None].expand(1, HEADS, 9, HIDDEN)
    interpolated_x = lerp(per_head_x)  # (1, H, N, K, D)
    then_projected = attn.k_proj(interpolated_x).view(1, HEADS, 9, POINTS, HEADS, -1)
    then_projected = torch.stack([then_projected[:, h, :, :, h] for h in range(HEADS)], 1)
    torch.testing.assert_close(lerp(projected), then_projected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("bound", ["clamp", "reflect"])
def test_position_gradient_matches_finite_differences(bound):
    attn = _attention(position_bound=bound)
    q, k, v = (t.detach() for t in _qkv(1, 10))
    key_valid = torch.ones(1, 10, dtype=torch.bool)
    key_valid[:, 8:] = False
    # Fractional positions away from integers and from the bounds, where the map is differentiable.
    g = torch.Generator().manual_seed(0)
    shape = (1, HEADS, 10, POINTS)
    targets = torch.randint(0, 7, shape, generator=g) + 0.2 + 0.6 * torch.rand(shape, generator=g, dtype=torch.float64)
    offsets = (targets - torch.arange(10.0).view(1, 1, 10, 1)).requires_grad_(True)
    weights = torch.randn(1, HEADS, 10, HIDDEN // HEADS, generator=g, dtype=torch.float64)

    def loss(off):
        return (attn.attend(q, k, v, key_valid, offsets=off).hidden_states * weights).sum()

    (grad,) = torch.autograd.grad(loss(offsets), offsets)
    eps = 1e-6
    for _ in range(4):
        direction = torch.randn(shape, generator=g, dtype=torch.float64)
        numeric = (loss(offsets + eps * direction) - loss(offsets - eps * direction)) / (2 * eps)
        torch.testing.assert_close((grad * direction).sum(), numeric.detach(), atol=1e-7, rtol=1e-6)


def test_all_positions_once_equals_dense_attention():
    n = 11
    attn = _attention(num_sample_points=n)
    q, k, v = _qkv(2, n)
    offsets = (torch.arange(n)[None, :] - torch.arange(n)[:, None]).double().expand(2, HEADS, n, n)  # key - query
    out = attn.attend(q, k, v, None, offsets=offsets).hidden_states
    torch.testing.assert_close(out, dense_masked_attention(q, k, v)[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("bound", ["clamp", "reflect"])
@pytest.mark.parametrize("causal", [False, True])
def test_positions_never_leave_the_real_tokens_nor_reach_the_future(bound, causal):
    attn = _attention(position_bound=bound, is_causal=causal)
    key_valid = torch.ones(3, 20, dtype=torch.bool)
    key_valid[0, 15:] = False  # right padding
    key_valid[1, :4] = False  # left padding
    offsets = torch.randn(3, HEADS, 20, POINTS, dtype=torch.float64) * 40
    positions, i0, i1, row_valid = attn.sample_positions(offsets, key_valid, 20)
    first = torch.tensor([0, 4, 0]).view(3, 1, 1, 1)
    last = torch.tensor([14, 19, 19]).view(3, 1, 1, 1)
    if causal:
        last = torch.minimum(last, torch.arange(20).view(1, 1, 20, 1))
    rows = row_valid.expand_as(i0)
    for index in (i0, i1, positions):
        assert ((index >= first) & (index <= last))[rows].all()
    assert (i1 - i0).le(1).all() and (i1 >= i0).all()
    if causal:
        assert not row_valid[1, 0, :4].any() and row_valid[1, 0, 4:].all()


def test_causal_output_does_not_depend_on_the_future():
    attn = _attention(is_causal=True)
    x = torch.randn(1, 12, HIDDEN, dtype=torch.float64)
    changed = x.clone()
    changed[:, 7:] = torch.randn(1, 5, HIDDEN, dtype=torch.float64)
    torch.testing.assert_close(attn(x).hidden_states[:, :7], attn(changed).hidden_states[:, :7], atol=0, rtol=0)


def test_causal_decoding_with_cache_equals_the_full_sequence():
    attn = _attention(is_causal=True)
    x = torch.randn(2, 9, HIDDEN, dtype=torch.float64)
    full = attn(x).hidden_states
    cache = DynamicCache(config=_config())
    steps = [attn(x[:, :4], cache=cache).hidden_states]
    steps += [attn(x[:, t : t + 1], cache=cache).hidden_states for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=0)


def test_reflect_keeps_the_gradient_of_points_pushed_outside():
    q, k, v = (t.detach() for t in _qkv(1, 6))
    for bound, expect_gradient in (("clamp", False), ("reflect", True)):
        attn = _attention(position_bound=bound)
        offsets = torch.full((1, HEADS, 6, POINTS), 20.3, dtype=torch.float64, requires_grad=True)
        out = attn.attend(q, k, v, None, offsets=offsets).hidden_states
        (grad,) = torch.autograd.grad(out.sum(), offsets)
        assert bool(grad.abs().sum() > 0) == expect_gradient


def _model_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (3, 24), generator=g)
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, 17:] = 0
    mask[2, 5:] = 0
    return ids, mask


def test_padding_never_changes_real_outputs_exactly():
    torch.manual_seed(0)
    model = A2FormerModel(_config()).eval()
    ids, mask = _model_inputs()
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    other_pads = ids.masked_fill(mask == 0, 7)
    assert torch.equal(
        model(input_ids=other_pads, attention_mask=mask).last_hidden_state[mask.bool()], out[mask.bool()]
    )
    alone = model(input_ids=ids[1:2, :17]).last_hidden_state
    assert torch.equal(alone[0], out[1, :17])


def test_keys_in_holes_of_the_mask_get_no_weight_and_never_change_real_outputs():
    model = A2FormerModel(_config()).eval()
    ids, mask = _model_inputs()
    mask[0, 3:9] = 0  # a masked span inside the real tokens
    mask[1, 10] = 0  # a one-token hole
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    for weights in out.attentions:  # (B, H, N, N)
        assert not weights.permute(0, 2, 1, 3)[~mask.bool()[:, None, None, :].expand(-1, 24, HEADS, -1)].any()
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, HEADS, 24), rtol=0, atol=1e-6)
    other_ids = ids.masked_fill(mask == 0, 7)
    changed = model(input_ids=other_ids, attention_mask=mask, output_attentions=True).last_hidden_state
    assert torch.equal(changed[mask.bool()], out.last_hidden_state[mask.bool()])


def _bridged_reference(attn, q, k, v, offsets, key_valid):
    """Dense A² attention from the rule itself: each point interpolates between the nearest real keys around it."""
    B, H, N, K = offsets.shape
    interp = torch.zeros(B, H, N, K, N, dtype=q.dtype)
    for b in range(B):
        real = key_valid[b].nonzero().flatten().tolist()
        for i in range(N):
            allowed = [j for j in real if not attn.is_causal or j <= i]
            if not allowed:
                continue
            for h in range(H):
                for s in range(K):
                    p = (i + offsets[b, h, i, s]).clamp(allowed[0], allowed[-1])
                    left = max(j for j in allowed if j <= p)
                    right = min(j for j in allowed if j >= p)
                    w = (p - left) / (right - left) if right > left else p * 0.0
                    interp[b, h, i, s, left] = interp[b, h, i, s, left] + 1 - w
                    interp[b, h, i, s, right] = interp[b, h, i, s, right] + w
    scores = torch.einsum("bhnd,bhnsm,bhmd->bhns", q, interp, k) * attn.scaling
    rows = interp.sum((-1, -2)) > 0  # (B, H, N): queries with at least one allowed key
    probs = torch.where(rows[..., None], scores.softmax(-1), 0.0)
    return torch.einsum("bhns,bhnsm,bhmd->bhnd", probs, interp, v)


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_holes_match_a_dense_reference_of_the_bridging_rule(backend, causal):
    attn = _attention(is_causal=causal, attention_backend=backend)
    N = 14
    key_valid = torch.ones(2, N, dtype=torch.bool)
    key_valid[0, [0, 4, 5, 6, 9, 13]] = False  # left padding, a 3-token hole, a 1-token hole, right padding
    key_valid[1, 2:12] = False  # one long hole: every point between the two ends bridges it
    q, k, v = _qkv(2, N)
    g = torch.Generator().manual_seed(1)
    offsets = (torch.randn(2, HEADS, N, POINTS, generator=g, dtype=torch.float64) * 4).requires_grad_(True)
    out = attn.attend(q, k, v, key_valid, offsets=offsets).hidden_states
    expected = _bridged_reference(attn, q, k, v, offsets, key_valid)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v, offsets))
    expected_grads = torch.autograd.grad(expected.pow(2).sum(), (q, k, v, offsets))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("weights", ["dot_product", "linear"])
def test_reference_backend_matches_fast_path_in_training(weights):
    ids, mask = _model_inputs()
    results = []
    for backend in ("fast", "reference"):
        torch.manual_seed(0)
        config = _config(attention_backend=backend, attention_weights=weights, attention_probs_dropout_prob=0.2)
        model = A2FormerModel(config).double().train()
        with torch.no_grad():
            for layer in model.encoder.layers:
                layer.attention.offset_weight.normal_(0.0, 1.0)
        torch.manual_seed(1)
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        probe_loss(out, mask).backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (fast, fast_grads), (ref, ref_grads) = results
    torch.testing.assert_close(fast, ref, atol=1e-10, rtol=0)
    assert any("offset_weight" in name for name in fast_grads)
    assert_same_gradients(fast_grads, ref_grads, rtol=1e-9, atol=1e-9, atol_of_largest=1e-12)


def test_attention_weights_and_density():
    model = A2FormerModel(_config()).eval()
    ids, mask = _model_inputs()
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    weights = out.attentions[0]  # (B, H, N, N)
    assert weights.shape == (3, HEADS, 24, 24)
    assert not weights[2, :, :, 5:].any()  # no weight on padding
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, HEADS, 24))
    density = out.attention_density  # (B, layers, H)
    # Initial positions are integers: at most K distinct keys per query.
    assert density.shape == (3, 2, HEADS) and (density > 0).all() and (density <= POINTS / 5).all()


def test_linear_weight_mode_starts_uniform():
    attn = _attention(attention_weights="linear")
    q, k, v = _qkv(1, 8)
    x = torch.randn(1, 8, HIDDEN, dtype=torch.float64)
    offsets, logits = attn.predict_offsets(x)
    assert not logits.any()
    positions, i0, i1, _ = attn.sample_positions(offsets, None, 8)
    w1 = positions - i0
    v_points = (1 - w1)[..., None] * v[0, :, i0[0]] + w1[..., None] * v[0, :, i1[0]]  # (H, N, K, d) via broadcasting
    neighbours, mix = torch.stack((i0, i1), -1), torch.stack((1.0 - w1, w1), -1)
    expected = gathered_attention(q, k, v, neighbours, weight=mix, logit_bias=logits, dot_product=False)
    torch.testing.assert_close(expected, v_points.diagonal(dim1=0, dim2=1).permute(3, 0, 1, 2).mean(-2)[None])


def test_length_projection_classifier_mixes_positions():
    config = _config(length_projection=16, num_labels=2, max_position_embeddings=64)
    model = A2FormerForSequenceClassification(config).eval()
    ids, mask = _model_inputs()
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 0]), output_hidden_states=True)
    assert out.logits.shape == (3, 2) and out.hidden_states[-1].shape == (3, 16, HIDDEN)
    changed = model(input_ids=ids.masked_fill(mask == 0, 9), attention_mask=mask).logits
    torch.testing.assert_close(changed, out.logits, atol=0, rtol=0)


def test_tiny_config_builds_every_head_through_auto_classes():
    config = load_config("a2former", "tiny", num_labels=2)
    model = AutoModelForSequenceClassification.from_config(config)
    assert isinstance(model, A2FormerForSequenceClassification)


def test_causal_variant_in_a_decoder_generates_the_same_with_and_without_cache():
    # The decoder stays dense by default; a subclass switching the causal variant on must be cache-consistent.
    class CausalA2Decoder(A2FormerForConditionalGeneration):
        decoder_self_attention_class = A2FormerAttention

    torch.manual_seed(0)
    model = CausalA2Decoder(_config(decoder_max_position_embeddings=32)).eval()
    with torch.no_grad():
        for layer in model.model.decoder.layers:
            assert isinstance(layer.self_attn, A2FormerAttention) and layer.self_attn.is_causal
            layer.self_attn.offset_weight.normal_(0.0, 2.0)
    ids, mask = _model_inputs()
    kwargs = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False, "num_beams": 1}
    kwargs.update(output_scores=True, return_dict_in_generate=True)
    with_cache = model.generate(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)
    without_cache = model.generate(input_ids=ids, attention_mask=mask, use_cache=False, **kwargs)
    assert with_cache.sequences.shape[1] == 13
    assert torch.equal(with_cache.sequences, without_cache.sequences)
    torch.testing.assert_close(torch.stack(with_cache.scores), torch.stack(without_cache.scores), atol=1e-5, rtol=0)

"""Encoder positions (`position_embedding_type`): BERT's learned table, the fixed sinusoidal one, or rotary positions
(RoPE), every family."""

from __future__ import annotations

import math

import pytest
import torch

from attnzoo.core.positions import SinusoidalPositions, apply_rotary, rotary_angles, sinusoidal_table
from attnzoo.registry import FAMILIES
from source_checkout import load_config

FAMILY_NAMES = sorted(FAMILIES)


def _config(model_type: str, **overrides):
    fields = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **overrides}
    return load_config(FAMILIES[model_type], "tiny", **fields)


def _classifier(model_type: str, **overrides):
    torch.manual_seed(0)
    return FAMILIES[model_type].sequence_classification_class(_config(model_type, **overrides)).eval()


def _expected_table(config, dim: int) -> torch.Tensor:
    """The table a model of `config` must hold at width `dim`: the RMS of a fresh embedding row."""
    return sinusoidal_table(config.max_position_embeddings, dim, config.initializer_range * 2**0.5)


def test_table_is_the_sine_cosine_formula():
    table = sinusoidal_table(50, 8, scale=0.5)
    for p in (0, 1, 17, 49):
        for i in range(4):
            angle = p / 10000 ** (2 * i / 8)
            assert table[p, 2 * i].item() == pytest.approx(0.5 * math.sin(angle), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(0.5 * math.cos(angle), abs=1e-6)


def test_an_offset_is_the_same_rotation_at_every_position():
    """Why the table suits long inputs: row p + k is a fixed linear map of row p, whatever p is."""
    table = sinusoidal_table(4096, 16, scale=1.0).double()
    offset = 37
    # Least-squares map fitted on every 7th row (the slow frequencies need the whole range to be determined),
    # then checked on all the other rows: exact (to round-off) only if the same map serves every position.
    fit = torch.arange(0, 4096 - offset, 7)
    rotation = torch.linalg.lstsq(table[fit], table[fit + offset]).solution  # (16, 16)
    rest = torch.tensor([p for p in range(4096 - offset) if p % 7])
    assert torch.allclose(table[rest] @ rotation, table[rest + offset], atol=1e-5)  # fp32 table
    # A learned-like table (random rows) has no such map.
    noise = torch.randn(4096, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    noise_map = torch.linalg.lstsq(noise[fit], noise[fit + offset]).solution
    assert not torch.allclose(noise[rest] @ noise_map, noise[rest + offset], atol=1e-2)


def test_table_has_the_scale_of_a_fresh_embedding_row():
    config = _config("dense_transformer", position_embedding_type="sinusoidal")
    model = FAMILIES["dense_transformer"].model_class(config)
    table = model.encoder.embeddings.position_embeddings.table
    words = model.encoder.embeddings.word_embeddings.weight
    assert table.pow(2).mean().sqrt().item() == pytest.approx(config.initializer_range, rel=1e-3)
    assert table.pow(2).mean().sqrt().item() == pytest.approx(words.pow(2).mean().sqrt().item(), rel=0.1)


@pytest.mark.parametrize("model_type", FAMILY_NAMES)
def test_sinusoidal_encoder_adds_the_table_and_saves_no_position_tensor(model_type, tmp_path):
    model = _classifier(model_type, position_embedding_type="sinusoidal")
    embeddings = model.base_model.encoder.embeddings
    assert isinstance(embeddings.position_embeddings, SinusoidalPositions)
    # Nothing per position anywhere in the model (Smart Bird's sketch included) and nothing saved for it.
    assert not [name for name, _ in model.named_parameters() if "position" in name]
    assert not [name for name in model.state_dict() if "position" in name]
    ids = torch.randint(5, model.config.vocab_size, (2, 40))
    table = _expected_table(model.config, model.config.hidden_size)
    expected = embeddings.LayerNorm(
        embeddings.word_embeddings(ids) + table[:40] + embeddings.token_type_embeddings.weight[0]
    )
    assert torch.allclose(embeddings(ids, None, None, None), expected)

    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    logits = model(input_ids=ids, attention_mask=mask).logits
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert reloaded.config.position_embedding_type == "sinusoidal"
    torch.testing.assert_close(reloaded.base_model.encoder.embeddings.position_embeddings.table, table)
    torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask).logits, logits)


@pytest.mark.parametrize("model_type", ["dense_transformer", "sparse_transformer"])
def test_position_order_still_matters(model_type):
    """Fixed positions are positions: permuting the tokens changes a first-token summary."""
    model = FAMILIES[model_type].model_class(_config(model_type, position_embedding_type="sinusoidal")).eval()
    ids = torch.randint(5, model.config.vocab_size, (1, 32))
    swapped = ids.clone()
    swapped[0, 1:] = ids[0, 1:].flip(0)
    first = model(input_ids=ids).last_hidden_state[0, 0]
    assert not torch.allclose(first, model(input_ids=swapped).last_hidden_state[0, 0], atol=1e-4)


def test_meta_device_build_is_initialised_to_the_table():
    """`from_pretrained` builds on the meta device and initialises what was not loaded: the buffer must come back."""
    config = _config("sparse_transformer", position_embedding_type="sinusoidal")
    model_class = FAMILIES["sparse_transformer"].model_class
    with torch.device("meta"):
        model = model_class(config)
    model.to_empty(device="cpu")
    model.init_weights()
    expected = _expected_table(config, config.hidden_size)
    torch.testing.assert_close(model.encoder.embeddings.position_embeddings.table, expected)


def test_training_leaves_the_table_fixed():
    model = _classifier("sparse_transformer", position_embedding_type="sinusoidal").train()
    table = model.base_model.encoder.embeddings.position_embeddings.table.clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(5, model.config.vocab_size, (4, 40))
    model(input_ids=ids, labels=torch.tensor([0, 1, 0, 1])).loss.backward()
    optimizer.step()
    assert torch.equal(model.base_model.encoder.embeddings.position_embeddings.table, table)


def test_smart_bird_sketch_uses_the_fixed_table_at_its_own_width():
    config = _config("smart_bird", position_embedding_type="sinusoidal", sketch_hidden_size=6)
    model = FAMILIES["smart_bird"].model_class(config)
    sketch_positions = model.encoder.sketch.position_embeddings
    assert isinstance(sketch_positions, SinusoidalPositions)
    expected = _expected_table(config, 6)
    torch.testing.assert_close(sketch_positions.table, expected)
    with pytest.raises(ValueError, match="even `sketch_hidden_size`"):
        _config("smart_bird", position_embedding_type="sinusoidal", sketch_hidden_size=5)


@pytest.mark.parametrize("position_embedding_type", ["absolute", "sinusoidal"])
def test_position_ids_outside_the_table_are_refused(position_embedding_type):
    """A negative id would silently read the table's last row; one past the end is an obscure index error."""
    model = _classifier("dense_transformer", position_embedding_type=position_embedding_type)
    ids = torch.randint(5, model.config.vocab_size, (1, 4))
    for bad in (-1, model.config.max_position_embeddings):
        position_ids = torch.tensor([[0, 1, 2, bad]])
        with pytest.raises(ValueError, match="position_ids.*max_position_embeddings"):
            model(input_ids=ids, position_ids=position_ids)
    assert model(input_ids=ids, position_ids=torch.tensor([[3, 2, 1, 0]])).logits.shape == (1, 2)


@pytest.mark.parametrize("position_embedding_type", ["absolute", "sinusoidal", "rotary"])
def test_position_ids_of_another_length_are_refused(position_embedding_type):
    """One position per token: with rotary positions a longer `0 .. M - 1` would otherwise pass and be ignored."""
    model = _classifier("dense_transformer", position_embedding_type=position_embedding_type)
    ids = torch.randint(5, model.config.vocab_size, (1, 4))
    for position_ids in (torch.arange(6)[None], torch.tensor([[0]])):
        with pytest.raises(ValueError, match="one position per token.*4 tokens"):
            model(input_ids=ids, position_ids=position_ids)


def test_bf16_model_adds_the_fp32_table_in_bf16(tmp_path):
    model = _classifier("sparse_transformer", position_embedding_type="sinusoidal")
    ids = torch.randint(5, model.config.vocab_size, (2, 40))
    reference = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    logits = loaded(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), reference, atol=5e-2, rtol=5e-2)


def test_bad_position_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="position_embedding_type"):
        _config("dense_transformer", position_embedding_type="alibi")
    with pytest.raises(ValueError, match="even head size"):  # width 36 over 4 heads: head size 9
        _config("dense_transformer", position_embedding_type="rotary", hidden_size=36, num_attention_heads=4)
    with pytest.raises(ValueError, match="even `sketch_hidden_size`"):
        _config("smart_bird", position_embedding_type="rotary", sketch_hidden_size=5)
    with pytest.raises(ValueError, match="even `hidden_size`"):
        _config("dense_transformer", position_embedding_type="sinusoidal", hidden_size=27, num_attention_heads=3)


def test_default_stays_learned_so_bert_checkpoints_and_v0_1_models_load():
    model = _classifier("dense_transformer")
    assert model.config.position_embedding_type == "absolute"
    assert "model.encoder.embeddings.position_embeddings.weight" in model.state_dict()


# ----- rotary positions -------------------------------------------------------------------------------------------


def _rotary_reference(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE written as complex numbers: coordinate pairs (i, i + d/2) times e^{i p theta_i}, position by position."""
    d = x.shape[-1]
    pairs = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double())
    out = torch.empty_like(pairs)
    for p in range(x.shape[-2]):
        theta = torch.tensor([p / base ** (2 * i / d) for i in range(d // 2)], dtype=torch.float64)
        out[..., p, :] = pairs[..., p, :] * torch.polar(torch.ones_like(theta), theta)
    return torch.cat((out.real, out.imag), dim=-1).to(x.dtype)


def test_rotary_matches_the_complex_number_reference_forward_and_backward():
    x = torch.randn(2, 3, 17, 8, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(apply_rotary(x), _rotary_reference(x.detach()))
    # A rotation is orthogonal: the gradient is the output gradient turned back.
    grad = torch.randn(2, 3, 17, 8, dtype=torch.float64)
    apply_rotary(x).backward(grad)
    torch.testing.assert_close(x.grad, apply_rotary(grad, inverse=True))
    torch.autograd.gradcheck(apply_rotary, (x[:1, :1, :5].detach().requires_grad_(),))
    # fp32 in, fp32 out; the inverse undoes it
    y = torch.randn(1, 2, 64, 16)
    assert apply_rotary(y).dtype == torch.float32
    torch.testing.assert_close(apply_rotary(apply_rotary(y), inverse=True), y)


def test_rotary_logit_depends_on_the_offset_only():
    """Why rotary positions suit long inputs: a query-key product reads the two vectors and their offset."""
    d, length = 16, 600
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)

    def logit(query_position: int, key_position: int) -> float:
        queries = torch.zeros(1, 1, length, d, dtype=torch.float64)
        keys = torch.zeros_like(queries)
        queries[0, 0, query_position], keys[0, 0, key_position] = q, k
        return float(apply_rotary(queries)[0, 0, query_position] @ apply_rotary(keys)[0, 0, key_position])

    for offset in (1, -3, 40):
        values = [logit(p, p + offset) for p in (5, 77, 300, 520)]
        assert max(values) - min(values) < 1e-9, values
    assert abs(logit(5, 6) - logit(5, 7)) > 1e-3  # and the offset itself matters
    angles = rotary_angles(length, d, torch.device("cpu"))
    assert angles.shape == (length, d // 2) and angles[1, 0] == 1.0  # the fastest pair turns one radian per token


def _without_positions(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights with `position_embedding_type="absolute"` and a zero table: a model that has no positions."""
    config = type(model.config).from_dict({**model.config.to_dict(), "position_embedding_type": "absolute"})
    plain = type(model)(config).eval()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("position_embeddings" in name for name in missing), missing
    for module in plain.modules():
        if hasattr(module, "position_embeddings") and isinstance(module.position_embeddings, torch.nn.Embedding):
            torch.nn.init.zeros_(module.position_embeddings.weight)
    return plain


@pytest.mark.parametrize("model_type", FAMILY_NAMES)
def test_rotary_reaches_every_familys_attention_and_saves_nothing(model_type, tmp_path):
    # Peaked attention at initialisation (wider weights), so that the rotation's effect is far above round-off.
    model = _classifier(model_type, position_embedding_type="rotary", initializer_range=0.3)
    assert model.base_model.encoder.embeddings.position_embeddings is None
    assert not [name for name in model.state_dict() if "position" in name]
    ids = torch.randint(5, model.config.vocab_size, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    # The only position signal is the rotation: without it (same weights, no positions) every family's output moves.
    plain = _without_positions(model)
    other = plain.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (hidden[0] - other[0]).abs().max() > 1e-2

    logits = model(input_ids=ids, attention_mask=mask).logits
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert reloaded.config.position_embedding_type == "rotary"
    torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask).logits, logits)
    # the default positions may be passed explicitly; any others would be silently ignored, so they are refused
    default = torch.arange(40)[None].expand(2, 40)
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, position_ids=default).logits, logits)
    with pytest.raises(ValueError, match="position_ids.*rotary"):
        model(input_ids=ids, attention_mask=mask, position_ids=default.flip(-1))


def test_rotary_dense_attention_is_the_rotated_reference_for_every_implementation():
    """The rotation is applied once, before the kernel: SDPA, eager and the plain reference agree, and the first
    layer's probabilities are softmax(R(q) R(k)^T / sqrt(d)) computed by hand."""
    model = _classifier("dense_transformer", position_embedding_type="rotary")
    ids = torch.randint(5, model.config.vocab_size, (1, 24))
    out = model.base_model(input_ids=ids, output_attentions=True)
    layer = model.base_model.encoder.layers[0].attention
    hidden = model.base_model.encoder.embeddings(ids, None, None, None)
    q, k = apply_rotary(layer._split(layer.q_proj(hidden))), apply_rotary(layer._split(layer.k_proj(hidden)))
    expected = (q @ k.transpose(-1, -2) * layer.scaling).softmax(-1)
    torch.testing.assert_close(out.attentions[0], expected)
    sdpa = model.base_model(input_ids=ids).last_hidden_state
    model.set_attn_implementation("eager")
    torch.testing.assert_close(model.base_model(input_ids=ids).last_hidden_state, sdpa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.last_hidden_state, sdpa, atol=1e-5, rtol=1e-5)


def test_sbm_memberships_read_the_unrotated_queries_and_keys(monkeypatch):
    model = _classifier("sbm", position_embedding_type="rotary")
    layer = model.base_model.encoder.layers[0].attention
    seen = []
    original = type(layer).membership_features
    monkeypatch.setattr(type(layer), "membership_features", lambda self, x: seen.append(x) or original(self, x))
    ids = torch.randint(5, model.config.vocab_size, (1, 24))
    hidden = model.base_model.encoder.embeddings(ids, None, None, None)
    model.base_model(input_ids=ids)
    # The first layer's queries and keys, read in one call (stacked along the batch: they have one shape).
    queries, keys = seen[0].split(ids.shape[0])
    torch.testing.assert_close(queries, layer._split(layer.q_proj(hidden)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(keys, layer._split(layer.k_proj(hidden)), atol=1e-5, rtol=1e-5)


def test_smart_bird_sketch_rotates_the_queries_and_keys_it_hands_to_the_sampler():
    config = _config("smart_bird", position_embedding_type="rotary")
    model = FAMILIES["smart_bird"].model_class(config).eval()
    sketch = model.encoder.sketch
    assert sketch.position_embeddings is None
    x = torch.randn(2, 30, config.sketch_hidden_size)
    _, q, k = sketch.layers[0](x, None)
    torch.testing.assert_close(q, apply_rotary(sketch.layers[0].query(x)[:, None]).squeeze(1))
    torch.testing.assert_close(k, apply_rotary(sketch.layers[0].key(x)[:, None]).squeeze(1))

"""The benchmark's floor row (`null_attention`: the dense family whose attention returns its values) and the
ModernBERT peer (`hf:modernbert`), at tiny sizes on the CPU."""

from __future__ import annotations

import torch

from attnzoo.benchmarking import BenchmarkSettings, ModelSize, benchmark_models, timing_sweep
from attnzoo.benchmarking.floor import NullAttention, NullAttentionModel
from attnzoo.dense_transformer import DenseTransformerConfig

TINY = ModelSize(vocab_size=512, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96)


def test_null_attention_outputs_the_projected_values():
    config = DenseTransformerConfig(**TINY.config_kwargs(16))
    attention = NullAttention(config).eval()
    x = torch.randn(2, 16, TINY.hidden_size)
    out = attention(x, output_attentions=True)
    # out = v per head; merged and projected, that is o_proj(v_proj(x)) exactly.
    torch.testing.assert_close(out.hidden_states, attention.o_proj(attention.v_proj(x)), rtol=0, atol=0)
    assert out.attn_weights.shape == (2, 4, 16, 16)
    torch.testing.assert_close(out.attn_weights[1, 3], torch.eye(16))


def test_the_floor_row_is_the_dense_model_with_a_null_attention():
    dense, floor = benchmark_models(["dense_transformer"], [])[:2]
    assert (floor.name, floor.kind, floor.family) == ("null_attention", "floor", "dense_transformer")
    dense_model, floor_model = dense.build(TINY, 32), floor.build(TINY, 32)
    assert isinstance(floor_model, NullAttentionModel) and not floor_model.training
    # The same parameters (names and shapes) and config: only what the attention computes differs.
    assert {k: v.shape for k, v in floor_model.state_dict().items()} == {
        k: v.shape for k, v in dense_model.state_dict().items()
    }
    assert floor_model.config.to_dict() == dense_model.config.to_dict()
    floor_model.load_state_dict(dense_model.state_dict())
    ids = torch.randint(5, TINY.vocab_size, (1, 32))
    assert not torch.allclose(floor_model(ids).last_hidden_state, dense_model(ids).last_hidden_state)


def test_modernbert_peer_has_the_common_size_and_alternating_attention():
    (row,) = benchmark_models(["dense_transformer"], ["modernbert"], keep=["hf:modernbert"])
    model = row.build(TINY, 64)
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (48, 3, 4)
    # Global attention in the first of every three layers, a 128-token window in the others.
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert config.local_attention == 128
    # Its gated FFN has the parameters of the common FFN (2 x 48 x 96 weights).
    mlp = model.layers[0].mlp
    assert sum(p.numel() for p in mlp.parameters()) == 2 * TINY.hidden_size * TINY.intermediate_size


def test_modernbert_peer_runs_in_the_benchmark_at_both_levels():
    settings = BenchmarkSettings(
        families=["dense_transformer"], hf_baselines=["modernbert"], rows=["dense_transformer", "hf:modernbert"],
        lengths=[300], rounds=1, warmup=0, levels=["model", "layer"], size=TINY, check_equivalence=False,
    )  # fmt: skip
    entries = {(e["model"], e["level"]): e for e in timing_sweep(settings)["entries"]}
    for level in ("model", "layer"):
        entry = entries["hf:modernbert", level]
        assert entry["status"] == "ok", entry
        assert entry["saved_bytes"] > 0 and all(t > 0 for t in entry["times_s"]["fwd_bwd"])

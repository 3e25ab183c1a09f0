"""Global tokens (`num_global_tokens`): the first positions attend to and are attended by every real position, in the
same softmax as each method's own keys, for every sparse family."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig

from attnzoo.core.global_tokens import add_global_columns, append_global_slots, global_edges
from attnzoo.evaluation.diagnostics import reached_positions
from attnzoo.kernels import dense_masked_attention
from attnzoo.registry import FAMILIES
from attnzoo.testing import probe_loss
from source_checkout import load_config

SPARSE = sorted(name for name, family in FAMILIES.items() if family.attention_class.supports_global_tokens)
N = 48


def _model(model_type: str, **overrides):
    torch.manual_seed(0)
    fields = {"num_hidden_layers": 1, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **overrides}
    return FAMILIES[model_type].model_class(load_config(FAMILIES[model_type], "tiny", **fields)).eval()


def _inputs(vocab_size: int, left_pad: bool = False):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab_size, (2, N), generator=g)
    mask = torch.ones_like(ids)
    if left_pad:
        mask[1, :7] = 0
    else:
        mask[1, 30:] = 0
    return ids, mask


def _influence(model, ids, mask) -> torch.Tensor:
    """`(B, N, N)`: entry `[b, i, j]` is True when input position j changes output position i (one layer)."""
    model = model.double()  # fp64, so that FSAT's FFT round-off stays far below every real path
    emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    hidden = model(inputs_embeds=emb, attention_mask=mask).last_hidden_state
    rows = []
    for i in range(N):
        (grad,) = torch.autograd.grad(hidden[:, i].pow(2).sum(), emb, retain_graph=True)
        rows.append(reached_positions(grad))
    return torch.stack(rows, dim=1)


def test_every_sparse_family_supports_global_tokens():
    assert set(SPARSE) == set(FAMILIES) - {"dense_transformer"}


@pytest.mark.parametrize("model_type", SPARSE)
@pytest.mark.parametrize("left_pad", [False, True])
def test_global_token_reads_and_is_read_by_every_real_position_in_one_layer(model_type, left_pad):
    model = _model(model_type, num_global_tokens=1)
    ids, mask = _inputs(model.config.vocab_size, left_pad)
    reach = _influence(model, ids, mask)
    real = mask.bool()
    for b in range(2):
        first = int(real[b].nonzero()[0])
        if first == 0:
            # Position 0 is global: its output depends on every real input, every real output depends on it.
            assert torch.equal(reach[b, 0], real[b])
            assert reach[b, real[b], 0].all()
        else:
            # A padded position 0 is not global (and padding never reaches a real output).
            assert not reach[b, real[b], 0].any()
    baseline = _influence(_model(model_type, num_global_tokens=0), ids, mask)
    assert not torch.equal(baseline[0, 0], real[0]), "the family alone already reaches everything: a weak test"


@pytest.mark.parametrize("model_type", SPARSE)
def test_global_rows_are_dense_attention_over_the_real_keys(model_type):
    model = _model(model_type, num_global_tokens=2)
    ids, mask = _inputs(model.config.vocab_size)
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    weights = out.attentions[0]  # (B, H, N, N)
    real = mask.bool()[:, None, None, :]
    assert torch.all(weights[:, :, :2][~real.expand(-1, weights.shape[1], 2, -1)] == 0)
    assert (weights[:, :, :2] > 0).eq(real.expand(-1, weights.shape[1], 2, -1)).all()
    torch.testing.assert_close(weights[:, :, :2].sum(-1), torch.ones(2, weights.shape[1], 2))
    # Every real query gives the real global keys a positive weight.
    cols = weights[:, :, :, :2].permute(0, 2, 1, 3)[mask.bool()]  # (real queries, H, 2)
    assert (cols > 0).all()


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [(name, {}) for name in SPARSE]
    + [
        ("sbm", {"sampling_backend": "fastrg"}),
        ("sparse_transformer", {"sparse_pattern": "fixed", "sparse_head_assignment": "merged"}),
        ("a2former", {"attention_weights": "linear"}),
    ],
)
def test_fast_path_equals_reference_with_global_tokens(model_type, overrides):
    ids, mask = _inputs(load_config(FAMILIES[model_type], "tiny").vocab_size)
    results = []
    for backend in ("fast", "reference"):
        model = _model(model_type, num_global_tokens=3, attention_backend=backend, **overrides).train()
        torch.manual_seed(5)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        probe_loss(hidden, mask).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((hidden.detach() * mask[..., None], grads))
    (h_fast, g_fast), (h_ref, g_ref) = results
    torch.testing.assert_close(h_fast, h_ref, rtol=1e-4, atol=1e-5)
    assert g_fast.keys() == g_ref.keys()
    for name in g_fast:
        torch.testing.assert_close(g_fast[name], g_ref[name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("smart_bird", {"num_samples": 64}),  # K >= N: every key sampled once
        ("sparse_transformer", {"sparse_stride": 64, "sparse_head_assignment": "merged"}),  # the window covers all
        ("sbm", {"exploration_delta": 1.0}),  # every edge sampled
    ],
)
def test_a_global_key_the_method_already_selects_counts_once(model_type, overrides):
    # Where the method alone is dense attention, adding global tokens must leave it dense attention exactly.
    ids, mask = _inputs(load_config(FAMILIES[model_type], "tiny").vocab_size)
    plain = _model(model_type, num_global_tokens=0, **overrides)
    with_global = _model(model_type, num_global_tokens=2, **overrides)
    with torch.no_grad():
        a = plain(input_ids=ids, attention_mask=mask).last_hidden_state
        b = with_global(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_type", ["sbm", "sparse_transformer", "a2former"])
def test_decoders_have_no_global_tokens(model_type):
    config = load_config(FAMILIES[model_type], "tiny", num_global_tokens=2)
    model = FAMILIES[model_type].conditional_generation_class(config)
    for layer in model.model.decoder.layers:
        assert layer.self_attn.num_global_tokens == 0 and layer.cross_attn.num_global_tokens == 0
    assert all(layer.attention.num_global_tokens == 2 for layer in model.model.encoder.layers)


def test_structure_helpers():
    idx = torch.tensor([[[[0, 3, 5]]]])  # (1, 1, 1, 3)
    key_valid = torch.tensor([[True, False, True, True, True, True]])
    index, valid = append_global_slots(idx, None, key_valid, 2, as_set=True)
    assert index.tolist() == [[[[0, 3, 5, 0, 1]]]]
    assert valid.tolist() == [[[[False, True, True, True, False]]]]  # 0 kept once; key 1 is padding
    index, valid = append_global_slots(idx, None, None, 2, as_set=False)
    assert valid.all() and index.shape[-1] == 5
    mask = torch.zeros(1, 1, 2, 4, dtype=torch.bool)
    assert add_global_columns(mask, key_valid[:, :4], 2).tolist() == [[[[True, False, False, False]] * 2]]
    rows, cols = global_edges(1, 2, 3, 3, torch.tensor([[True, True, False]]), None, 1, torch.device("cpu"))
    assert rows.tolist() == [0, 1, 3, 4] and cols.tolist() == [0, 0, 3, 3]


def test_global_rows_helper_matches_dense_attention():
    from attnzoo.core.global_tokens import global_query_rows, splice_rows

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    key_valid = torch.tensor([[True] * 6, [False, True, True, True, False, False]])
    rows, _ = global_query_rows(q, k, v, key_valid, 2, scale=0.5, dropout_p=0.0, training=False, return_weights=False)
    expected, _ = dense_masked_attention(q[:, :, :2], k, v, key_valid[:, None, None, :], scale=0.5)
    torch.testing.assert_close(rows, expected)
    full = torch.zeros(2, 3, 6, 4)
    spliced = splice_rows(full, rows, key_valid)
    torch.testing.assert_close(spliced[0, :, :2], rows[0])
    assert torch.all(spliced[1, :, 0] == 0)  # a padded global position keeps the method's row
    torch.testing.assert_close(spliced[1, :, 1], rows[1, :, 1])


@pytest.mark.parametrize("model_type", SPARSE)
def test_checkpoints_saved_before_global_tokens_load_without_them(model_type, tmp_path):
    # attnzoo 0.1 saved every config field but had no `num_global_tokens`: its models were trained without them.
    family = FAMILIES[model_type]
    family.config_class().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    assert saved["num_global_tokens"] == 1 and "transformers_version" in saved
    assert family.config_class.from_pretrained(tmp_path).num_global_tokens == 1
    del saved["num_global_tokens"]
    path.write_text(json.dumps(saved))
    assert family.config_class.from_pretrained(tmp_path).num_global_tokens == 0
    assert AutoConfig.from_pretrained(tmp_path).num_global_tokens == 0
    assert family.config_class.from_pretrained(tmp_path, num_global_tokens=2).num_global_tokens == 2
    # a hand-written dict (no transformers_version) gets the family default
    assert family.config_class.from_dict({"hidden_size": 64, "num_attention_heads": 4}).num_global_tokens == 1

"""The long-input diagnostics: what the first token can see, padding share, gradient norms, and the report."""

from __future__ import annotations

import json

import pytest
import torch

from attnzoo.evaluation import (
    ModelSize,
    Row,
    RunSpec,
    TaskPlan,
    diagnose,
    diagnostics_markdown,
    run_diagnostics,
    text_task,
)
from attnzoo.evaluation.diagnostics import (
    cls_receptive_field,
    global_read_weight,
    gradient_norms,
    padding_attention_share,
)
from attnzoo.evaluation.runner import build_classifier
from attnzoo.registry import FAMILIES

TINY = ModelSize(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
LENGTHS = (64, 41)  # a padded batch


@pytest.fixture(scope="module")
def task(reviews_file):
    return text_task(reviews_file, 64, validation_size=10)


def padded_batch(vocab_size: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    input_ids = torch.randint(5, vocab_size, (len(LENGTHS), max(LENGTHS)))
    attention_mask = (torch.arange(max(LENGTHS))[None] < torch.tensor(LENGTHS)[:, None]).long()
    return {"input_ids": input_ids.masked_fill(attention_mask == 0, 0), "attention_mask": attention_mask}


def classifier(task, model_type: str, size: ModelSize = TINY, **overrides):
    torch.manual_seed(0)
    return build_classifier(task, RunSpec(model_type, 64, overrides), size)


def test_first_token_of_one_layer_reaches_exactly_the_keys_it_attends_to(task):
    # One layer: the FFN and the norms are per position, so the first token's state depends on the keys with
    # non-zero attention from query 0 (any head) and on itself; autograd must find exactly those.
    model = classifier(task, "sparse_transformer", num_global_tokens=0, sparse_stride=8).eval()
    batch = padded_batch(task.vocab_size)
    attentions = model.base_model(**batch, output_attentions=True).attentions[0]  # (B, H, N, N)
    expected = (attentions[:, :, 0, :] > 0).any(1)  # (B, N)
    expected[:, 0] = True
    reach = cls_receptive_field(model, **batch)
    assert reach == (expected & batch["attention_mask"].bool()).sum(-1).tolist()
    assert reach[0] < LENGTHS[0]  # the strided pattern does not reach everything in one layer
    assert cls_receptive_field(classifier(task, "dense_transformer"), **batch) == list(LENGTHS)


def test_fsat_reach_ignores_the_round_off_of_its_fft(task):
    # FSAT's first token (no global token, one layer) attends to the keys predicted for it; each such key is pooled
    # over the pairs around its own position only. The FFT's round-off leaks tiny gradients to every other position:
    # exact zeros in exact arithmetic, not a path. The pooled cross of key j pairs positions up to 2j + 1.
    model = classifier(task, "fsat", num_global_tokens=0, index_prior="key_position").eval()
    batch = padded_batch(task.vocab_size)
    base = model.base_model
    embeddings = base.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    hidden = base(inputs_embeds=embeddings, attention_mask=batch["attention_mask"]).last_hidden_state
    (grad,) = torch.autograd.grad(hidden[:, 0].pow(2).sum(), embeddings)
    real = batch["attention_mask"].bool()
    assert bool(((grad.abs().sum(-1) > 0) | ~real).all())  # every real position has some gradient: round-off
    attention = base(**batch, output_attentions=True).attentions[0]  # (B, H, N, N)
    keys = (attention[:, :, 0, :] > 0).any(1)  # (B, N): keys with weight from query 0
    pooled = torch.zeros_like(keys)
    for b, j in keys.nonzero().tolist():
        pooled[b, : 2 * j + 2] = True  # the pairs of C_j: i + i' in {2j, 2j + 1}
    pooled[:, 0] = True
    reach = cls_receptive_field(model, **batch)
    assert reach == (pooled & real).sum(-1).tolist()
    assert max(reach) < min(LENGTHS)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_no_family_puts_attention_on_padding(task, model_type):
    model = classifier(task, model_type)
    assert padding_attention_share(model, **padded_batch(task.vocab_size)) == [0.0] * TINY.num_hidden_layers


def test_global_read_weight_is_the_weight_of_the_global_keys_in_each_real_query_row(task):
    batch = padded_batch(task.vocab_size)
    # FSAT with the global keys in a softmax of their own: every real non-global query reads them at weight 1.
    own = classifier(task, "fsat", num_global_tokens=2, global_key_softmax="own")
    assert global_read_weight(own, **batch) == pytest.approx([1.0] * TINY.num_hidden_layers, abs=1e-5)
    # In one softmax with the predicted edges the read falls below 1 (queries with predicted edges share it).
    shared = classifier(task, "fsat", num_global_tokens=2, global_key_softmax="shared")
    assert all(0.0 < read < 1.0 for read in global_read_weight(shared, **batch))
    # Dense attention (no global token) is measured on the first token: the mean of its rows' weight on key 0.
    dense = classifier(task, "dense_transformer").eval()
    with torch.no_grad():
        weights = dense.base_model(**batch, output_attentions=True).attentions[0]  # (B, H, N, N)
    queries = batch["attention_mask"].bool().clone()
    queries[:, 0] = False
    expected = float(weights[..., 0].transpose(1, 2)[queries].mean())
    assert global_read_weight(dense, **batch) == pytest.approx([expected], rel=1e-5)


def test_gradient_norms_group_the_parameters_by_layer(task):
    model = classifier(task, "dense_transformer", size=ModelSize(16, 2, 2, 32)).train()
    model(**padded_batch(task.vocab_size), labels=torch.tensor([0, 1])).loss.backward()
    norms = gradient_norms(model)
    assert set(norms) == {"embeddings", "layer 0", "layer 1", "head"}
    layer_1 = [p.grad for n, p in model.named_parameters() if ".layers.1." in n]
    assert norms["layer 1"] == pytest.approx(float(torch.cat([g.flatten() for g in layer_1]).norm()), rel=1e-5)


def test_gradient_norms_keep_smart_birds_sketch_apart_from_the_layers_and_the_head(task):
    model = classifier(task, "smart_bird", size=ModelSize(16, 2, 2, 32)).train()
    model(**padded_batch(task.vocab_size), labels=torch.tensor([0, 1])).loss.backward()
    norms = gradient_norms(model)
    assert set(norms) == {"embeddings", "layer 0", "layer 1", "sketch", "head"}

    def norm(names: list[str]) -> float:
        grads = [p.grad.flatten() for n, p in model.named_parameters() if n in names and p.grad is not None]
        return float(torch.cat(grads).norm())

    names = [n for n, _ in model.named_parameters()]
    assert norms["head"] == pytest.approx(norm([n for n in names if n.startswith("classifier.")]), rel=1e-5)
    assert norms["layer 0"] == pytest.approx(norm([n for n in names if ".encoder.layers.0." in n]), rel=1e-5)
    assert norms["sketch"] == pytest.approx(norm([n for n in names if ".encoder.sketch." in n]), rel=1e-5)


def test_diagnose_reports_every_spec_at_initialisation(task):
    specs = [RunSpec("a2former", 64), RunSpec("a2former", 64, {"num_global_tokens": 0, "classifier_pooling": "mean"})]
    records = diagnose(task, specs, TINY, examples=3)
    assert [r["label"] for r in records] == [s.label for s in specs]
    # with a global first token the first token reads every real token; without one only its sample points
    assert records[0]["receptive_field"] == records[0]["real_tokens"]
    assert all(r < n for r, n in zip(records[1]["receptive_field"], records[1]["real_tokens"], strict=True))
    assert records[1]["config"]["num_global_tokens"] == 0 and records[1]["config"]["classifier_pooling"] == "mean"
    assert records[0]["config"]["classifier_pooling"] == "cls"  # LRA Text's protocol, over the family's mean
    assert all(len(r["global_read"]) == TINY.num_hidden_layers for r in records)
    assert all(0.0 < read <= 1.0 for r in records for read in r["global_read"])
    markdown = diagnostics_markdown(records)
    assert markdown.count("\n") == 2 + len(specs) and "| cls |" in markdown
    with pytest.raises(ValueError, match="encoded at length 64"):
        diagnose(task, [RunSpec("a2former", 128)], TINY)


def test_run_diagnostics_writes_every_planned_run_with_the_dense_baseline(tmp_path, reviews_file):
    plans = [TaskPlan("text", (64,), dense_lengths=(32,))]
    records = run_diagnostics(
        tmp_path, plans, [Row("fsat")], size=TINY, reviews_file=reviews_file, validation_size=10, examples=2
    )
    assert [(r["label"], r["length"]) for r in records] == [("fsat", 64), ("dense_transformer", 32)]
    assert json.loads((tmp_path / "diagnostics.json").read_text()) == records
    assert (tmp_path / "diagnostics.md").read_text() == diagnostics_markdown(records)

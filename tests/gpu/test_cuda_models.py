"""Every family on CUDA: the four heads train in bf16, the fast (Triton) path equals the reference, generation with a
cache equals generation without. Run by `pytest -m gpu` (`bash scripts/run.sh gpu`); skipped without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch

from attnzoo.kernels import resolve_backend
from attnzoo.registry import FAMILIES
from attnzoo.testing import assert_same_gradients, family_by_name, probe_loss
from source_checkout import load_config

pytestmark = pytest.mark.gpu

HEADS = ("base", "masked_lm", "sequence_classification", "conditional_generation")
#: Configurations whose attention runs a Triton kernel on CUDA: each family's tiny config, SBM's fastRG backend,
#: the merged strided Sparse Transformer (edge kernel) and A²-Former's linear point weights.
SPARSE = [
    ("a2former", {}),
    ("a2former", {"attention_weights": "linear"}),
    ("fsat", {}),
    ("sbm", {"sampling_backend": "fastrg"}),
    ("smart_bird", {}),
    ("sparse_transformer", {"sparse_head_assignment": "merged"}),
]
SEQ_LEN, PAD_FROM = 64, 45
NAMES = sorted(family.name for family in FAMILIES.values())
IDS = [f"{family}-{'-'.join(map(str, overrides.values())) or 'tiny'}" for family, overrides in SPARSE]


def _inputs(config, head: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, config.vocab_size, (2, SEQ_LEN), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, PAD_FROM:] = 0
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if head == "masked_lm":
        inputs["labels"] = input_ids.masked_fill(attention_mask == 0, -100)
    elif head == "sequence_classification":
        inputs["labels"] = torch.tensor([0, 1])
    elif head == "conditional_generation":
        inputs["labels"] = torch.randint(5, config.vocab_size, (2, 12), generator=g)
    return {name: tensor.cuda() for name, tensor in inputs.items()}


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("family", NAMES)
def test_every_head_trains_a_step_in_bf16_on_cuda(family, head):
    torch.manual_seed(0)
    config = load_config(family, "tiny", num_labels=2)
    model = family_by_name(family).heads[head](config).cuda().train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(**_inputs(config, head))
        loss = out.last_hidden_state.float().pow(2).mean() if head == "base" else out.loss
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def _fast_and_reference(family: str, overrides: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The family's encoder on CUDA with the default backend and a copy on the same weights with the reference."""
    torch.manual_seed(0)
    config = load_config(family, "tiny", attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, **overrides)
    fast = family_by_name(family).model_class(config).cuda().eval()
    reference_config = copy.deepcopy(config)
    reference_config.attention_backend = "reference"
    reference = family_by_name(family).model_class(reference_config).cuda().eval()
    reference.load_state_dict(fast.state_dict())
    return fast, reference


@pytest.mark.parametrize("family,overrides", SPARSE, ids=IDS)
def test_fast_path_runs_triton_and_equals_the_reference_on_cuda(family, overrides):
    assert resolve_backend("fast", torch.device("cuda"), torch.float32) == "triton"
    fast, reference = _fast_and_reference(family, overrides)
    inputs = _inputs(fast.config, "base")
    results = []
    for model in (fast, reference):
        hidden = model(**inputs).last_hidden_state
        probe_loss(hidden, inputs["attention_mask"]).backward()
        results.append((hidden.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (out_fast, grads_fast), (out_ref, grads_ref) = results
    torch.testing.assert_close(out_fast, out_ref, atol=1e-4, rtol=1e-4)
    assert_same_gradients(grads_fast, grads_ref, rtol=1e-3, atol=1e-4)


def test_sbm_training_attention_equals_the_reference_on_cuda():
    """SBM's dense-Bernoulli training path (the gated attention of the all-pairs estimator) on the same graphs."""
    fast, reference = _fast_and_reference("sbm", {"sampling_backend": "bernoulli", "sparsity_weight": 0.1})
    inputs = _inputs(fast.config, "base")
    results = []
    for model in (fast.train(), reference.train()):
        torch.manual_seed(3)  # the same sampled graphs
        out = model(**inputs)
        (probe_loss(out.last_hidden_state, inputs["attention_mask"]) + out.aux_loss).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.last_hidden_state.detach(), grads))
    (out_fast, grads_fast), (out_ref, grads_ref) = results
    torch.testing.assert_close(out_fast, out_ref, atol=1e-4, rtol=1e-4)
    assert_same_gradients(grads_fast, grads_ref, rtol=1e-3, atol=1e-4)
    assert grads_fast["encoder.layers.0.attention.clusters"].abs().sum() > 0


@pytest.mark.parametrize("family,overrides", SPARSE, ids=IDS)
def test_bf16_triton_path_stays_close_to_the_fp32_reference(family, overrides):
    model, reference = _fast_and_reference(family, overrides)
    inputs = _inputs(model.config, "base")
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        with torch.autocast("cuda", dtype=torch.bfloat16):
            actual = model(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    error = (actual.float() - expected)[real].norm() / expected[real].norm()
    assert error < 2e-2, f"relative error {error:.3g}"


@pytest.mark.parametrize("family", NAMES)
def test_generate_with_cache_equals_without_cache_on_cuda(family):
    torch.manual_seed(0)
    config = load_config(family, "tiny", initializer_range=0.5)
    model = family_by_name(family).conditional_generation_class(config).cuda().eval()
    # An untrained model repeats one token; forbidding repeats makes every step depend on the full logit ranking.
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": None, "no_repeat_ngram_size": 1}
    inputs = _inputs(config, "base")
    with_cache = model.generate(**inputs, use_cache=True, **kwargs)
    without_cache = model.generate(**inputs, use_cache=False, **kwargs)
    assert with_cache.shape == (2, 11)
    assert torch.equal(with_cache, without_cache)

"""`attention_backend="triton"` == `"reference"` for every sparse family: outputs and the gradient of every parameter
(projections, A²-Former's offsets, Smart Bird's sketch, SBM's memberships, FSAT's predictors and feature maps), in
training mode with sampling, padding and attention dropout. On CPU the Triton kernels run under the interpreter
(`tests/conftest.py`), at tiny sizes."""

from __future__ import annotations

import pytest
import torch

from attnzoo.kernels import dispatch
from attnzoo.testing import assert_same_gradients, family_by_name, probe_loss
from source_checkout import load_config

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests (CUDA: tests/gpu)")

#: Every configuration whose attention reaches a Triton kernel: gathered slots (Smart Bird; A²-Former's two weighted
#: entries, with dot-product and with linear point logits) and CSR edges (FSAT, SBM's fastRG, merged strided heads).
CASES = [
    pytest.param("a2former", {}, id="a2former"),
    pytest.param("a2former", {"attention_weights": "linear"}, id="a2former-linear"),
    pytest.param("fsat", {}, id="fsat"),
    pytest.param("sbm", {"sampling_backend": "fastrg", "sparsity_weight": 0.1}, id="sbm-fastrg"),
    # Both backends on the counter sampler's stream (the kernel's; "auto" would give the reference CPU thinning).
    pytest.param("smart_bird", {"num_samples": 6, "sampling_method": "counter"}, id="smart_bird"),
    # Its reference is the dense pattern mask, whose dropout draws its own mask: compared without attention dropout.
    pytest.param(
        "sparse_transformer",
        {"sparse_head_assignment": "merged", "sparse_stride": 4, "attention_probs_dropout_prob": 0.0},
        id="strided-merged",
    ),
]
TINY = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64}
B, N, PAD_FROM = 2, 20, 13


def _inputs(vocab_size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, vocab_size, (B, N), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, PAD_FROM:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _run(family: str, overrides: dict, backend: str, *, train: bool, autocast: bool = False):
    """Output and parameter gradients of one forward+backward; the same seeds make every backend sample alike."""
    torch.manual_seed(0)
    config = load_config(family, "tiny", attention_backend=backend, **TINY, **overrides)
    model = family_by_name(family).model_class(config).train(train)
    inputs = _inputs(config.vocab_size)
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**inputs)
        hidden = out.last_hidden_state.float()
        loss = probe_loss(hidden, inputs["attention_mask"])
        if getattr(out, "aux_loss", None) is not None:
            loss = loss + out.aux_loss.float()
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return hidden.detach(), grads


@pytest.fixture
def implementations(monkeypatch) -> list[str]:
    """The implementations the kernel dispatch picked, in call order."""
    picked: list[str] = []
    resolve = dispatch.resolve_backend

    def spy(*args, **kwargs):
        picked.append(resolve(*args, **kwargs))
        return picked[-1]

    monkeypatch.setattr(dispatch, "resolve_backend", spy)
    return picked


@pytest.mark.parametrize("family,overrides", CASES)
def test_triton_backend_equals_reference_in_training_in_fp32(family, overrides, implementations):
    overrides = {"attention_probs_dropout_prob": 0.2, **overrides}
    out, grads = _run(family, overrides, "triton", train=True)
    assert "triton" in implementations  # the family's sparse attention reached a Triton kernel
    expected, expected_grads = _run(family, overrides, "reference", train=True)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    assert_same_gradients(grads, expected_grads, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("family,overrides", CASES)
def test_triton_backend_under_bf16_autocast_stays_close_to_the_fp32_reference(family, overrides):
    out, grads = _run(family, overrides, "triton", train=False, autocast=True)
    expected, expected_grads = _run(family, overrides, "reference", train=False)
    real = _inputs(1000)["attention_mask"].bool()
    assert (out[real] - expected[real]).norm() < 3e-2 * expected[real].norm()
    # bf16 round-off of the large gradients reaches the ones that vanish in exact arithmetic (the key bias's)
    largest = max(grad.norm() for grad in expected_grads.values())
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name
        assert (grad - expected_grads[name]).norm() <= 0.1 * expected_grads[name].norm() + 1e-3 * largest, name


@pytest.mark.parametrize(
    ("family", "module", "primitive", "overrides"),
    [
        ("sbm", "attnzoo.sbm.attention_sbm", "edge_attention", {"sampling_backend": "fastrg", "sparsity_weight": 0.1}),
        # both backends on the counter sampler's stream, as in CASES
        (
            "smart_bird",
            "attnzoo.smart_bird.attention_smart_bird",
            "gathered_attention",
            {"num_samples": 6, "sampling_method": "counter"},
        ),
    ],
    ids=["sbm-fastrg", "smart_bird"],
)
@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no-dropout", "dropout"])
def test_global_rows_in_the_kernels_equal_the_reference(family, module, primitive, overrides, dropout, monkeypatch):
    """SBM's edge kernels and Smart Bird's gathered kernels compute the global query's rows themselves
    (`global_rows`: no SDPA, splice or gradient sums around them), in training with attention dropout too (the
    rows' hashed mask regenerated in the kernels): the same outputs and gradients as the reference's
    `with_global_rows`."""
    import importlib

    owner = importlib.import_module(module)
    requested = []
    original = getattr(owner, primitive)

    def spy(*args, **kwargs):
        requested.append(kwargs["global_rows"])
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, primitive, spy)
    overrides = {**overrides, "attention_probs_dropout_prob": dropout}
    out, grads = _run(family, overrides, "triton", train=True)
    assert requested and all(rows == 1 for rows in requested)  # the tiny config's one global token
    expected, expected_grads = _run(family, overrides, "reference", train=True)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    assert_same_gradients(grads, expected_grads, rtol=2e-4, atol=2e-5)

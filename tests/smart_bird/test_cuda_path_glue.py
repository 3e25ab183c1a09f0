"""What Smart Bird's CUDA path does instead of eager glue (issue 49) equals the plain computation it replaces:

- the Triton sampler writes the global slots itself, exactly as `append_global_slots(as_set=True)` appends them;
- it reads bf16 sketch rows in their strided layout and takes a host-integer seed, with the keys of fp32 copies and
  of a seed tensor;
- the sketch layer pads q, k and v to SDPA's head size in one projection, with the per-layer projections' outputs
  and gradients;
- the global query rows (SDPA) spliced in while the heads merge (recomputed in backward): the whole model on the
  Triton path equals the reference, outputs and every parameter gradient, in training and in eval.

On CPU the Triton kernels run under Triton's interpreter (`tests/conftest.py`), so the shapes are small.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnzoo.core.compat import enable_activation_checkpointing
from attnzoo.core.global_tokens import append_global_slots
from attnzoo.smart_bird import SmartBirdConfig, SmartBirdModel
from attnzoo.smart_bird.sampling import sample_keys
from attnzoo.smart_bird.sketch import SketchLayer, aligned_projection
from attnzoo.testing import assert_same_gradients

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests (CUDA: tests/gpu)")
B, N, K, H = 2, 24, 3, 2


def _sketch_rows(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sketch q and k as strided views of one fused (B, N, 3, 8) projection (d = 4); example 1 padded on both sides
    (its position 0, a global one, is padding)."""
    g = torch.Generator().manual_seed(0)
    fused = torch.randn(B, N, 3, 8, generator=g).to(dtype)
    key_valid = torch.ones(B, N, dtype=torch.bool)
    key_valid[1, :3] = False
    key_valid[1, 18:] = False
    return fused[:, :, 0, :4], fused[:, :, 1, :4], key_valid


def _same_key_sets(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Same validity per slot, and the same set of valid keys per row (tied scores may be listed in either order)."""
    (idx, valid), (ref_idx, ref_valid) = actual, expected
    assert torch.equal(valid, ref_valid)
    keys = torch.where(valid, idx, -1).sort(-1).values
    assert torch.equal(keys, torch.where(ref_valid, ref_idx, -1).sort(-1).values)


def test_the_kernel_writes_the_global_slots_as_append_global_slots_does():
    q_s, k_s, key_valid = _sketch_rows()
    num_global = 2
    kw = {"num_heads": H, "num_samples": K, "function": "squared_inverse_log", "method": "counter", "seed": 7}
    plain = sample_keys(q_s, k_s, key_valid, backend="triton", **kw)
    expected = append_global_slots(*plain, key_valid, num_global, as_set=True)
    with_globals = sample_keys(q_s, k_s, key_valid, backend="triton", num_global=num_global, **kw)
    assert with_globals[0].shape == (B, H, N, K + num_global)
    assert torch.equal(with_globals[0], expected[0]) and torch.equal(with_globals[1], expected[1])
    # The torch reference appends them after its own draw: the same keys.
    _same_key_sets(with_globals, sample_keys(q_s, k_s, key_valid, backend="reference", num_global=num_global, **kw))
    assert (with_globals[0][..., :K] < num_global).any()  # some sampled slot held a global key (turned off)


# About 12 s of the interpreter: long for the default suite's 8-minute budget. The default suite runs the strided bf16
# sketch rows through the model (`tests/core/test_triton_backend.py`, bf16 autocast against the fp32 reference).
@pytest.mark.slow
def test_the_kernel_reads_strided_bf16_rows_and_an_integer_seed_as_fp32_copies_and_a_seed_tensor():
    q_s, k_s, key_valid = _sketch_rows(torch.bfloat16)
    assert q_s.stride(1) == 24  # rows of the fused projection, not contiguous
    kw = {"num_heads": H, "num_samples": K, "function": "squared_inverse_log", "method": "counter"}
    strided = sample_keys(q_s, k_s, key_valid, backend="triton", seed=2**40 + 3, **kw)
    copies = [t.float().contiguous() for t in (q_s, k_s)]
    seed = torch.tensor([2**40 + 3])
    expected = sample_keys(*copies, key_valid, backend="triton", seed=seed, **kw)
    assert torch.equal(strided[0], expected[0]) and torch.equal(strided[1], expected[1])
    # A batch broadcast from one example (stride 0) reads that example for each: the same counters, the same keys.
    one = [t[:1].expand(B, N, 4) for t in (q_s, k_s)]
    broadcast, _ = sample_keys(*one, None, backend="triton", seed=5, per_example=False, **kw)
    assert torch.equal(broadcast[0], broadcast[1])


@pytest.mark.parametrize("d", [4, 6, 8])
def test_aligned_projection_gives_each_layers_outputs_and_gradients(d):
    torch.manual_seed(0)
    layers = tuple(torch.nn.Linear(d, d) for _ in range(3))
    x = torch.randn(2, 5, d, requires_grad=True)
    pad = -d % 8
    fused = aligned_projection(x, layers, pad)  # (2, 5, 3, d + pad)
    plain = torch.stack([F.pad(layer(x), (0, pad)) for layer in layers], 2)
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)
    assert fused[..., d:].eq(0).all()
    grad = torch.randn(fused.shape)
    params = [x, *(p for layer in layers for p in layer.parameters())]
    for a, b in zip(torch.autograd.grad(fused, params, grad), torch.autograd.grad(plain, params, grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("padded", [False, True])
def test_the_sketch_layer_equals_its_per_projection_computation(padded):
    torch.manual_seed(0)
    config = SmartBirdConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64, hidden_act="gelu")
    layer = SketchLayer(config)
    x = torch.randn(2, 12, config.sketch_hidden_size, requires_grad=True)
    key_valid = None
    if padded:
        key_valid = torch.ones(2, 12, dtype=torch.bool)
        key_valid[1, 7:] = False

    def plain(x):
        q, k, v = layer.query(x), layer.key(x), layer.value(x)
        mask = None if key_valid is None else key_valid[:, None, :]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, N, d): the math kernel on CPU
        h = layer.attention_norm(x + layer.output(attn))
        return layer.ffn_norm(h + layer.ffn_output(layer.act(layer.intermediate(h)))), q, k

    outs, expected = layer(x, key_valid), plain(x)
    for a, b in zip(outs, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    names, params = zip(*[("x", x), *layer.named_parameters()], strict=True)
    grads = dict(zip(names, torch.autograd.grad(outs[0].pow(2).sum(), params), strict=True))
    expected_grads = dict(zip(names, torch.autograd.grad(expected[0].pow(2).sum(), params), strict=True))
    # The key bias's gradient vanishes in exact arithmetic (it cancels in the softmax): both are round-off there.
    assert_same_gradients(grads, expected_grads, rtol=1e-5, atol=1e-5, atol_of_largest=1e-6)


def _model_run(
    backend: str, train: bool, checkpointing: dict | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = SmartBirdConfig(
        vocab_size=100, hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1,
        num_samples=5, num_global_tokens=2, sampling_method="counter", attention_backend=backend,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = SmartBirdModel(config).train(train)
    if checkpointing is not None:
        enable_activation_checkpointing(model, checkpointing)
    ids = torch.randint(5, 100, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding: position 0 is no global query there
    mask[2, 13:] = 0
    torch.manual_seed(2)
    with torch.set_grad_enabled(train):
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None]
    if train:
        hidden.pow(2).mean().backward()
    return hidden.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("train", [True, False], ids=["training", "eval"])
def test_the_triton_path_with_global_rows_equals_the_reference(train):
    # No attention dropout: the path whose global rows run SDPA and are spliced while the heads merge.
    out, grads = _model_run("triton", train)
    expected, expected_grads = _model_run("reference", train)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    assert bool(grads) == train
    if train:
        assert_same_gradients(grads, expected_grads, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("reentrant", [False, True])
def test_layer_checkpointing_re_runs_the_recomputed_splice_with_the_same_gradients(reentrant):
    # The splice of the global rows is itself recomputed in backward, inside the layer's own recomputation.
    out, grads = _model_run("fast", True)
    again, checkpointed = _model_run("fast", True, checkpointing={"use_reentrant": reentrant})
    torch.testing.assert_close(again, out)
    assert checkpointed.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(checkpointed[name], grad, msg=name)

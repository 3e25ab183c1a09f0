"""FSAT's two `"mlp"` feature maps as one autograd Function (`attnzoo.fsat.feature_maps`) against the two modules run
apart, forward and backward (input and every parameter), and the stacked pooled cross it feeds
(`pooling.pooled_cross_stacked`) against the pooled cross of the two maps apart."""

from __future__ import annotations

import pytest
import torch

from attnzoo.benchmarking.recorder import OpRecorder
from attnzoo.fsat import FSATConfig
from attnzoo.fsat.attention_fsat import FeatureMap, FSATAttention
from attnzoo.fsat.feature_maps import mlp_feature_maps
from attnzoo.fsat.pooling import pooled_cross_fused, pooled_cross_stacked

B, N, D = 2, 7, 12


def maps(dtype: torch.dtype = torch.float32, act: str = "gelu", seed: int = 0) -> tuple[FeatureMap, FeatureMap]:
    torch.manual_seed(seed)
    config = FSATConfig(hidden_size=D, num_attention_heads=2, intermediate_size=2 * D, feature_map_act=act)
    return FeatureMap(config).to(dtype), FeatureMap(config).to(dtype)


def hidden(dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, D, generator=g).to(dtype).requires_grad_()


def plain(x: torch.Tensor, first: FeatureMap, second: FeatureMap) -> torch.Tensor:
    """The reference: each map's layers by plain autograd."""
    return torch.stack([m.outer(m.act(m.inner(x))) for m in (first, second)])


def grads_of(out: torch.Tensor, x: torch.Tensor, first: FeatureMap, second: FeatureMap, probe: torch.Tensor):
    inputs = (x, *first.parameters(), *second.parameters())
    return torch.autograd.grad((out.float() * probe).sum(), inputs)


@pytest.mark.parametrize("act", ["gelu", "relu", "silu"])
def test_the_grouped_maps_pass_gradcheck_and_equal_the_plain_layers(act):
    first, second = maps(torch.float64, act)
    x = hidden(torch.float64)
    params = (*first.parameters(), *second.parameters())

    def grouped(x, *_params):  # the parameters are read through the modules
        return mlp_feature_maps(x, first, second, first.act)

    assert torch.autograd.gradcheck(grouped, (x, *params))
    out = grouped(x)
    expected = plain(x, first, second)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    probe = torch.randn(out.shape, dtype=torch.float64)
    for grad, want in zip(grads_of(out, x, first, second, probe), grads_of(expected, x, first, second, probe),
                          strict=True):  # fmt: skip
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grouped_maps_equal_the_modules_forward_and_backward(dtype):
    """Against `FeatureMap.forward` (the modules as the `"dsconv"` maps still run): fp32 to round-off, bf16 within a
    rounding of its GEMMs' accumulation order."""
    first, second = maps(dtype)
    x = hidden(dtype)
    out = mlp_feature_maps(x, first, second, first.act)
    expected = torch.stack((first(x, None), second(x, None)))
    assert out.dtype == dtype and out.shape == (2, B, N, D)
    tol = {} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(out, expected, **tol)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    grads = grads_of(out, x, first, second, probe)
    for grad, want, name in zip(grads, grads_of(expected, x, first, second, probe),
                                ["x", *(f"{i}.{n}" for i in (1, 2) for n, _ in first.named_parameters())],
                                strict=True):  # fmt: skip
        assert grad.dtype == dtype, name
        torch.testing.assert_close(grad, want, **tol, msg=name)


def test_the_grouped_maps_under_autocast_compute_as_the_linear_layers():
    """fp32 parameters and input under bf16 autocast: the GEMMs in bf16 as `nn.Linear`'s, the gradients in fp32."""
    first, second = maps()
    x = hidden()
    probe = torch.randn(2, B, N, D, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlp_feature_maps(x, first, second, first.act)
        expected = torch.stack((first(x, None), second(x, None)))
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=1.6e-2, atol=1e-2)
    grads = grads_of(out, x, first, second, probe)
    for grad, want in zip(grads, grads_of(expected, x, first, second, probe), strict=True):
        assert grad.dtype == torch.float32
        torch.testing.assert_close(grad, want, rtol=2e-2, atol=2e-2)


def test_the_grouped_maps_skip_the_gradients_nobody_needs():
    first, second = maps()
    for p in first.inner.parameters():
        p.requires_grad_(False)
    x = hidden().detach()
    out = mlp_feature_maps(x, first, second, first.act)
    expected = plain(x, first, second)
    probe = torch.randn(out.shape)
    trained = [p for p in (*first.parameters(), *second.parameters()) if p.requires_grad]
    grads = torch.autograd.grad((out * probe).sum(), trained)
    for grad, want in zip(grads, torch.autograd.grad((expected * probe).sum(), trained), strict=True):
        torch.testing.assert_close(grad, want)


def test_the_grouped_maps_save_the_input_and_the_activations_inputs_only():
    first, second = maps()
    x = hidden()
    seen: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in (*first.parameters(), *second.parameters())}

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in params:
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mlp_feature_maps(x, first, second, first.act)
    # The input (which the queries' projection keeps anyway) and the two maps' pre-activations (B, N, D) each.
    assert sorted(seen.values()) == sorted([x.numel() * 4, 2 * x.numel() * 4])


def test_the_grouped_maps_run_one_activation_and_batch_the_weight_gradients():
    first, second = maps(torch.bfloat16)
    x = hidden(torch.bfloat16)
    grad = torch.randn(2, B, N, D).bfloat16()
    recorder = OpRecorder()
    with recorder:
        out = mlp_feature_maps(x, first, second, first.act)
        forward = dict(recorder.total().ops)
        out.backward(grad)
    assert forward == {"addmm": 4, "gelu": 1}
    backward = dict(recorder.total().ops)
    for op, count in forward.items():
        backward[op] -= count
    # The two maps' (the modules apart: 18 ops and an addition of the input gradients): the activation recomputed,
    # both weights' gradients per layer in one batched GEMM and both biases' in one sum, the input gradient in one
    # buffer.
    assert {op: n for op, n in backward.items() if n} == {
        "gelu": 1, "bmm": 2, "sum": 2, "mm": 3, "gelu_backward": 1, "addmm_": 1,
    }  # fmt: skip


@pytest.mark.parametrize("feature_map", ["mlp", "dsconv"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_the_layers_feature_maps_equal_the_two_modules_forward_and_backward(feature_map, padded):
    """`FSATAttention.feature_maps` (grouped for `"mlp"`) against the modules' own `forward`, with padding."""
    torch.manual_seed(0)
    config = FSATConfig(
        hidden_size=D, num_attention_heads=2, intermediate_size=2 * D, feature_map=feature_map,
        num_dominant_indices=2, num_random_indices=1,
    )  # fmt: skip
    layer = FSATAttention(config)
    x = hidden()
    valid = None
    if padded:
        valid = torch.ones(B, N, dtype=torch.bool)
        valid[1, 4:] = False
    out = layer.feature_maps(x, valid)
    expected = torch.stack((layer.feature_map_1(x, valid), layer.feature_map_2(x, valid)))
    torch.testing.assert_close(out, expected)
    if padded:
        assert not out[:, 1, 4:].any()
    probe = torch.randn(out.shape)
    inputs = (x, *layer.feature_map_1.parameters(), *layer.feature_map_2.parameters())
    grads = torch.autograd.grad((out * probe).sum(), inputs)
    for grad, want in zip(grads, torch.autograd.grad((expected * probe).sum(), inputs), strict=True):
        torch.testing.assert_close(grad, want)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_stacked_pooled_cross_equals_the_pair_forward_and_backward(padded, dtype):
    g = torch.Generator().manual_seed(0)
    valid = None
    features = torch.randn(2, B, N, D, generator=g, dtype=torch.float64)
    if padded:
        valid = torch.ones(B, N, dtype=torch.bool)
        valid[1, 4:] = False
        valid[0, 1] = False
        features = features * valid[..., None]
    features = features.to(dtype).requires_grad_()
    pair = [f.detach().clone().requires_grad_() for f in features]
    out = pooled_cross_stacked(features, valid)
    expected = pooled_cross_fused(*pair, valid)
    assert torch.equal(out, expected)
    probe = torch.randn(out.shape, generator=g, dtype=out.dtype)
    (grad,) = torch.autograd.grad((out * probe).sum(), features)
    want = torch.autograd.grad((expected * probe).sum(), pair)
    assert grad.shape == features.shape and grad.is_contiguous()
    assert torch.equal(grad, torch.stack(want))
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda f: pooled_cross_stacked(f, valid), (features,))


def test_the_stacked_pooled_cross_takes_any_layout_and_returns_a_contiguous_gradient():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(B, 2, N, D, generator=g, dtype=torch.float64).transpose(0, 1).requires_grad_()
    pair = [f.detach().clone().requires_grad_() for f in features]
    out = pooled_cross_stacked(features, None)
    expected = pooled_cross_fused(*pair, None)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(out.sum(), features)
    assert grad.is_contiguous()
    torch.testing.assert_close(grad, torch.stack(torch.autograd.grad(expected.sum(), pair)), rtol=1e-12, atol=1e-12)


def test_the_stacked_pooled_cross_saves_the_stacked_maps_once():
    features = torch.randn(2, B, 300, D, requires_grad=True)
    seen: dict[int, int] = {}

    def pack(tensor):
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pooled_cross_stacked(features, None)
    assert list(seen.values()) == [features.numel() * 4]


def test_the_stacked_pooled_cross_rejects_other_shapes():
    with pytest.raises(ValueError, match=r"must be \(2, B, N, D\)"):
        pooled_cross_stacked(torch.randn(3, B, N, D), None)
    with pytest.raises(ValueError, match=r"must be \(2, B, N, D\)"):
        pooled_cross_stacked(torch.randn(B, N, D), None)

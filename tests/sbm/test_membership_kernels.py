"""SBM's fused membership network (`attnzoo.kernels.triton.memberships`, CUDA's path: run by Triton's interpreter on
CPU, and compiled on CUDA under the `gpu` marker) against its torch reference (`SBMAttention.selection`): memberships
and every gradient (inputs, both MLP layers, the cluster embeddings), for the MLP shared by the heads and the per-head
one, with padding, rotary positions and a head size and number of clusters that are not powers of two; the block
matrix and its gradient; the rates of the fastRG draws."""

from __future__ import annotations

import copy

import pytest
import torch

from attnzoo.kernels import dispatch
from attnzoo.sbm import SBMAttention, SBMConfig

pytest.importorskip("triton")

from triton_devices import TRITON_DEVICES as DEVICES  # noqa: E402


def _attention(shared: bool, backend: str, dtype: torch.dtype, device: str, **overrides) -> SBMAttention:
    config = SBMConfig(
        vocab_size=100, hidden_size=72, num_hidden_layers=1, num_attention_heads=3, intermediate_size=64,
        num_clusters=20, shared_membership_mlp=shared, membership_logit_bias=-0.5, attention_backend=backend,
        **overrides,
    )  # fmt: skip
    torch.manual_seed(0)
    attn = SBMAttention(config)
    attn.init_method_weights()
    with torch.no_grad():  # weights large enough that the ReLU and the sigmoid are far from linear
        for p in attn.membership_mlp.parameters():
            p.normal_(0.0, 0.3)
    return attn.to(device, dtype)


def _selection(attn: SBMAttention, q, k, query_valid, key_valid, seed: int = 1):
    q, k = (t.detach().clone().requires_grad_() for t in (q, k))
    q_memb, k_memb, blocks = attn.selection(q, k, query_valid, key_valid)
    generator = torch.Generator().manual_seed(seed)
    grads = [torch.randn(t.shape, generator=generator).to(t.device) for t in (q_memb, k_memb, blocks)]
    # Ŝ enters transposed, as in K̂ Ŝᵀ: its gradient reaches the block-matrix backward with transposed strides.
    loss = sum((t * g).sum() for t, g in zip((q_memb, k_memb, blocks.transpose(-1, -2)), grads, strict=True))
    params = [*attn.membership_mlp.parameters(), attn.clusters]
    found = torch.autograd.grad(loss, [q, k, *params])
    return (q_memb, k_memb), found


def _inputs(dtype: torch.dtype, device: str, n: int = 37, m: int = 37, token_major: bool = False):
    """q, k `(2, 3, n | m, 24)`; `token_major`: transposed views of `(2, n | m, 3, 24)`, as the projections make
    them (the kernels read them in place and write their gradients in that layout)."""
    generator = torch.Generator().manual_seed(2)
    if token_major:
        q, k = (torch.randn(2, t, 3, 24, generator=generator).to(dtype).transpose(1, 2) for t in (n, m))
    else:
        q, k = (torch.randn(2, 3, t, 24, generator=generator).to(dtype) for t in (n, m))
    key_valid = torch.ones(2, m, dtype=torch.bool)
    key_valid[1, m - 9 :] = False
    return q.to(device), k.to(device), key_valid.to(device)


def _compare(fused, reference, tolerance: float) -> None:
    for got, want in zip((*fused[0], *fused[1]), (*reference[0], *reference[1]), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        scale = want.double().abs().max().clamp(min=1e-6)
        assert ((got.double() - want.double()).abs().max() / scale).item() < tolerance


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton path on CPU tensors needs the interpreter")
def test_dispatch_picks_the_fused_network_on_the_triton_path_only():
    cpu = torch.device("cpu")
    assert dispatch.sbm_selection_kernels("triton", cpu, torch.float32, 64, 128) is not None
    assert dispatch.sbm_selection_kernels("reference", cpu, torch.float32, 64, 128) is None
    assert dispatch.sbm_selection_kernels("triton", cpu, torch.float64, 64, 128) is None
    assert dispatch.sbm_selection_kernels("triton", cpu, torch.float32, 64, 256) is None  # one tile


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [True, False], ids=["shared-mlp", "per-head-mlp"])
@pytest.mark.parametrize(("padded", "token_major"), [(False, False), (True, True)], ids=["plain", "padded-views"])
def test_fused_memberships_equal_the_reference_in_fp32(device, shared, padded, token_major):
    q, k, key_valid = _inputs(torch.float32, device, n=37, m=45, token_major=token_major)
    key_valid = key_valid if padded else None
    query_valid = None if key_valid is None else key_valid[:, :37]
    fused = _selection(_attention(shared, "triton", torch.float32, device), q, k, query_valid, key_valid)
    reference = _selection(_attention(shared, "reference", torch.float32, device), q, k, query_valid, key_valid)
    _compare(fused, reference, 1e-5)
    assert fused[1][0].stride() == q.stride()  # the input gradient in the input's layout
    if padded:  # padded rows: no membership, no gradient
        assert fused[0][1][1, :, 45 - 9 :].abs().max() == 0
        assert fused[1][1][1, :, 45 - 9 :].abs().max() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_fused_memberships_read_the_unrotated_queries_and_keys(device):
    q, k, key_valid = _inputs(torch.float32, device)
    kwargs = {"position_embedding_type": "rotary"}
    fused_attn = _attention(True, "triton", torch.float32, device, **kwargs)
    assert fused_attn.rotary
    fused = _selection(fused_attn, q, k, key_valid, key_valid)
    reference = _selection(_attention(True, "reference", torch.float32, device, **kwargs), q, k, key_valid, key_valid)
    _compare(fused, reference, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [True, False], ids=["shared-mlp", "per-head-mlp"])
def test_fused_memberships_in_bf16_match_the_network_on_the_same_values_in_fp32(device, shared):
    """In bf16 the kernel rounds each layer's output to bf16, as torch's linear layers do; the values and gradients
    are within bf16's rounding of the fp32 network run on the same (bf16) weights and inputs. (torch's own bf16 CPU
    path is no closer: its per-head GEMMs and their backward accumulate in bf16.)"""
    q, k, key_valid = _inputs(torch.bfloat16, device)
    attn = _attention(shared, "triton", torch.bfloat16, device)
    fused = _selection(attn, q, k, key_valid, key_valid)
    truth_attn = copy.deepcopy(attn).float()
    truth_attn.config.attention_backend = "reference"
    truth = _selection(truth_attn, q.float(), k.float(), key_valid, key_valid)
    # The gradients of the bf16 parameters and inputs are bf16: compare them in fp32.
    truth = (truth[0], [g.to(torch.bfloat16) for g in truth[1]])
    _compare(fused, truth, 4e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("clusters", [20, 128])
def test_fused_fastrg_rates_equal_the_torch_sampler_inputs(device, clusters):
    from attnzoo.kernels.triton.memberships import fastrg_weights_triton
    from attnzoo.sbm.fastrg import sampler_inputs

    generator = torch.Generator().manual_seed(5)
    q_memb = torch.rand(2, 3, 45, clusters, generator=generator).to(device)
    k_memb = torch.rand(2, 3, 29, clusters, generator=generator).to(device)
    blocks = torch.randn(3, clusters * clusters, generator=generator).softmax(-1).view(3, clusters, clusters)
    blocks = blocks.to(device)
    fused = sampler_inputs(q_memb, k_memb, blocks, None, None, fastrg_weights_triton)
    reference = sampler_inputs(q_memb, k_memb, blocks, None, None)
    for name in ("weights", "row_rates", "rates", "cluster_totals"):
        torch.testing.assert_close(getattr(fused, name), getattr(reference, name), rtol=1e-5, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_block_matrix_on_its_own_equals_the_reference(device):
    """`SBMAttention.block_matrix()` (the block matrices without the memberships) on the Triton path."""
    fused_attn, reference_attn = (
        _attention(False, backend, torch.float32, device) for backend in ("triton", "reference")
    )
    grad = torch.randn(3, 20, 20, generator=torch.Generator().manual_seed(8)).to(device)
    results = []
    for attn in (fused_attn, reference_attn):
        blocks = attn.block_matrix()
        (clusters_grad,) = torch.autograd.grad((blocks * grad).sum(), attn.clusters)
        results.append((blocks, clusters_grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)

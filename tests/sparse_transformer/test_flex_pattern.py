"""The Sparse Transformer's FlexAttention path (CUDA's fast path): the closed-form tiles against
`create_block_mask(mask_mod)`, the class-major order, the forward against the reference for every pattern and head
assignment (padding, global tokens), what it adds to a layer (ops, syncs), attention dropout (the hashed mask, forward
and backward), and on a GPU its backward."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
from torch.nn.attention.flex_attention import create_block_mask

import attnzoo.sparse_transformer.attention_sparse_transformer as st_attention
import attnzoo.sparse_transformer.flex_pattern as st_flex
from attnzoo.benchmarking.recorder import Counts, OpRecorder, stubbed_flex_attention
from attnzoo.kernels.hashing import keep_decisions, keep_threshold
from attnzoo.registry import FAMILIES
from attnzoo.sparse_transformer import SparseTransformerAttention, SparseTransformerConfig
from attnzoo.sparse_transformer.flex_pattern import class_major_order, flex_pattern
from attnzoo.sparse_transformer.pattern import PatternSpec, filled_table
from source_checkout import load_script

LOCAL, RESIDUE, BLOCK, SUMMARY = ("local",), ("residue",), ("block",), ("summary",)
MERGED_FIXED = ("block", "summary")
#: The layers' head sub-patterns FlexAttention runs: split (an odd head count too), interleaved (even, odd layers),
#: merged fixed.
HEAD_KINDS = {
    "strided-split": (LOCAL, LOCAL, RESIDUE, RESIDUE),
    "strided-split-3": (LOCAL, LOCAL, RESIDUE),
    "strided-even": (LOCAL, LOCAL),
    "strided-odd": (RESIDUE, RESIDUE),
    "fixed-split": (BLOCK, BLOCK, SUMMARY, SUMMARY),
    "fixed-merged": (MERGED_FIXED, MERGED_FIXED),
    "fixed-even": (BLOCK,),
    "fixed-odd": (SUMMARY,),
}


def _tiles(block_mask) -> torch.Tensor:
    """`(B, H, Q, K)` int8 tile classes of a BlockMask: 0 untouched, 1 partial, 2 full."""
    cols = block_mask.kv_indices.shape[-1]
    out = torch.zeros(*block_mask.kv_indices.shape[:-1], cols, dtype=torch.int8)
    for value, counts, indices in (
        (1, block_mask.kv_num_blocks, block_mask.kv_indices),
        (2, block_mask.full_kv_num_blocks, block_mask.full_kv_indices),
    ):
        if counts is not None:
            listed = (torch.arange(cols) < counts[..., None]).to(torch.int8) * value
            out.scatter_add_(-1, indices.long(), listed)
    return out


@pytest.mark.parametrize("case", sorted(HEAD_KINDS))
def test_closed_form_tiles_equal_create_block_mask(case):
    # Every rule: lengths within one tile and over several with a tail, strides below and above the tile, the causal
    # rule, global tokens inside the first tile or spanning tiles, LRA's first column, unequal tile shapes.
    head_kinds = HEAD_KINDS[case]
    fixed = any("block" in kinds or "summary" in kinds for kinds in head_kinds)
    grid = itertools.product(
        [7, 100], [3, 16], [False, True], [0, 1, 40], [False, True] if fixed else [False], [(16, 16), (32, 16)]
    )
    for length, stride, causal, num_global, first_column, block in grid:
        spec = PatternSpec(stride, 3, causal, first_column, num_global)
        layout = flex_pattern(head_kinds, length, spec, torch.device("cpu"), block)
        heads = len(head_kinds)
        expected = create_block_mask(layout.block_mask.mask_mod, 1, heads, length, length, "cpu", BLOCK_SIZE=block)
        assert torch.equal(_tiles(layout.block_mask), _tiles(expected)), (length, spec, block)
        # The tiles for padded batches: every touched tile, none full.
        assert torch.equal(_tiles(layout.padded_tiles), _tiles(expected).clamp(max=1)), (length, spec, block)


def test_padded_tiles_hold_every_pair_of_a_padded_batch():
    spec = PatternSpec(8, 3, False, False, 2)
    layout = flex_pattern(HEAD_KINDS["strided-split"], 100, spec, torch.device("cpu"), (16, 16))
    key_valid = torch.ones(2, 100, dtype=torch.bool)
    key_valid[0, :1] = False  # a padded global token
    key_valid[1, 70:] = False
    padded = create_block_mask(layout.mask_mod(key_valid), 2, 4, 100, 100, "cpu", BLOCK_SIZE=16)
    listed = _tiles(layout.padded_tiles) > 0
    assert not (_tiles(padded) > 0)[~listed.expand(2, -1, -1, -1)].any()


@pytest.mark.parametrize(("length", "stride"), [(1, 4), (5, 8), (64, 8), (70, 8), (37, 5)])
def test_class_major_order_makes_each_residue_class_one_run_in_token_order(length, stride):
    order = class_major_order(length, stride)
    assert torch.equal(order.sort().values, torch.arange(length))
    residue = order % stride
    assert bool((residue[1:] >= residue[:-1]).all())  # classes in turn, each contiguous
    same_class = residue[1:] == residue[:-1]
    assert bool((order[1:] > order[:-1])[same_class].all())  # token order inside a class
    expected = sorted(range(length), key=lambda i: (i % stride, i))
    assert order.tolist() == expected


def test_head_group_table_is_built_from_its_runs_in_order():
    # The layer's head -> sub-pattern group table, made on the device by fills (no host data copied).
    for values in ([0, 0, 1, 1], [0, 1, 0, 1, 1, 2], [3]):
        table = filled_table(values, torch.device("cpu"))
        assert table.dtype == torch.long and table.tolist() == values
    assert filled_table([], torch.device("cpu")).shape == (0,)


def _attention(pattern: str, assignment: str, causal: bool, layer_idx: int, num_global: int, hidden_size: int = 32):
    config = SparseTransformerConfig(
        hidden_size=hidden_size,
        num_attention_heads=4,
        vocab_size=100,
        attention_probs_dropout_prob=0.0,
        num_global_tokens=num_global,
        sparse_pattern=pattern,
        sparse_head_assignment=assignment,
        sparse_causal=causal,
        sparse_stride=8,
        sparse_summary_size=3,
    )
    return SparseTransformerAttention(config, layer_idx=layer_idx).eval()


@pytest.fixture
def flex_on_this_device(monkeypatch):
    """The kernel dispatch answers as on CUDA: the layer takes its FlexAttention path (forward only on CPU)."""
    monkeypatch.setattr(st_attention, "uses_flex_attention", lambda backend, *args, head_dim: backend == "fast")


@pytest.mark.parametrize("hidden_size,flex", [(32, False), (64, True)], ids=["head_dim_8", "head_dim_16"])
def test_heads_narrower_than_16_keep_the_primitives_on_cuda(monkeypatch, hidden_size, flex):
    # inductor's CUDA FlexAttention raises NotImplementedError below 16 columns per head
    pytest.importorskip("triton")
    dispatch = st_attention.uses_flex_attention

    def as_on_cuda(backend, device, *dtypes, head_dim):
        return dispatch(backend, torch.device("cuda"), *dtypes, head_dim=head_dim)

    monkeypatch.setattr(st_attention, "uses_flex_attention", as_on_cuda)
    attention = _attention("strided", "split", False, 0, 1, hidden_size=hidden_size)
    attention.config.attention_backend = "fast"
    q = k = v = torch.randn(1, 4, 64, hidden_size // 4)
    assert attention.runs_flex(q, k, v) is flex


def _attend(attention, q, k, v, key_valid, backend):
    attention.config.attention_backend = backend
    out = attention.attend(q, k, v, key_valid)
    # The core adds the global rows (spliced in when the heads merge).
    return attention.head_split_output(attention.with_global_rows(out, q, k, v, key_valid))


# Interleaved layers alternate the two sub-patterns: both layers of each.
@pytest.mark.parametrize(
    ("pattern", "assignment", "layer_idx"),
    [
        ("strided", "split", 0),
        ("strided", "interleaved", 0),
        ("strided", "interleaved", 1),
        ("fixed", "split", 0),
        ("fixed", "merged", 0),
        ("fixed", "interleaved", 0),
        ("fixed", "interleaved", 1),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
# Global columns: 3 inside the first block, 10 reaching into the second (stride 8).
@pytest.mark.parametrize("num_global", [0, 3, 10])
def test_flex_forward_equals_reference(pattern, assignment, causal, layer_idx, num_global, flex_on_this_device):
    torch.manual_seed(0)
    attention = _attention(pattern, assignment, causal, layer_idx, num_global)
    n = 37
    q, k, v = (torch.randn(2, 4, n, 8, dtype=torch.float64) for _ in range(3))
    key_valid = torch.ones(2, n, dtype=torch.bool)
    key_valid[1, n - 11 :] = False
    key_valid[0, 1] = False  # a padded key among the global ones
    assert attention.runs_flex(q, k, v)
    with torch.no_grad():
        for valid in (key_valid, None):
            flex = _attend(attention, q, k, v, valid, "fast")
            torch.testing.assert_close(flex, _attend(attention, q, k, v, valid, "reference"), rtol=1e-10, atol=1e-10)


def test_merged_strided_heads_keep_the_other_fast_path_and_dropout_keeps_flex(flex_on_this_device):
    q = torch.randn(1, 4, 20, 8)
    merged = _attention("strided", "merged", False, 0, 1)
    assert not merged.runs_flex(q, q, q)  # a window and a residue class in one softmax: no order makes it tiles
    split = _attention("strided", "split", False, 0, 1)
    assert split.runs_flex(q, q, q)
    split.config.attention_probs_dropout_prob = split.dropout = 0.1
    assert split.train().runs_flex(q, q, q)  # dropout by two calls (`kernels.flex.flex_block_attention`)


#: (device, dtype, length, hidden size, tolerance): fp64 through torch's eager FlexAttention on CPU; on CUDA the
#: compiled kernels, with several 128-tiles and a tail, head dim 16 (Triton's smallest dot).
DROPOUT_DEVICES = [
    pytest.param("cpu", torch.float64, 37, 32, 1e-10, id="cpu"),
    pytest.param("cuda", torch.float32, 300, 64, 2e-4, id="cuda", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize(("device", "dtype", "n", "hidden", "tolerance"), DROPOUT_DEVICES)
@pytest.mark.parametrize(
    ("pattern", "assignment", "layer_idx"), [("strided", "split", 0), ("fixed", "merged", 0), ("fixed", "split", 0)]
)
@pytest.mark.parametrize("num_global", [0, 3])
def test_flex_dropout_equals_the_reference_weights_with_the_hashed_mask(
    device, dtype, n, hidden, tolerance, pattern, assignment, layer_idx, num_global, flex_on_this_device, monkeypatch
):
    """In training with attention dropout the FlexAttention path drops, forward and backward, exactly the entries
    the counter hash of its seed decides at each head's positions in its own order (class-major for residue heads),
    global rows and columns and padding included: the reference's weights times that mask over 1 - p."""
    torch.manual_seed(0)
    attention = _attention(pattern, assignment, False, layer_idx, num_global, hidden_size=hidden).to(device)
    attention.config.attention_probs_dropout_prob = attention.dropout = 0.3
    seed, d = torch.tensor(2024, device=device), hidden // 4
    q, k, v = (torch.randn(2, 4, n, d, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    key_valid = torch.ones(2, n, dtype=torch.bool, device=device)
    key_valid[1, n - 11 :] = False
    monkeypatch.setattr(st_attention, "draw_seed", lambda device: seed)
    # torch refuses FlexAttention's backward on CPU before it runs its (device-independent) eager backward: lift it.
    monkeypatch.setattr(torch_flex, "_validate_device", lambda *args: None)
    out = _attend(attention.train(), q, k, v, key_valid, "fast")
    reference = attention.eval()
    reference.config.attention_backend = "reference"
    weights = reference.with_global_rows(
        reference.attend(q, k, v, key_valid, output_attentions=True), q, k, v, key_valid
    ).attn_weights  # (B, H, N, N), the global rows' included
    layout = flex_pattern(attention.head_kinds, n, attention.spec, torch.device(device))
    position = torch.arange(n, device=device).expand(4, n)  # (H, N): each token's position in its head's order
    if layout.permutation is not None:
        position = layout.permutation.inverse
    flat_head = (torch.arange(2, device=device)[:, None] * 4 + torch.arange(4, device=device))[..., None, None]
    keep = keep_decisions(
        seed, flat_head, position[None, :, :, None], position[None, :, None, :], keep_threshold(0.3)
    )  # (B, H, N, N)
    expected = (weights * keep / 0.7) @ v
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
    grad = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=10 * tolerance, atol=tolerance)


def test_cached_pattern_tensors_serve_training_after_inference_mode():
    # The caches are filled by whichever forward comes first; tensors made under inference mode could not be saved
    # for a later backward.
    attention = _attention("strided", "merged", False, 0, 1)  # the edge kernel saves the cached edge list
    q, k, v = (torch.randn(1, 4, 27, 8, requires_grad=True) for _ in range(3))
    with torch.inference_mode():
        attention.attend(q.detach(), k.detach(), v.detach(), None)
    attention.attend(q, k, v, None).hidden_states.sum().backward()
    assert q.grad is not None
    # The density is one cached tensor: nothing is copied to the device at every forward.
    assert attention.density(27, q.device) is attention.density(27, q.device)


# ----- what the FlexAttention path adds to a layer, through CUDA's code path (the kernel stubbed) -----


def _layer_counts(family: str, train: bool) -> Counts:
    torch.manual_seed(0)
    config = FAMILIES[family].config_class(
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        num_hidden_layers=1,
        vocab_size=100,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = FAMILIES[family].model_class(config).train(train)
    ids = torch.randint(5, 100, (1, 256))

    def step():
        hidden = model(input_ids=ids).last_hidden_state
        if train:
            hidden.pow(2).mean().backward()

    warm_up, recorder = OpRecorder(), OpRecorder()
    with torch.set_grad_enabled(train):
        # FlexAttention's kernels are the stand-in the CPU proxies use: counted launches, no op.
        with stubbed_flex_attention(warm_up):
            step()  # fills the caches, as the benchmark's warm-up step does
        with stubbed_flex_attention(recorder), recorder:
            step()
    return recorder.total()


@pytest.mark.parametrize("train", [False, True], ids=["forward", "forward+backward"])
def test_flex_layer_adds_few_ops_and_no_sync_over_dense(train, flex_on_this_device):
    dense = _layer_counts("dense_transformer", train)
    sparse = _layer_counts("sparse_transformer", train)  # strided split heads, one global token
    assert sum(sparse.launches.values()) == (3 if train else 1)  # the FlexAttention call ran
    extra = sparse.num_ops - dense.num_ops
    # Measured: +4 forward (3 permutations in, 1 out, the density stack, no SDPA), +7 forward+backward; the issue's
    # bound is 15 / 30 (issue 49). The reshaped path this replaces on CUDA adds +21 / +61 (the CPU proxies).
    assert extra <= (15 if not train else 30), sparse.ops - dense.ops
    assert sparse.syncs == dense.syncs  # the model's own input checks, nothing from the attention


# ----- on a GPU: the compiled kernels, their backward and the absence of syncs -----


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("pattern", "assignment", "causal"),
    [
        ("strided", "split", False),
        ("strided", "interleaved", True),
        ("fixed", "split", True),
        ("fixed", "merged", False),
    ],
)
def test_flex_forward_and_backward_on_cuda_equal_reference(pattern, assignment, causal):
    torch.manual_seed(0)
    n = 300  # several 128-tiles with a tail
    attention = _attention(pattern, assignment, causal, 1, 3, hidden_size=64).cuda()  # d = 16: Triton's smallest dot
    q, k, v = (torch.randn(2, 4, n, 16, device="cuda", requires_grad=True) for _ in range(3))
    key_valid = torch.ones(2, n, dtype=torch.bool, device="cuda")
    key_valid[1, 230:] = False
    key_valid[0, 1] = False
    grad = torch.randn(2, 4, n, 16, device="cuda")
    assert attention.runs_flex(q, k, v)
    results = []
    for backend in ("fast", "reference"):
        for valid in (key_valid, None):
            out = _attend(attention, q, k, v, valid, backend)
            results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    for flex, reference in zip(results[:2], results[2:], strict=True):
        for a, b in zip(flex, reference, strict=True):
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.gpu
def test_flex_layer_under_bf16_autocast_runs_without_device_syncs():
    torch.manual_seed(0)
    attention = _attention("strided", "split", False, 0, 1, hidden_size=64).cuda().train()
    hidden = torch.randn(2, 512, 64, device="cuda", requires_grad=True)
    key_valid = torch.ones(2, 512, dtype=torch.bool, device="cuda")
    key_valid[1, 400:] = False
    assert attention.runs_flex(hidden.bfloat16(), hidden.bfloat16(), hidden.bfloat16())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        # Warm-up: compiles the forward and backward kernels (autotuning waits for the device), fills the caches.
        attention(hidden, key_valid).hidden_states.float().pow(2).mean().backward()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = attention(hidden, key_valid).hidden_states
            out.float().pow(2).mean().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    attention.config.attention_backend = "reference"
    with torch.autocast("cuda", dtype=torch.bfloat16):
        reference = attention(hidden, key_valid).hidden_states
    torch.testing.assert_close(out.float(), reference.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
def test_flex_dropout_layer_runs_without_syncs_and_compiles_whole(monkeypatch):
    """Training with attention dropout under bf16 autocast: the two FlexAttention calls and the rescale wait for the
    device nowhere, and the layer compiled whole (dynamo through the checkpointed second call) gives the eager
    layer's output and input gradient for the same seed."""
    torch.manual_seed(0)
    attention = _attention("strided", "split", False, 0, 1, hidden_size=64).cuda().train()
    attention.config.attention_probs_dropout_prob = attention.dropout = 0.1
    seed = torch.tensor(7, device="cuda")
    monkeypatch.setattr(st_attention, "draw_seed", lambda device: seed)
    hidden = torch.randn(2, 512, 64, device="cuda", requires_grad=True)
    key_valid = torch.ones(2, 512, dtype=torch.bool, device="cuda")
    key_valid[1, 400:] = False

    def step(layer) -> tuple[torch.Tensor, torch.Tensor]:
        hidden.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(hidden, key_valid).hidden_states.float()
        out.pow(2).mean().backward()
        return out.detach(), hidden.grad.clone()

    step(attention)  # warm-up: compiles the kernels (autotuning waits for the device), fills the caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = step(attention)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for got, want in zip(step(torch.compile(attention)), eager, strict=True):
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


# ----- the compiled kernel on CPU: the tiles decide what it computes -----


@pytest.mark.slow
def test_compiled_flex_on_cpu_equals_reference_through_the_tiles():
    # Eager FlexAttention evaluates the mask rule everywhere; the compiled kernel (inductor's CPU template) visits only
    # the listed tiles and skips the rule on full ones, so a wrong tile list shows here. About a minute of compiling.
    torch.manual_seed(0)
    attention = _attention("strided", "split", False, 0, 1)
    n = 300
    q, k, v = (torch.randn(2, 4, n, 8) for _ in range(3))
    key_valid = torch.ones(2, n, dtype=torch.bool)
    key_valid[1, 250:] = False
    compiled = torch.compile(torch.nn.attention.flex_attention.flex_attention, dynamic=False)
    spec, kinds = attention.spec, attention.head_kinds
    for valid in (None, key_valid):
        layout = flex_pattern(kinds, n, spec, q.device, (32, 32))
        block_mask = (
            layout.block_mask if valid is None else st_flex.with_mask_mod(layout.padded_tiles, layout.mask_mod(valid))
        )
        pq, pk, pv = (layout.permutation.apply(x) for x in (q, k, v))
        out = layout.permutation.undo(compiled(pq, pk, pv, block_mask=block_mask, scale=attention.scaling))
        out = attention.head_split_output(
            attention.with_global_rows(st_attention.FlexAttentionOutput(out), q, k, v, valid)
        )
        expected = _attend(attention, q, k, v, valid, "reference")
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_gpu_benchmark_program_runs_its_dry_run(tmp_path):
    # The micro-benchmark the GPU command calls (scripts/tools/bench_sparse_transformer_flex.py), at toy sizes on CPU.
    bench = load_script("tools/bench_sparse_transformer_flex")
    result = bench.main(["--dry-run", "--patterns", "strided-split", "--output-dir", str(tmp_path)])
    rows = {row["method"]: row for row in result["rows"]}
    assert set(rows) == {"dense", "flex", "reshape"} and not any("error" in row for row in rows.values())
    assert rows["flex"]["max_abs_diff_vs_reshape"] < 1e-5  # the two fast paths compute the same attention
    assert (tmp_path / "st_flex.json").is_file() and "| strided-split | 192 | flex |" in (
        tmp_path / "st_flex.md"
    ).read_text()

"""SBM's, Smart Bird's and A²-Former's own Triton kernels compile for the GPU (sm_90), on a machine without one: the
fastRG sampler and edge list, the CSR products, the edge attention on int32 columns, SBM's membership network, block
matrix and rates of the fastRG draws, the attentive sampler and the interpolated attention (the harness:
`tests/triton_compile.py`).

Each case is a launch its Python wrapper makes: the pointer dtypes it passes (placeholders for absent inputs
included: they are typed pointers too), the int arguments that are constexpr, those a launch specialises to the
constant 1 when they are 1 in common shapes (`ones`), and the option combinations the wrapper can produce.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from triton_compile import assert_compiles  # noqa: E402

# The subprocess's limit comes first (the test's own is longer): a few dozen compilations, minutes on a loaded CPU.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

FASTRG = """
from attnzoo.kernels.triton import fastrg

def table_meta(n, k, m):
    (bn, rn), (bk, rk), (bm, rm) = (fastrg._table_steps(length) for length in (n, k, m))
    return {"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_M": bm, "ROWS_N": rn, "ROWS_K": rk, "ROWS_M": rm}

def steps(bh, n, k, m):
    return {"STEPS_BH": fastrg._steps(bh), "STEPS_N": fastrg._steps(n), "STEPS_K": fastrg._steps(k),
            "STEPS_M": fastrg._steps(m), "BLOCK": fastrg.BLOCK_SLOTS}

# fp32 memberships, rates and totals; int32 cumulative tables. The padding masks are torch.bool (*u1) and their
# counts int64 (`valid.sum(-1, keepdim=True)`); without them the wrapper passes the row rates and rates instead.
TABLES = {"ROW_OUT": "*i32", "CLUSTER_OUT": "*i32", "KEY_OUT": "*i32", "QV_OUT": "*i32", "KV_OUT": "*i32"}
PADDED = dict(TABLES, QV_W="*u1", QV_TOTAL="*i64", KV_W="*u1", KV_TOTAL="*i64")
# (n, k, m, padded queries, padded keys, ones): one padded example of 12 heads (batch 1, and every head's rows in
# the first program: cluster_start 1), a batch of short unpadded sequences, query padding only.
for n, k, m, has_qv, has_kv, ones in [
    (1024, 128, 1024, True, True, ("batch", "cluster_start")),
    (64, 128, 64, False, False, ()),
    (512, 32, 2048, True, False, ()),
]:
    pointers = dict(PADDED if has_qv else TABLES)
    if has_qv and not has_kv:
        pointers.update(KV_W="*fp32", KV_TOTAL="*fp32")
    compile_kernel(fastrg._cumulative_units, dict(table_meta(n, k, m), HAS_QV=has_qv, HAS_KV=has_kv), pointers, ones)

# The pair ids: int32 (sentinel 2**31 - 1, stored less an i64 offset of 2**31) when every id is below 2**32, else
# int64 (sentinel 2**63 - 1, an i64 argument, and an offset of 0).
# The draw counts `ends` are fp64; the structural pairs are computed (StructuralPairs: `STRUCT` is then the `ends`
# placeholder) or given as int64 ids; with no padding mask the wrapper passes the int32 row table for it.
CUMS = {"SEED": "*i64", "ENDS": "*fp64", "ROW_CUM": "*i32", "CLUSTER_CUM": "*i32", "KEY_CUM": "*i32",
        "QV_CUM": "*i32", "KV_CUM": "*i32", "QUERY_VALID": "*i32", "KEY_VALID": "*i32", "STRUCT": "*fp64"}
# (ids, padded queries, padded keys, causal, structural pairs, ones): training with padding, a self loop and one
# global column (num_diagonals = num_columns = 1), and without padding; a causal decoder without structural pairs;
# given structural ids.
for ids, has_qv, has_kv, causal, structural, ones in [
    ("i32", True, True, False, "pairs", ("num_diagonals", "num_columns")),
    ("i32", False, False, False, "pairs", ()),
    ("i64", False, False, True, None, ()),
    ("i32", True, False, False, "ids", ()),
    ("i64", True, True, True, "pairs", ()),
]:
    pointers = dict(CUMS, OUT="*" + ids, sentinel=ids, id_offset="i64" if ids == "i32" else "i32")
    if has_qv:
        pointers["QUERY_VALID"] = "*u1"
    if has_kv:
        pointers["KEY_VALID"] = "*u1"
    if structural == "ids":
        pointers["STRUCT"] = "*i64"
    meta = dict(steps(24, 1024, 128, 1024), HAS_QV=has_qv, HAS_KV=has_kv, CAUSAL=causal, GIVEN=structural != "pairs")
    compile_kernel(fastrg._draw_pair_ids, meta, pointers, ones)

# The edge list: rows, columns and the per-head counts in the ids' dtype; flags torch.bool; the sort's order and
# the row pointers int64. A graph of at most 256 edge slots has one edge program.
for ids, ones in [("i32", ()), ("i64", ()), ("i32", ("edge_programs",))]:
    pointers = {"IDS": "*" + ids, "ORDER": "*i64", "ROWS": "*" + ids, "COLS": "*" + ids, "SAMPLED": "*u1",
                "DUPLICATE": "*u1", "ATTENDED": "*u1", "CROW": "*i64", "COUNTS": "*" + ids, "sentinel": ids,
                "id_offset": "i64" if ids == "i32" else "i32"}
    compile_kernel(fastrg._edge_list, {"STEPS_E": fastrg._steps(1 << 20), "BLOCK": fastrg.BLOCK_SLOTS}, pointers, ones)
"""

SPARSE = """
from attnzoo.kernels.triton import edgelist, spmm
from attnzoo.kernels.triton.launch import block_d

# The CSR products of SBM's straight-through estimator: int64 row pointers, the edge list's int32 or int64 columns.
# SDDMM of the paper variant: the flat queries and keys in the model's dtype, fp32 scores.
for cols, dtype, width in [("*i32", "*bf16", 64), ("*i64", "*fp32", 128)]:
    pointers = {"CROW": "*i64", "COLS": cols, "A": dtype, "B": dtype}
    meta = {"D": width, "BLOCK_D": block_d(width), "BLOCK_E": spmm.BLOCK_E}
    compile_kernel(spmm._csr_sddmm, meta, pointers)
# G @ x and G^T @ y: fp32 values and outputs; x and y fp32 memberships (the estimator's backward passes both, with
# the sampled edges' mask and the clip), or one of them (`spmm`, `spmm_t`: the other and its output are the values,
# an fp32 placeholder, and stride 0; no mask: the columns are its placeholder).
for cols, x, y, width in [("*i32", "*fp32", "*fp32", 128), ("*i64", "*fp32", "*fp32", 64),
                          ("*i32", "*bf16", None, 64), ("*i64", None, "*fp32", 128)]:
    estimator = x is not None and y is not None
    pointers = {"CROW": "*i64", "COLS": cols, "X": x or "*fp32", "Y": y or "*fp32",
                "MASK": "*u8" if estimator else cols}
    meta = {"D": width, "BLOCK_D": block_d(width), "BLOCK_E": spmm.BLOCK_E, "NEED_X": x is not None,
            "NEED_Y": y is not None, "HAS_MASK": estimator, "HAS_CLIP": estimator}
    compile_kernel(spmm._csr_spmm_pair, meta, pointers, floats=FLOATS | {"clip"})

# The edge attention as SBM runs it: int32 columns (int32 pair ids), an fp32 logit bias (its gradient needed), no
# edge weight (q is its placeholder), the dropout keep-mask as uint8, as the seed of the hashed mask (SBM's, in
# training) or absent (the columns are its placeholder), the global rows in the kernels with or without the padding
# mask (the row pointers are its placeholder) and with or without their hashed dropout (SEED).
given = object()
for width, keep, dtype, rows, table in [(64, "mask", "*bf16", 0, False), (64, None, "*bf16", 1, False),
                                        (64, "hash", "*bf16", 2, True), (128, None, "*fp32", 1, True),
                                        (64, "hash", "*bf16", 1, False)]:
    pointers = {"Q": dtype, "K": dtype, "V": dtype, "OUT": dtype, "DO": dtype, "DQ": dtype, "WEIGHT": dtype,
                "CROW": "*i64", "COLS": "*i32", "KEEP": {"mask": "*u8", "hash": "*i64", None: "*i32"}[keep],
                "KEY_MASK": "*u8" if table else "*i64", "SEED": "*i64"}
    seed = given if keep == "hash" and rows else None
    meta = edgelist._meta(width, given, None, given if keep else None, given if table else None, rows, seed,
                          keep == "hash")
    compile_kernel(edgelist._edge_fwd, meta, pointers, ints=("H",))
    compile_kernel(edgelist._edge_bwd, dict(meta, NEED_BIAS=True, NEED_WEIGHT=False), pointers, ints=("H",))
"""

SAMPLER = """
from attnzoo.kernels.triton import sampling

K = 20  # num_samples (the config's default): BLOCK_K = 32
MODES = {name: index for index, name in enumerate(sampling.SAMPLER_FUNCTIONS)}

# (function, sketch dtype, d, padding, seed, propose, noise, ones). The seed: an int64 tensor (training: drawn on
# the device), a host int (eval: the config's seed + layer, an i32 argument; an i64 one past 2**31), or absent (the
# placeholder 0: "topk", given noise). `example_step` is 1 with per-example counters (training) and 0 in eval;
# `num_global` 1 with a CLS token. The flat sketch (no sketch yet: (B, N, 1) fp32 zeros) has unit row strides.
CASES = [
    ("squared_inverse_log", "*bf16", 4, True, "*i64", True, False, ("example_step", "num_global")),
    ("squared_inverse_log", "*fp32", 4, True, "i32", True, False, ()),
    ("squared_inverse_log", "*bf16", 4, False, "i32", True, False, ("num_global",)),
    ("topk", "*bf16", 4, True, "i32", False, False, ("num_global",)),
    ("topk", "*fp32", 4, False, "i32", False, False, ()),
    ("inverse_log", "*bf16", 4, False, "i64", True, False, ("example_step",)),
    ("raw", "*fp32", 1, True, "*i64", True, False, ("example_step", "sq_n", "sk_n")),
    ("random", "*bf16", 4, True, "*i64", False, False, ("example_step",)),  # num_proposals = 0: the scan only
    ("squared_inverse_log", "*fp32", 4, False, "i32", False, True, ("example_step",)),  # the literal noise (tests)
]
for function, dtype, width, padded, seed, propose, noise, ones in CASES:
    pointers = {"QS": dtype, "KS": dtype, "KEY_VALID": "*u8" if padded else dtype, "SEED": seed,
                "NOISE": "*fp32" if noise else dtype, "IDX": "*i64", "VALID": "*u1"}
    meta = {"DS": width, "FUNCTION": MODES[function], "HAS_KEY_VALID": padded, "HAS_NOISE": noise,
            "PROPOSE": propose, "SEED_IN_MEMORY": seed == "*i64", "BLOCK_M": sampling._BLOCK_M,
            "BLOCK_N": sampling._BLOCK_N, "BLOCK_K": 32}
    compile_kernel(sampling._attentive_sample_kernel, meta, pointers, ones)
"""

INTERPOLATED = """
import triton

from attnzoo.kernels.triton import global_rows, interpolated

given = object()
compile_kernel(global_rows._real_neighbours, {"BLOCK": 1024},
               {"VALID": "*u8", "BEFORE": "*i32", "AFTER": "*i32", "REAL": "*i32"})

# (d, points, global keys, causal, reflect, padding, point logits, dropout keep, global rows in the kernels, dense
# dtype, gradient of the offsets): training with dropout (the slots' mask hashed from the seed KEEP, the global
# rows' from SEED; the first case a stored mask instead), training without dropout or eval (clamp and reflect,
# with and without padding), the linear weight mode (with dropout, its global rows' too; causal), its global rows
# with frozen offsets, d = 32.
CASES = [
    (64, 10, 1, False, False, True, False, True, True, "*bf16", True),
    (64, 10, 1, False, False, True, False, False, True, "*bf16", True),
    (64, 10, 1, False, True, True, False, False, True, "*bf16", True),
    (64, 10, 1, False, False, False, False, False, True, "*fp32", True),
    (64, 10, 1, False, False, True, True, True, True, "*bf16", True),
    (128, 10, 0, True, False, False, True, True, False, "*bf16", True),
    (64, 4, 2, False, False, True, True, False, True, "*fp32", False),
    (32, 10, 0, False, False, False, False, False, False, "*fp16", True),
]
for width, points, num_global, causal, reflect, padded, linear, keep, rows, dtype, need_offsets in CASES:
    selection = interpolated._Selection(
        num_global=num_global, causal=causal, reflect=reflect, query_offset=0, scale=width**-0.5, keep_scale=1.25,
        density=True, global_rows=rows, keep_threshold=3355444, keep_hash=keep and (width, linear) != (64, False),
    )
    meta = interpolated._meta(width, points, selection, given if padded else None, given if linear else None,
                              given if keep else None, given if keep and rows else None)
    # Absent inputs are the fp32 offsets (placeholders); dK and dV are one fp32 buffer, dQ q's dtype.
    pointers = {"Q": dtype, "K": dtype, "V": dtype, "OUT": dtype, "DO": dtype, "DQ": dtype,
                "KEEP": ("*i64" if selection.keep_hash else "*u8") if keep else "*fp32",
                "SEED": "*i64" if keep and rows else "*fp32"}
    if padded:
        pointers.update(BEFORE="*i32", AFTER="*i32", REAL="*i32")
    ones = ("sp_k", "sl_k", "sdp_k")  # the offsets' (and logits', gradients') last axis is contiguous
    compile_kernel(interpolated._interpolated_fwd,
                   dict(meta, P2=max(2, triton.next_power_of_2(points)), DENSITY=True), pointers, ones[:2])
    compile_kernel(interpolated._interpolated_bwd,
                   dict(meta, NEED_OFFSETS=need_offsets, NEED_LOGITS=linear), pointers, ones)
"""

MEMBERSHIPS = """
from attnzoo.kernels.triton import launch, memberships as mb

# (inputs' dtype, parameters' dtype, padding, MLP shared by the heads, head size, clusters): the bf16 model as
# benchmarked (base size, 128 clusters); fp32 parameters with bf16 inputs (autocast), padded, per-head MLP; fp32,
# d = 32 and 20 clusters. The shared MLP reads nn.Linear's (out, in) weight (its `in` stride is 1), the per-head
# one an (H, in, out) weight (its `out` stride is 1).
SIZES = ("H", "D", "K")  # heads, head size, clusters: int arguments
BIAS = FLOATS | {"logit_bias"}
for x_dtype, p_dtype, padded, shared, width, clusters in [
    ("*bf16", "*bf16", False, True, 64, 128),
    ("*bf16", "*fp32", True, False, 64, 128),
    ("*fp32", "*fp32", True, True, 32, 20),
]:
    meta = {"BLOCK_R": mb.BLOCK_R, "BLOCK_D": launch.block_d(width), "BLOCK_K": launch.block_d(clusters),
            "HAS_VALID": padded}
    params = {"W1": p_dtype, "B1": p_dtype, "W2": p_dtype, "B2": p_dtype, "C": p_dtype}
    ones = ("sw_i",) if shared else ("sw_o",)
    # An absent mask's placeholder is the output (forward) or the input (backward).
    compile_kernel(mb._memberships_fwd, dict(meta, num_warps=mb.FWD_WARPS),
                   dict(params, X=x_dtype, VALID="*u8" if padded else "*fp32"), ones, floats=BIAS, ints=SIZES)
    compile_kernel(mb._memberships_bwd, dict(meta, num_warps=mb.BWD_WARPS),
                   dict(params, X=x_dtype, DX=x_dtype, VALID="*u8" if padded else x_dtype), ones, floats=BIAS,
                   ints=SIZES)
    # with the block matrix's part of dC (the fused call) and without (the parameters' gradients only)
    for extra in (True, False):
        compile_kernel(mb._sum_partials, {"BLOCK": mb.SUM_BLOCK, "HAS_EXTRA": extra}, {"OUT": p_dtype}, ints=SIZES)
    block = {"BLOCK_K": launch.block_d(clusters), "BLOCK_D": launch.block_d(width),
             "num_warps": mb._block_warps(clusters)}
    compile_kernel(mb._block_matrix_fwd, block, {"C": p_dtype}, ints=SIZES)
    # autograd hands the gradient of Ŝ over transposed (its last stride is K)
    compile_kernel(mb._block_matrix_bwd, block, {"C": p_dtype, "DC": p_dtype}, ints=SIZES)
    compile_kernel(mb._fastrg_weights, {"BLOCK_R": mb.BLOCK_R, "BLOCK_K": launch.block_d(clusters),
                                        "num_warps": mb.FWD_WARPS}, {}, ints=SIZES)
"""


def test_fastrg_sampler_kernels_compile_for_sm90(tmp_path):
    assert_compiles(FASTRG, tmp_path, timeout=600)


def test_csr_product_and_int32_edge_kernels_compile_for_sm90(tmp_path):
    assert_compiles(SPARSE, tmp_path, timeout=600)


def test_membership_network_kernels_compile_for_sm90(tmp_path):
    assert_compiles(MEMBERSHIPS, tmp_path, timeout=600)


def test_attentive_sampler_kernel_compiles_for_sm90(tmp_path):
    assert_compiles(SAMPLER, tmp_path, timeout=600)


@pytest.mark.timeout(1260)  # the largest kernels: minutes each on a loaded machine
def test_interpolated_attention_kernels_compile_for_sm90(tmp_path):
    assert_compiles(INTERPOLATED, tmp_path, timeout=1200)

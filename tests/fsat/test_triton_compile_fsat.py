"""FSAT's own Triton kernels (the pooled cross's elementwise steps, the index prediction and selection) compile for
the GPU (sm_90) on a machine without one, with every option.

As `tests/kernels/test_key_slot_compile.py` does for the key-slot kernels (the harness: `tests/triton_compile.py`):
the interpreter runs the kernels as numpy and cannot see what only the compiler rejects (loop-carried types,
constructs that do not lower).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from triton_compile import assert_compiles  # noqa: E402

BODY = """
from attnzoo.kernels.triton import fsat_index as triton_index
from attnzoo.kernels.triton import fsat_pooling as triton_pooling

types = {"floats": {"scale_value"}, "ints": {"N", "D", "H", "M", "S", "R"}}  # sizes named in capitals

block = {"BLOCK": triton_pooling.BLOCK, "num_warps": triton_pooling.NUM_WARPS}
for dtype in ("*bf16", "*fp32"):
    features = {"F1": dtype, "F2": dtype, "GRAD": dtype, "PAIRS": "*u8", "OUT": dtype, "DF1": dtype, "DF2": dtype}
    for kernel in (triton_pooling._pack_halves, triton_pooling._forward_spectrum, triton_pooling._finish_forward,
                   triton_pooling._complex_grad, triton_pooling._backward_products,
                   triton_pooling._finish_backward):
        pointers = dict(features, OUT="*fp32") if kernel is not triton_pooling._finish_forward else features
        compile_kernel(kernel, block, pointers, **types)
index = {"X": "*bf16", "W": "*bf16", "BIAS": "*bf16", "QUERY": "*i32", "VALID": "*u8", "REAL": "*i64",
         "DX": "*bf16"}
# (prior, scale per example, padding, exploration, heads per program): eval, training padded, shared predictor.
for prior, per_example, valid, random, heads in [(True, False, False, False, 1), (True, True, True, True, 1),
                                                 (False, False, False, True, 12)]:
    compile_kernel(triton_index._index_fwd, {
        "HEADS_PER_PROGRAM": heads, "BLOCK_R": triton_index.BLOCK_R, "BLOCK_K": triton_index.BLOCK_K,
        "BLOCK_S": 16, "HAS_PRIOR": prior, "SCALE_PER_EXAMPLE": per_example, "HAS_VALID": valid,
        "HAS_RANDOM": random, "num_warps": triton_index.NUM_WARPS,
    }, index, **types)
for shared, per_example in [(False, True), (True, False)]:
    compile_kernel(triton_index._index_bwd, {
        "SHARED": shared, "BLOCK_R": triton_index.BLOCK_R, "BLOCK_K": triton_index.BLOCK_K,
        "BLOCK_O": 64, "SCALE_PER_EXAMPLE": per_example, "num_warps": triton_index.NUM_WARPS,
    }, index, **types)
compile_kernel(triton_index._index_dweight, {
    "BLOCK_R": triton_index.DW_BLOCK_R, "BLOCK_K": triton_index.DW_BLOCK_K, "BLOCK_O": triton_index.DW_BLOCK_O,
    "num_warps": triton_index.NUM_WARPS,
}, dict(index, DW="*bf16", DB="*bf16"), **types)
"""


@pytest.mark.slow  # minutes of compilation: long for the default suite's budget
@pytest.mark.timeout(1260)
def test_fsat_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    assert_compiles(BODY, tmp_path, timeout=1200)

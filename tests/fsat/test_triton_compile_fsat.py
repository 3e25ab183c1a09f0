"""FSAT's own Triton kernels (the pooled cross's elementwise steps, the index prediction and selection) compile for
the GPU (sm_90) on a machine without one, with every option.

As `tests/kernels/test_key_slot_compile.py` does for the key-slot kernels: the interpreter runs the kernels as numpy
and cannot see what only the compiler rejects (loop-carried types, constructs that do not lower). Triton compiles
ahead of time for a named target without a GPU, in a subprocess because this process's kernels were built for the
interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnzoo.kernels.triton import fsat_index as triton_index
    from attnzoo.kernels.triton import fsat_pooling as triton_pooling

    FLOATS = {"scale_value"}
    INTS = {"N", "D", "H", "M", "S", "R"}  # sizes named in capitals, as the kernels' pointers are

    def compile_kernel(kernel, meta, pointers):
        options = {"num_warps": meta.pop("num_warps")}
        signature, constexprs = {}, {}
        for position, name in enumerate(kernel.arg_names):
            if name in meta:
                signature[name] = "constexpr"
                constexprs[(position,)] = meta[name]
            elif name.isupper() and name not in INTS:
                signature[name] = pointers.get(name, "*fp32")
            else:
                signature[name] = "fp32" if name in FLOATS else "i32"
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)

    block = {"BLOCK": triton_pooling.BLOCK, "num_warps": triton_pooling.NUM_WARPS}
    for dtype in ("*bf16", "*fp32"):
        features = {"F1": dtype, "F2": dtype, "GRAD": dtype, "PAIRS": "*u8", "OUT": dtype, "DF1": dtype,
                    "DF2": dtype}
        for kernel in (triton_pooling._pack_halves, triton_pooling._forward_spectrum, triton_pooling._finish_forward,
                       triton_pooling._complex_grad, triton_pooling._backward_products,
                       triton_pooling._finish_backward):
            pointers = dict(features, OUT="*fp32") if kernel is not triton_pooling._finish_forward else features
            compile_kernel(kernel, dict(block), pointers)
    index = {"X": "*bf16", "W": "*bf16", "BIAS": "*bf16", "QUERY": "*i32", "VALID": "*u8", "REAL": "*i64",
             "DX": "*bf16"}
    # (prior, scale per example, padding, exploration, heads per program): eval, training padded, shared predictor.
    for prior, per_example, valid, random, heads in [(True, False, False, False, 1), (True, True, True, True, 1),
                                                     (False, False, False, True, 12)]:
        compile_kernel(triton_index._index_fwd, {
            "HEADS_PER_PROGRAM": heads, "BLOCK_R": triton_index.BLOCK_R, "BLOCK_K": triton_index.BLOCK_K,
            "BLOCK_S": 16, "HAS_PRIOR": prior, "SCALE_PER_EXAMPLE": per_example, "HAS_VALID": valid,
            "HAS_RANDOM": random, "num_warps": triton_index.NUM_WARPS,
        }, index)
    for shared, per_example in [(False, True), (True, False)]:
        compile_kernel(triton_index._index_bwd, {
            "SHARED": shared, "BLOCK_R": triton_index.BLOCK_R, "BLOCK_K": triton_index.BLOCK_K,
            "BLOCK_O": 64, "SCALE_PER_EXAMPLE": per_example, "num_warps": triton_index.NUM_WARPS,
        }, index)
    compile_kernel(triton_index._index_dweight, {
        "BLOCK_R": triton_index.DW_BLOCK_R, "BLOCK_K": triton_index.DW_BLOCK_K, "BLOCK_O": triton_index.DW_BLOCK_O,
        "num_warps": triton_index.NUM_WARPS,
    }, dict(index, DW="*bf16", DB="*bf16"))
    print("compiled")
    """
)


@pytest.mark.slow  # minutes of compilation: long for the default suite's budget
@pytest.mark.timeout(1260)
def test_fsat_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, and leave no cache behind
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when this default is left unset
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=1200)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]

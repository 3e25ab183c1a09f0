"""The Triton kernels compile for the GPU (sm_90, the H100/H200 of the GPU runs), on a machine without one.

The interpreter tests check the kernels' arithmetic but run them as numpy, so they cannot see what only the compiler
rejects (a construct `triton.jit` does not lower, mismatched loop-carried types). Triton compiles ahead of time for a
named target with its bundled LLVM and ptxas, which needs no GPU. It runs in a subprocess because the interpreter
mode of this test process is decided when the kernels are imported.
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

    from attnzoo.kernels.triton import edgelist, gathered

    DTYPES = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OUT": "*bf16", "DO": "*bf16", "IDX": "*i64",
              "CROW": "*i64", "COLS": "*i64", "VALID": "*u8", "KEEP": "*u8"}

    def compile_kernel(kernel, meta, ones=()):
        # Launch options (num_warps) are compile options; every other key is a constexpr argument. A launch also
        # specialises an int argument equal to 1 to the constant 1: `ones` names those.
        options = {"num_warps": meta.pop("num_warps")}
        signature, constexprs = {}, {}
        for position, name in enumerate(kernel.arg_names):
            if name in meta or name in ones:
                signature[name] = "constexpr"
                constexprs[(position,)] = meta.get(name, 1)
            elif name.isupper():
                signature[name] = DTYPES.get(name, "*fp32")
            else:
                signature[name] = "fp32" if "scale" in name else "i32"
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)

    # Gathered slots as the families use them: A2-Former (two weighted entries, every option, d = 64 and 128; linear
    # logits), Smart Bird (one entry, validity only); edges with every option and with none.
    given, absent = object(), None
    for head_dim, entries, dot, options in (
        (64, 2, True, (given, given, given, given)),
        (128, 2, True, (given, given, given, given)),
        (64, 2, False, (given, absent, given, absent)),
        (64, 1, True, (absent, given, absent, absent)),
    ):
        meta = gathered._meta(head_dim, entries, dot, *options)
        compile_kernel(gathered._gathered_fwd, dict(meta))
        needs = {"NEED_WEIGHT": options[0] is given, "NEED_BIAS": options[2] is given}
        compile_kernel(gathered._gathered_bwd, dict(meta, **needs))
    # One query of one head (decoding a token): the grid decoding's cdiv then folds over constants.
    meta = gathered._meta(64, 1, True, absent, given, absent, absent)
    ones = ("num_heads", "num_queries")
    compile_kernel(gathered._gathered_fwd, dict(meta), ones)
    compile_kernel(gathered._gathered_bwd, dict(meta, NEED_WEIGHT=False, NEED_BIAS=False), ones)
    for head_dim, flag in ((64, True), (64, False), (128, True)):
        meta = edgelist._meta(head_dim, *(given if flag else absent for _ in range(3)))
        compile_kernel(edgelist._edge_fwd, dict(meta))
        compile_kernel(edgelist._edge_bwd, dict(meta, NEED_BIAS=flag, NEED_WEIGHT=flag))
    print("compiled")
    """
)


def test_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, and leave no cache behind
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when this default is left unset
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]

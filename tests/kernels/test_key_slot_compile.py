"""The key-slot attention kernels (FSAT) compile for the GPU (sm_90), on a machine without one, with every option.

As `test_triton_compile.py` does for the other kernels: the interpreter runs the kernels as numpy and cannot see what
only the compiler rejects (loop-carried types, constructs that do not lower). Triton compiles ahead of time for a
named target without a GPU, in a subprocess because this process's kernels were built for the interpreter.
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
    import itertools

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnzoo.kernels.triton import key_slots

    POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OUT": "*bf16", "DO": "*bf16", "DQ": "*bf16",
                "DK": "*bf16", "DV": "*bf16", "ORDER": "*i64", "CROW": "*i32", "QUERY": "*i32", "PAIRS": "*i32",
                "QUERIES": "*i32", "ORDER32": "*i32", "SKEEP": "*u8", "GKEEP": "*u8", "VALID": "*u8"}
    FLOATS = {"scale", "keep_scale", "inv_two_var", "norm"}
    INTS = {"H", "N", "S", "G0", "G", "R", "BH", "CHUNKS"}  # sizes named in capitals, as the kernels' pointers are

    def compile_kernel(kernel, meta, ones=()):
        # A launch specialises an int argument equal to 1 to the constant 1: `ones` names those.
        options = {"num_warps": meta.pop("num_warps")}
        signature, constexprs = {}, {}
        for position, name in enumerate(kernel.arg_names):
            if name in meta or name in ones:
                signature[name] = "constexpr"
                constexprs[(position,)] = meta.get(name, 1)
            elif name.isupper() and name not in INTS:
                signature[name] = POINTERS.get(name, "*fp32")
            else:
                signature[name] = "fp32" if name in FLOATS else "i32"
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)

    present = object()
    for head_dim, num_global, own, keeps, valid in itertools.chain(
        [(64, 1, True, True, True), (64, 0, False, False, False), (128, 2, False, True, False)],
        [(64, 20, True, False, True)],  # more global keys than one chunk of them
    ):
        settings = key_slots._Settings(
            num_graph_slots=4, num_global=num_global, own_global=own, scale=0.125, keep_scale=1.0,
            variance=512.0, normalized=False, truncate=True,
        )
        keep = present if keeps else None
        meta = settings.meta(head_dim, keep, keep, present if valid else None)
        ones = ("G",) if num_global == 1 else ()
        compile_kernel(key_slots._slots_fwd, dict(meta), ones)
        compile_kernel(key_slots._slots_bwd_rows, dict(meta, TRUNCATE=True), ones)
        compile_kernel(key_slots._slots_bwd_global, {
            "D": head_dim, "BLOCK_D": meta["BLOCK_D"], "BLOCK_Q": key_slots.BLOCK_Q,
            "CHUNK": key_slots.GLOBAL_CHUNK, "num_warps": key_slots.NUM_WARPS,
        }, ones)
        compile_kernel(key_slots._slots_bwd_keys, {
            "D": head_dim, "BLOCK_D": meta["BLOCK_D"], "BLOCK_K": key_slots.BLOCK_K,
            "HAS_GLOBAL": num_global > 0, "num_warps": key_slots.NUM_WARPS,
        }, ones)
    print("compiled")
    """
)


# The subprocess's own limit (900 s) must come first: 16 compilations take minutes on a loaded machine.
@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
@pytest.mark.timeout(960)
def test_key_slot_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, and leave no cache behind
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when this default is left unset
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]

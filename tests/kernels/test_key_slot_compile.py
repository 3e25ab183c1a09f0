"""The key-slot attention kernels (FSAT) compile for the GPU (sm_90), on a machine without one, with every option.

As `test_triton_compile.py` does for the other kernels (the harness: `tests/triton_compile.py`): the interpreter runs
the kernels as numpy and cannot see what only the compiler rejects (loop-carried types, constructs that do not
lower).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from triton_compile import assert_compiles  # noqa: E402

BODY = """
import itertools

from attnzoo.kernels.triton import key_slots

POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OUT": "*bf16", "DO": "*bf16", "DQ": "*bf16",
            "DK": "*bf16", "DV": "*bf16", "ORDER": "*i64", "CROW": "*i32", "QUERY": "*i32", "PAIRS": "*i32",
            "QUERIES": "*i32", "ORDER32": "*i32", "SKEEP": "*u8", "GKEEP": "*u8", "VALID": "*u8", "SEED": "*i64"}
FLOATS = {"scale", "keep_scale", "inv_two_var", "norm"}
INTS = {"H", "N", "S", "G0", "G", "R", "BH", "CHUNKS"}  # sizes named in capitals, as the kernels' pointers are
types = {"floats": FLOATS, "ints": INTS}

present = object()
# (head dim, global tokens, own global softmax, dropout masks, padding, global rows in the kernels): FSAT's CUDA path
# computes the global queries' rows in its kernels except beyond 16 global tokens, with their hashed dropout mask
# (SEED) in training.
for head_dim, num_global, own, keeps, valid, rows in itertools.chain(
    [(64, 1, True, True, True, False), (64, 0, False, False, False, False), (128, 2, False, True, False, False)],
    [(64, 20, True, False, True, False)],  # more global keys than one chunk of them
    [(64, 1, True, False, True, True), (128, 3, False, False, False, True)],  # the global rows in the kernels
    [(64, 1, True, True, True, True)],  # and in training with dropout (the masks hashed from the seed SKEEP = GKEEP)
):
    settings = key_slots._Settings(
        num_graph_slots=4, num_global=num_global, own_global=own, scale=0.125, keep_scale=1.0,
        variance=512.0, normalized=False, truncate=True, global_rows=rows, keep_threshold=1677722,
        keep_hash=keeps and rows,
    )
    keep = present if keeps else None
    meta = settings.meta(head_dim, keep, keep, present if valid else None, present if keeps and rows else None)
    ones = ("G",) if num_global == 1 else ()  # a launch specialises an int argument equal to 1 to the constant
    pointers = dict(POINTERS, SKEEP="*i64", GKEEP="*i64") if settings.keep_hash else POINTERS
    compile_kernel(key_slots._slots_fwd, meta, pointers, ones, **types)
    compile_kernel(key_slots._slots_bwd_rows, dict(meta, TRUNCATE=True), pointers, ones, **types)
    if not rows:  # (the global keys' reduction does not depend on the global rows)
        compile_kernel(key_slots._slots_bwd_global, {
            "D": head_dim, "BLOCK_D": meta["BLOCK_D"], "BLOCK_Q": key_slots.BLOCK_Q,
            "CHUNK": key_slots.GLOBAL_CHUNK, "num_warps": key_slots.NUM_WARPS,
        }, POINTERS, ones, **types)
    compile_kernel(key_slots._slots_bwd_keys, {
        "D": head_dim, "BLOCK_D": meta["BLOCK_D"], "BLOCK_K": key_slots.BLOCK_K,
        "HAS_GLOBAL": num_global > 0, "HAS_VALID": valid, "GLOBAL_ROWS": rows,
        "GLOBAL_DROPOUT": meta["GLOBAL_DROPOUT"], "num_warps": key_slots.NUM_WARPS,
    }, POINTERS, ones, **types)
"""


# The subprocess's own limit (900 s) must come first: 22 compilations take minutes on a loaded machine.
@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
@pytest.mark.timeout(960)
def test_key_slot_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    assert_compiles(BODY, tmp_path, timeout=900)

"""The gathered and edge-list kernels compile for the GPU (sm_90, the H100/H200 of the GPU runs), on a machine
without one (the harness: `tests/triton_compile.py`).

The interpreter tests check the kernels' arithmetic but run them as numpy, so they cannot see what only the compiler
rejects (a construct `triton.jit` does not lower, mismatched loop-carried types). Triton compiles ahead of time for a
named target with its bundled LLVM and ptxas, which needs no GPU.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from triton_compile import assert_compiles  # noqa: E402

BODY = """
from attnzoo.kernels.triton import edgelist, gathered

DTYPES = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OUT": "*bf16", "DO": "*bf16", "IDX": "*i64",
          "CROW": "*i64", "COLS": "*i64", "VALID": "*u8", "KEEP": "*u8", "SEED": "*i64"}

# Gathered slots as the families use them: A2-Former (two weighted entries, every option, d = 64 and 128; linear
# logits), Smart Bird (one entry, validity only); edges with every option and with none.
given, absent = object(), None
for head_dim, entries, dot, options in (
    (64, 2, True, (given, given, given, given)),
    (128, 2, True, (given, given, given, given)),
    (64, 2, False, (given, absent, given, absent)),
    (64, 1, True, (absent, given, absent, absent)),
):
    meta = gathered._meta(head_dim, entries, dot, *options, absent, 0, absent, False)
    compile_kernel(gathered._gathered_fwd, meta, DTYPES)
    needs = {"NEED_WEIGHT": options[0] is given, "NEED_BIAS": options[2] is given}
    compile_kernel(gathered._gathered_bwd, dict(meta, **needs), dict(DTYPES, DQ="*bf16"))  # dq in q's dtype
# Smart Bird's CUDA path: its global query's dense rows in the kernels, with and without the padding mask (the
# index is its placeholder), in training with attention dropout (the slots' and the rows' masks hashed from the
# seeds KEEP and SEED) and without; dq in q's dtype.
for table, seed in ((given, given), (absent, absent), (absent, given)):
    meta = gathered._meta(64, 1, True, absent, given, absent, given if seed else absent, table, 1, seed, bool(seed))
    pointers = dict(DTYPES, KEY_MASK="*u8" if table else "*i64", DQ="*bf16", KEEP="*i64" if seed else "*u8")
    compile_kernel(gathered._gathered_fwd, meta, pointers)
    compile_kernel(gathered._gathered_bwd, dict(meta, NEED_WEIGHT=False, NEED_BIAS=False), pointers)
# One query of one head (decoding a token): the grid decoding's cdiv then folds over constants.
meta = gathered._meta(64, 1, True, absent, given, absent, absent, absent, 0, absent, False)
ones = ("num_heads", "num_queries")
compile_kernel(gathered._gathered_fwd, meta, DTYPES, ones)
compile_kernel(gathered._gathered_bwd, dict(meta, NEED_WEIGHT=False, NEED_BIAS=False), dict(DTYPES, DQ="*bf16"), ones)
for head_dim, flag in ((64, True), (64, False), (128, True)):
    meta = edgelist._meta(head_dim, *(given if flag else absent for _ in range(3)), absent, 0, absent, False)
    # H: the heads of head-split inputs (an int argument)
    compile_kernel(edgelist._edge_fwd, meta, DTYPES, ints=("H",))
    # dq is written once per row, in q's dtype
    compile_kernel(edgelist._edge_bwd, dict(meta, NEED_BIAS=flag, NEED_WEIGHT=flag), dict(DTYPES, DQ="*bf16"),
                   ints=("H",))
    if flag:  # the padding edges' gradients, zeroed apart
        compile_kernel(edgelist._zero_padding_edges, {"BLOCK": edgelist.TAIL_BLOCK, "NEED_BIAS": True,
                                                      "NEED_WEIGHT": True}, DTYPES)
"""


def test_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    assert_compiles(BODY, tmp_path)

"""The Triton kernels compile for the GPU (sm_90, the H100/H200 of the GPU runs) on a machine without one: the
harness of the compile tests (`tests/kernels/test_*compile*.py`, `tests/fsat/test_triton_compile_fsat.py`).

The interpreter tests check the kernels' arithmetic but run them as numpy, so they cannot see what only the compiler
rejects (a construct `triton.jit` does not lower, mismatched loop-carried types, a dtype an op does not take). Triton
compiles ahead of time for a named target with its bundled LLVM and ptxas, which needs no GPU. The compilations run
in a subprocess because the interpreter mode of the test process is decided when the kernels are imported.

A test writes a script body that imports the kernels and calls `compile_kernel` (defined by [`PRELUDE`]) once per
variant, with the argument dtypes and the option combinations its Python wrapper launches it with, and hands the
body to [`assert_compiles`].
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

#: Defines `compile_kernel(kernel, meta, pointers, ones=(), floats=FLOATS, ints=())`, then the test's body runs.
PRELUDE = textwrap.dedent(
    '''
    import sys
    import time

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    TARGET = GPUTarget("cuda", 90, 32)
    #: scalar arguments that are fp32 unless a test names its own
    FLOATS = frozenset({"scale", "keep_scale", "alpha"})
    #: a launch marks a pointer 16-byte aligned (torch's allocations are): the compiler may vectorise its accesses
    ALIGNED = [["tt.divisibility", 16]]


    def compile_kernel(kernel, meta, pointers, ones=(), floats=FLOATS, ints=()):
        """Compile `kernel` for sm_90 as a launch with these arguments would.

        Args:
            kernel: a `triton.jit` function.
            meta (`dict`): the constexpr arguments by name, and the launch option `num_warps` (default 4).
            pointers (`dict`): the type of an argument by name where it is not the default: a pointer's element
                type (`"*bf16"`, `"*i64"`, `"*u1"` for a torch.bool tensor, `"*u8"` for one viewed as uint8), or a
                scalar's (`"i64"` for an integer outside int32).
            ones (names): int arguments a launch passes as 1, which it specialises to the constant 1.
            floats (names): fp32 scalar arguments.
            ints (names): int scalar arguments named in capitals (as pointers are).

        Any other argument named in capitals is an fp32 pointer; any other lower-case one an int32 scalar.
        """
        meta = dict(meta)
        options = {"num_warps": meta.pop("num_warps", 4)}
        signature, constexprs, attrs = {}, {}, {}
        for position, name in enumerate(kernel.arg_names):
            if name in meta or name in ones:
                signature[name] = "constexpr"
                constexprs[(position,)] = meta.get(name, 1)
            elif name in pointers:
                signature[name] = pointers[name]
            elif name.isupper() and name not in ints:
                signature[name] = "*fp32"
            else:
                signature[name] = "fp32" if name in floats else "i32"
            if signature[name].startswith("*"):
                attrs[(position,)] = ALIGNED
        unknown = (set(meta) | set(ones)) - set(kernel.arg_names)
        if unknown:
            raise TypeError(f"{kernel.__name__} has no argument {sorted(unknown)}")
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        start, cpu = time.perf_counter(), time.process_time()
        compiled = triton.compile(source, target=TARGET, options=options)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"{kernel.__name__}: {wall:.1f} s ({cpu:.1f} s CPU)", flush=True)
        return compiled

    '''
)


def assert_compiles(body: str, tmp_path, timeout: float = 600) -> None:
    """Run `PRELUDE + body` in a fresh Python without `TRITON_INTERPRET` and check that it gets through.

    Args:
        body (`str`): the script (dedented here) that compiles the kernels.
        tmp_path (`pathlib.Path`): Triton's cache for the run (it compiles for real, and leaves no cache behind).
        timeout (`float`, *optional*, defaults to 600): seconds; the test's own timeout must exceed it.
    """
    script = PRELUDE + textwrap.dedent(body) + '\nprint("compiled")\n'
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when this default is left unset
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout)
    print(result.stdout, end="")  # one line per compiled kernel, with its times (pytest -s shows them)
    if result.returncode != 0 or "compiled" not in result.stdout.splitlines()[-1:]:
        done = result.stdout.strip().splitlines()
        raise AssertionError(
            f"the sm_90 compilation failed (exit {result.returncode}) after {len(done)} kernels"
            f"{' (last: ' + done[-1] + ')' if done else ''}; stderr:\n{result.stderr[-4000:]}"
        )

"""What SBM attention asks of the device, counted on CPU through the CUDA code path: aten ops, host-device
synchronisations (each with the attnzoo line that asked for it), bytes written by ops and bytes saved for backward.

`attention_backend="triton"` under Triton's CPU interpreter takes the branches CUDA takes; what differs on CUDA by
design is set up too ([`cuda_policies`]). The tests hold SBM to adding no synchronisation to what the dense family
does (the model's own input check). A small stand-in for the shared proxy harness (`attnzoo.benchmarking.proxies`,
written on another branch).

Run as a script for the per-layer table at base width (`python tests/sbm/test_sbm_device_work.py --length 1024`;
the Triton launches are counted no-ops there unless `--real-kernels`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

#: ops that launch no kernel (allocations without a fill, metadata)
NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view"})
#: ops whose result size or value the host reads from the device (a synchronisation on CUDA)
SYNC_OPS = frozenset(
    {
        "nonzero",
        "_local_scalar_dense",
        "is_nonzero",
        "equal",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "masked_select",
        "bincount",
    }
)


def _is_view(func) -> bool:
    return any(ret.alias_info is not None and not ret.alias_info.is_write for ret in func._schema.returns)


def _sync_kind(func, args, kwargs) -> str | None:
    """The kind of host-device synchronisation an op makes on CUDA, or `None`."""
    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return name
    boolean_index = name in ("index", "index_put", "index_put_", "_index_put_impl_") and len(args) > 1
    if boolean_index and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None):
        return f"{name} (boolean index)"
    if name == "repeat_interleave" and kwargs.get("output_size") is None:
        repeats = args[0] if len(args) == 1 else args[1]
        if isinstance(repeats, torch.Tensor):
            return "repeat_interleave (tensor repeats)"
    return None


def _caller() -> str:
    """The innermost attnzoo line on the stack."""
    for frame in reversed(traceback.extract_stack()):
        if "attnzoo" in frame.filename or "/models/" in frame.filename:
            return f"{os.path.basename(frame.filename)}:{frame.lineno} {frame.line}"
    return "?"


@dataclass
class Work:
    """Counts of one recorded region."""

    ops: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)
    bytes_written: int = 0

    @property
    def num_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def num_syncs(self) -> int:
        return sum(self.syncs.values())


class DeviceWork(TorchDispatchMode):
    """Records every aten op that launches a kernel, and the synchronising ones with their caller."""

    def __init__(self) -> None:
        super().__init__()
        self.work = Work()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in NO_KERNEL or _is_view(func) or name in ("detach", "lift_fresh"):
            return out
        self.work.ops[name] += 1
        self.work.bytes_written += sum(
            t.numel() * t.element_size()
            for t in tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.layout == torch.strided
        )
        kind = _sync_kind(func, args, kwargs or {})
        if kind is not None:
            self.work.syncs[f"{kind} @ {_caller()}"] += 1
        return out


@contextlib.contextmanager
def saved_bytes() -> Iterator[list[int]]:
    """Bytes of the distinct storages autograd saves for backward inside the block (parameters excluded)."""
    seen: set[int] = set()
    total = [0]

    def pack(t: torch.Tensor):
        if not isinstance(t, torch.nn.Parameter):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


@contextlib.contextmanager
def counted_triton_kernels(stub: bool) -> Iterator[Counter]:
    """Counts every launch of attnzoo's Triton kernels; with `stub`, the launches are no-ops (their outputs stay as
    allocated: only the glue around the kernels is counted), but the fastRG sampler's, whose edge indices the glue
    reads (garbage indices would fail there)."""
    from attnzoo.kernels import triton as kernels

    launches: Counter = Counter()
    patched = []
    for module_name, names in LAUNCHED_KERNELS.items():
        module = getattr(kernels, module_name)
        for name in names:
            patched.append((module, name, getattr(module, name)))
            setattr(module, name, _Counted(name, patched[-1][2], launches, stub and module_name != "fastrg"))
    try:
        yield launches
    finally:
        for module, name, obj in patched:
            setattr(module, name, obj)


#: the kernels the host launches, by module of `attnzoo.kernels.triton` (the other jit functions run inside them)
LAUNCHED_KERNELS = {
    "edgelist": ("_edge_fwd", "_edge_bwd"),
    "fastrg": ("_cumulative_units", "_draw_pair_ids", "_edge_list"),
    "gathered": ("_gathered_fwd", "_gathered_bwd"),
    "spmm": ("_csr_sddmm", "_csr_spmm_pair"),
}


@contextlib.contextmanager
def cuda_policies() -> Iterator[None]:
    """What differs on CUDA by design, set up on CPU: the CPU-only index range checks of the kernels are not
    recorded (they read the device on CPU only). The fastRG sampler needs nothing: on the Triton path it reserves its
    slots with its budget on any device."""
    from attnzoo.kernels import dispatch

    def unrecorded(check):
        def run(*args, **kwargs):
            with _disable_current_modes():
                return check(*args, **kwargs)

        return run

    saved = (dispatch.check_edges, dispatch.check_gathered)
    dispatch.check_edges, dispatch.check_gathered = unrecorded(saved[0]), unrecorded(saved[1])
    try:
        yield
    finally:
        dispatch.check_edges, dispatch.check_gathered = saved


class _Counted:
    def __init__(self, name: str, kernel, launches: Counter, stub: bool) -> None:
        self.name, self.kernel, self.launches, self.stub = name, kernel, launches, stub

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches[self.name] += 1
            if not self.stub:
                with _disable_current_modes():
                    self.kernel[grid](*args, **kwargs)

        return launch


#: base width, one layer (issue 49's proxies)
BASE = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072, "num_hidden_layers": 1}
#: what the tests run at (the counts do not depend on the size)
TINY = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64, "num_hidden_layers": 1}


def build(family: str, length: int, overrides: dict, size: dict, dtype: torch.dtype):
    """A 1-layer model of `family` on the Triton path, and its vocabulary size."""
    from attnzoo.benchmarking import ModelSize
    from attnzoo.testing import family_by_name

    shape = ModelSize(**size)
    fam = family_by_name(family)
    config = fam.config_class(**{**shape.config_kwargs(length), "attention_backend": "triton", **overrides})
    torch.manual_seed(0)
    return fam.model_class(config).to(dtype), shape.vocab_size


def measure(
    family: str,
    length: int,
    overrides: dict,
    *,
    size: dict = BASE,
    dtype: torch.dtype = torch.bfloat16,
    stub: bool = True,
    batch: int = 1,
    padded: bool = False,
) -> dict:
    """Forward (eval, no grad), forward+backward (train) and saved bytes of a 1-layer model, after a warm-up step.

    Returns a dict with `forward` and `train` ([`Work`]), `saved` (bytes) and `launches` (Triton kernels).
    """
    model, vocab = build(family, length, overrides, size, dtype)
    inputs = {"input_ids": torch.randint(5, vocab, (batch, length), generator=torch.Generator().manual_seed(0))}
    if padded:
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[-1, length // 2 :] = 0
        inputs["attention_mask"] = mask
    result = {}
    with cuda_policies(), counted_triton_kernels(stub) as launches:
        # warm-up: caches, lazily built state (the fastRG slot budget's first read)
        model.train()
        _loss(model(**inputs)).backward()
        model.eval()
        with torch.no_grad():
            model(**inputs)
        launches.clear()
        with torch.no_grad(), DeviceWork() as rec:
            model(**inputs)
        result["forward"] = rec.work
        model.train()
        model.zero_grad()
        with DeviceWork() as rec:
            with saved_bytes() as saved:
                out = model(**inputs)
            _loss(out).backward()
        result["train"] = rec.work
        result["saved"] = saved[0]
        result["launches"] = dict(launches)
    return result


def _loss(out) -> torch.Tensor:
    loss = out.last_hidden_state.float().pow(2).mean()
    aux = getattr(out, "aux_loss", None)
    return loss if aux is None else loss + aux.float()


# ----- tests -----------------------------------------------------------------------------------------------------

SBM_CASES = [
    pytest.param(
        {"sampling_backend": "fastrg", "local_window": 4, "attention_probs_dropout_prob": 0.1, "sparsity_weight": 0.1},
        id="fastrg",
    ),
    pytest.param({"sampling_backend": "fastrg", "ste_variant": "paper", "num_global_tokens": 0}, id="fastrg-paper"),
    pytest.param({"sampling_backend": "bernoulli", "sparsity_weight": 0.1}, id="bernoulli-all-pairs"),
    pytest.param({"sampling_backend": "bernoulli", "ste_all_pairs": False, "local_window": 4}, id="bernoulli-sampled"),
]


@pytest.fixture(scope="module")
def dense_syncs() -> dict[str, Counter]:
    result = measure("dense_transformer", 24, {}, size=TINY, dtype=torch.float32, stub=False, batch=2, padded=True)
    return {phase: result[phase].syncs for phase in ("forward", "train")}


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CUDA: tests/gpu)")
@pytest.mark.parametrize("overrides", SBM_CASES)
def test_sbm_adds_no_device_sync(overrides, dense_syncs):
    pytest.importorskip("triton")
    result = measure("sbm", 24, overrides, size=TINY, dtype=torch.float32, batch=2, padded=True)
    for phase in ("forward", "train"):
        assert result[phase].syncs == dense_syncs[phase], phase
    if overrides["sampling_backend"] == "fastrg":
        assert result["launches"], "the attention reached the Triton kernels"


def test_the_counter_sees_the_syncs_it_must():
    x = torch.arange(6.0)
    with DeviceWork() as rec:
        x[x > 2]  # boolean index
        torch.unique(x)
        torch.bincount(x.long())
        torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3]))
        float(x.sum())
        torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3]), output_size=6)  # no sync
    kinds = Counter(site.split(" @ ")[0] for site in rec.work.syncs.elements())
    assert kinds["index (boolean index)"] == 1 and kinds["_unique2"] == 1 and kinds["bincount"] == 1
    assert kinds["_local_scalar_dense"] == 1
    assert kinds["repeat_interleave (tensor repeats)"] == 1


ROWS = {
    "dense": ("dense_transformer", {}),
    "sbm:fastrg-2%": ("sbm", {"sampling_backend": "fastrg", "membership_logit_bias": -2.6}),
    "sbm:bernoulli-2%": ("sbm", {"sampling_backend": "bernoulli", "membership_logit_bias": -2.6}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rows", nargs="*", default=list(ROWS))
    parser.add_argument("--real-kernels", action="store_true", help="run the Triton kernels (slow) instead of stubs")
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="list the ops and the sync sites")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import attnzoo  # noqa: F401

    dtype = torch.float32 if args.fp32 else torch.bfloat16
    results = {}
    for row in args.rows:
        family, overrides = ROWS[row]
        results[row] = measure(family, args.length, overrides, dtype=dtype, stub=not args.real_kernels)
    base = results.get("dense")
    print(f"N = {args.length}, {dtype}, 1 layer, width 768, 12 heads (CPU, CUDA code path)")
    print("| row | ops fwd | ops fwd+bwd | syncs fwd | syncs fwd+bwd | bytes written fwd+bwd | saved | launches |")
    print("|---|---|---|---|---|---|---|---|")
    for row, r in results.items():
        fwd, train = r["forward"], r["train"]
        extra = ""
        if base is not None and row != "dense":
            extra = f" (+{fwd.num_ops - base['forward'].num_ops} / +{train.num_ops - base['train'].num_ops})"
        saved = f"{r['saved'] / 1e6:.1f} MB" + (f" ({r['saved'] / base['saved']:.2f}x)" if base else "")
        written = f"{train.bytes_written / 1e6:.1f} MB" + (
            f" ({train.bytes_written / base['train'].bytes_written:.2f}x)" if base else ""
        )
        print(
            f"| {row} | {fwd.num_ops} | {train.num_ops}{extra} | {fwd.num_syncs} | {train.num_syncs} | {written} | "
            f"{saved} | {r['launches']} |"
        )
    if args.verbose:
        for row, r in results.items():
            print(f"\n## {row}")
            for phase in ("forward", "train"):
                print(f"{phase}: {sorted(r[phase].ops.items(), key=lambda kv: -kv[1])}")
                for site, count in r[phase].syncs.items():
                    print(f"  sync x{count}: {site}")


if __name__ == "__main__":
    main()

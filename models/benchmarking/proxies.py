"""CPU proxies of a family's GPU speed and memory, counted per encoder layer through the CUDA code path.

What makes a sparse family slow or memory-hungry on a GPU can be counted on a CPU, deterministically and in seconds
(the research note `gpu-performance.md` §3.1 and §6 calibrated these proxies against H100 / H200 runs):

- **aten ops per layer**, forward and forward+backward, over the dense family's: each small op costs about 40-60 µs
  of launch and host time on the GPU whatever its size, so the extra ops explain most of the sparse families'
  excess time;
- **device syncs** the attention adds (`nonzero`, boolean indexing and its `index_put` backward, `.item()` /
  `bool()` / `int()` of a tensor, `unique`, `bincount`, `repeat_interleave` with tensor repeats, tensors built from
  host data), each named with the attnzoo line that called it; [`host_copy_sites`] adds a static check for
  `torch.tensor(..., device=...)` and `.to(device)` in the attention code, which copy host data on CUDA only;
- **saved-for-backward bytes of the layer** over dense's, which predicted the GPU's peak-memory ratio at 16K within
  1-5%;
- **the largest single intermediate** (an op output) over the FFN activation `N x 4D`: it forbids `N x N`,
  `N x K x d` and `E x d` tensors; an SDPA call whose head dim is not a multiple of 8 counts with its `N x N` fp32
  scores, which SDPA's math kernel, the only one that takes such a head dim on CUDA, writes;
- **bytes written by the ops** over dense's (unfused fp32 and int64 chains), and the **Triton launches**
  (FlexAttention's compiled kernels included).

Method: one bare model with one encoder layer at base width ([`PROXY_SIZE`]; a small vocabulary so that no
embedding tensor is larger than the layer's), the CUDA code path (below), bf16, batch 1, an all-ones attention
mask. After one warm-up forward (caches filled, as in the benchmark), an [`~attnzoo.benchmarking.recorder.OpRecorder`]
records an eval forward without autograd (`fwd`) and a training forward+backward of the benchmark's loss
(`fwd_bwd`). "Per layer" is the whole one-layer model: its embeddings, input checks (which sync in dense too) and
loss are the dense family's as well, so the difference to dense is what the method adds. Modules that belong to the
method but not to the layer ([`APART_MODULES`]: Smart Bird's sketch network) are counted apart, and each of their
layers is held to a dense encoder layer's op count ([`module_ops`]).

On a machine without CUDA, `attention_backend="triton"` takes the CUDA code path on CPU tensors under Triton's
interpreter (`TRITON_INTERPRET=1` before the kernels are first imported): the proxy model runs it in place of the
row's backend (`"fast"` unless a variant names one), whose implementation on CUDA it is. [`cuda_code_path`] then stubs
the Triton launches (counted, no program runs) and steers the device-type choices a family still makes outside the
kernel layer to their CUDA branch ([`CUDA_BRANCHES`]). FlexAttention, the one choice where `"fast"` and `"triton"`
differ on CUDA (`attnzoo.kernels.dispatch.uses_flex_attention`: the Sparse Transformer's default), is answered as on
CUDA for the row's backend, and the FlexAttention call is a counted stand-in of its compiled kernels
([`~attnzoo.benchmarking.recorder.stubbed_flex_attention`]: one launch forward, two backward, saving what torch's
FlexAttention saves); its BlockMask is built in the warm-up forward, as in the benchmark. On CUDA the same code
counts the real run, with the row's own backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.attention import ZooAttention
from ..kernels import dispatch
from .recorder import (
    OpRecorder,
    sdpa_dropout_as_on_cuda,
    stubbed_flex_attention,
    stubbed_triton_launches,
    triton_interpreted,
)
from .rows import BenchModel, benchmark_models, make_inputs
from .settings import ModelSize
from .workload import hidden_loss

#: One encoder layer of base width (768, 12 heads of 64, FFN 3072). The vocabulary is small enough that the
#: embedding gradient (vocab x 768) stays below the FFN activation.
PROXY_SIZE = ModelSize(
    vocab_size=512, hidden_size=768, num_hidden_layers=1, num_attention_heads=12, intermediate_size=3072
)
#: The op counts are the same at N = 256 ... 1024 (measured); the saved-bytes ratio at 1024 predicted the GPU's at 16K.
PROXY_LENGTH = 1024
#: Length of the per-module op counts ([`module_ops`]): op counts do not depend on it, time does.
MODULE_LENGTH = 256
#: The rows measured by default: the dense family and each family's main GPU row (SBM at the issue's fastRG 2%
#: density; its default Bernoulli backend is a dense `N x N` method by design), and the Sparse Transformer's other
#: CUDA path (its default on CUDA is one FlexAttention call; `triton_kernels`: the reshapes into SDPA and attnzoo's
#: Triton edge kernel).
PROXY_ROWS = (
    "dense_transformer",
    "a2former",
    "fsat",
    "sbm:fastrg-2%",
    "smart_bird",
    "sparse_transformer",
    "sparse_transformer:triton_kernels",
)
#: Modules counted apart (suffixes of `named_modules` names) -> their attribute holding the layers: Smart Bird's
#: sketch network runs once per forward, before the layers, and is a small Transformer of its own.
APART_MODULES = {"encoder.sketch": "layers"}
#: The issue's targets (issue 49): extra aten ops per layer over dense, device syncs the method adds, the layer's
#: saved bytes over dense's (FSAT: 1.5), the largest intermediate over the FFN activation; a layer of a network
#: counted apart has no more ops than a dense encoder layer.
TARGETS = {"extra_ops_fwd": 15, "extra_ops_fwd_bwd": 30, "syncs": 0, "saved_ratio": 1.1, "largest_ratio": 1.0}
SAVED_RATIO_TARGETS = {"fsat": 1.5}


# ----- the CUDA code path on a CPU -----


#: Invariant checks of the kernel layer that read indices on the host on a CPU only (`if device.type == "cpu"`); on
#: CUDA they issue no op, so their ops are not recorded. `(module, function)` as the kernel dispatch calls them.
CPU_ONLY_CHECKS = (
    ("attnzoo.kernels.dispatch", "check_gathered"),
    ("attnzoo.kernels.dispatch", "check_edges"),
    ("attnzoo.kernels.dispatch", "check_key_slots"),
)


@contextlib.contextmanager
def _cpu_only_checks_unrecorded(recorder: OpRecorder) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for module_name, name in CPU_ONLY_CHECKS:
            module = importlib.import_module(module_name)
            check = getattr(module, name, None)
            if check is None:  # renamed or gone: its syncs, if any, show in the counts
                continue

            def unrecorded(*args: Any, check: Callable = check, **kwargs: Any) -> Any:
                with recorder.pause():
                    return check(*args, **kwargs)

            setattr(module, name, unrecorded)
            stack.callback(setattr, module, name, check)
        yield


#: Device-type choices a family still makes outside the kernel layer, steered to their CUDA branch on a CPU
#: (family -> context manager). An entry goes once the family picks its branch from `attention_backend`.
#: None today: every family picks its CUDA path from `attention_backend` in the kernel layer.
CUDA_BRANCHES: dict[str, Callable[[], contextlib.AbstractContextManager]] = {}


@contextlib.contextmanager
def _flex_choice_as_on_cuda(backend: str) -> Iterator[None]:
    """`uses_flex_attention` answers as on CUDA for the row's `backend` wherever the model asks it with the proxy's
    `"triton"` (patched in every attnzoo module that imported it by name)."""
    original = dispatch.uses_flex_attention

    def as_on_cuda(requested: str, device: torch.device, *dtypes: torch.dtype, head_dim: int) -> bool:
        requested = backend if requested == "triton" else requested
        return original(requested, torch.device("cuda"), *dtypes, head_dim=head_dim)

    package = __name__.split(".")[0]
    modules = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith(package + ".") and getattr(module, "uses_flex_attention", None) is original
    ]
    for module in modules:
        module.uses_flex_attention = as_on_cuda
    try:
        yield
    finally:
        for module in modules:
            module.uses_flex_attention = original


@contextlib.contextmanager
def cuda_code_path(
    recorder: OpRecorder, family: str | None, device: str = "cpu", backend: str = "fast"
) -> Iterator[None]:
    """The CUDA code path of `family` on `device`: on a CPU, Triton launches and FlexAttention stubbed into
    `recorder`, the CPU-only index checks unrecorded ([`CPU_ONLY_CHECKS`]), device-type choices taken as on CUDA
    ([`CUDA_BRANCHES`]) and the FlexAttention choice as on CUDA for the row's `backend` (the model itself runs
    `"triton"`, see the module docstring); on CUDA, the run as it is but for FlexAttention, the same counted
    stand-in (torch.compile refuses to run under a dispatch mode such as `recorder`, and eager FlexAttention would
    materialise every score)."""
    if torch.device(device).type != "cpu":
        with stubbed_flex_attention(recorder):
            yield
        return
    if not triton_interpreted():
        raise RuntimeError(
            "The CPU proxies take the Triton kernels' code path under Triton's interpreter: set TRITON_INTERPRET=1 "
            "in the environment before attnzoo's Triton kernels are first imported."
        )
    with contextlib.ExitStack() as stack:
        stack.enter_context(stubbed_triton_launches(recorder))
        stack.enter_context(stubbed_flex_attention(recorder))
        stack.enter_context(sdpa_dropout_as_on_cuda())
        stack.enter_context(_flex_choice_as_on_cuda(backend))
        stack.enter_context(_cpu_only_checks_unrecorded(recorder))
        if family in CUDA_BRANCHES:
            stack.enter_context(CUDA_BRANCHES[family]())
        yield


# ----- measuring -----


@dataclass
class ModeProxies:
    """The proxies of one mode: `fwd` (eval forward, no autograd) or `fwd_bwd` (training forward+backward).

    Args:
        ops: kernel-launching aten ops of the one-layer model, the modules counted apart excluded.
        ops_by_name: the same by op name.
        syncs: device syncs by `"<kind> at <attnzoo line>"`, the modules counted apart included.
        bytes_written: bytes written by those ops.
        largest_bytes / largest_op: the largest single op output of the whole run (modules apart included).
        sdpa_math_bytes: the largest fp32 `Nq x Nk` scores of an SDPA call whose head dim is not a multiple of 8
            (SDPA's math kernel, the only one that takes such a head dim on CUDA, writes them; 0 if none).
        launches: Triton launches by kernel (stubbed runs only).
        apart_ops: ops of each module counted apart.
    """

    ops: int
    ops_by_name: dict[str, int]
    syncs: dict[str, int]
    bytes_written: int
    largest_bytes: int
    largest_op: str
    sdpa_math_bytes: int
    launches: dict[str, int]
    apart_ops: dict[str, int]

    @classmethod
    def from_recorder(cls, recorder: OpRecorder, apart: tuple[str, ...]) -> ModeProxies:
        layer, everything = recorder.total(exclude=apart), recorder.total()
        math = [4 * scores for head_dim, scores in everything.sdpa if head_dim % 8]
        return cls(
            ops=layer.num_ops,
            ops_by_name=dict(sorted(layer.ops.items())),
            syncs=dict(sorted(everything.syncs.items())),
            bytes_written=layer.bytes_written,
            largest_bytes=everything.largest_bytes,
            largest_op=everything.largest_op,
            sdpa_math_bytes=max(math, default=0),
            launches=dict(sorted(everything.launches.items())),
            apart_ops={name: recorder.counts(name).num_ops for name in apart},
        )


@dataclass
class ModuleOps:
    """Op counts of one module run on its own ([`module_ops`]): `fwd` and `fwd_bwd`, and its SDPA head dims."""

    name: str
    fwd: int
    fwd_bwd: int
    sdpa_head_dims: list[int]


@dataclass
class LayerProxies:
    """The proxies of one benchmark row at one length (per encoder layer, see the module docstring).

    Args:
        row / family / length / dtype: what was measured.
        fwd / fwd_bwd: the proxies per mode.
        saved_bytes: bytes the encoder layer keeps for backward (unique storages, parameters excluded).
        ffn_bytes: the FFN activation, `N x intermediate_size` elements of `dtype`: the dense layer's largest tensor
            (below N = hidden_size, the FFN weight's gradient is, and this is its size: the limit of the largest
            intermediate is the larger of the two).
        layer_module: op counts of the encoder layer on its own (the reference of the modules counted apart).
        apart_layers: op counts of each layer of the modules counted apart, on its own.
    """

    row: str
    family: str | None
    length: int
    dtype: str
    fwd: ModeProxies
    fwd_bwd: ModeProxies
    saved_bytes: int
    ffn_bytes: int
    layer_module: ModuleOps | None = None
    apart_layers: list[ModuleOps] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LayerProxies:
        """The inverse of [`to_json`] (proxies written by the GPU command, read back for a report)."""
        fields = dict(data)
        for mode in ("fwd", "fwd_bwd"):
            fields[mode] = ModeProxies(**fields[mode])
        if fields.get("layer_module") is not None:
            fields["layer_module"] = ModuleOps(**fields["layer_module"])
        fields["apart_layers"] = [ModuleOps(**layer) for layer in fields.get("apart_layers", [])]
        return cls(**fields)


def proxy_rows(names: list[str] | tuple[str, ...] = PROXY_ROWS) -> list[BenchModel]:
    """The benchmark rows called `names` (family defaults and variants, built as the benchmark builds them)."""
    families = sorted({name.split(":")[0] for name in names})
    return benchmark_models(families, [], keep=list(names))


def build_proxy_model(
    row: BenchModel, size: ModelSize, length: int, dtype: torch.dtype, device: str, attention_dropout: float = 0.0
) -> tuple[nn.Module, str]:
    """The row's bare model at `size` in `dtype` on its CUDA code path, and the attention backend the row asks for.

    On a CPU the model runs `attention_backend="triton"` (CUDA's implementation of the row's backend, under Triton's
    interpreter; [`cuda_code_path`] takes the returned backend for the FlexAttention choice); on CUDA the row's own.
    `attention_dropout`: every attention module's dropout in training, as the config's `attention_probs_dropout_prob`
    sets it (the benchmark's rows have none).
    """
    model = row.build_on(size, length, device)
    if attention_dropout:
        for module in model.modules():
            if isinstance(module, ZooAttention):
                module.dropout = attention_dropout
    backend = getattr(model.config, "attention_backend", "fast")
    if hasattr(model.config, "attention_backend") and torch.device(device).type == "cpu":
        # Every attention module reads the backend from the config object it shares with the model.
        model.config.attention_backend = "triton"
    return model.to(device=device, dtype=dtype), backend


def apart_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules of `model` counted apart ([`APART_MODULES`]), by name."""
    return {
        name: module
        for name, module in model.named_modules()
        if any(name == path or name.endswith("." + path) for path in APART_MODULES)
    }


def apart_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers of the modules counted apart, by name (`"encoder.sketch.layers.0"`)."""
    layers = {}
    for name, module in apart_modules(model).items():
        attribute = next(attr for path, attr in APART_MODULES.items() if name == path or name.endswith("." + path))
        for index, layer in enumerate(getattr(module, attribute)):
            layers[f"{name}.{attribute}.{index}"] = layer
    return layers


def _loss(output: Any) -> torch.Tensor:
    loss = hidden_loss(output.last_hidden_state)
    if getattr(output, "aux_loss", None) is not None:
        loss = loss + output.aux_loss.float()
    return loss


def _record(
    model: nn.Module,
    inputs: dict,
    mode: str,
    scopes: dict[str, nn.Module],
    family: str | None,
    seed: int,
    backend: str,
) -> OpRecorder:
    """One recorded eval forward (`fwd`) or training forward+backward (`fwd_bwd`) of `model` on its CUDA path."""
    recorder = OpRecorder()
    model.train(mode == "fwd_bwd")
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    device = next(model.parameters()).device.type
    with cuda_code_path(recorder, family, device, backend), recorder, recorder.scoped(scopes):
        if mode == "fwd":
            with torch.no_grad():
                model(**inputs)
            return recorder
        with recorder.saving_hooks(list(model.parameters())):
            output = model(**inputs)
        _loss(output).backward()
    model.zero_grad(set_to_none=True)
    return recorder


def measure_layer_proxies(
    row: BenchModel,
    length: int = PROXY_LENGTH,
    *,
    size: ModelSize = PROXY_SIZE,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    module_length: int | None = MODULE_LENGTH,
    seed: int = 0,
    attention_dropout: float = 0.0,
) -> LayerProxies:
    """The proxies of one benchmark row ([`LayerProxies`]); `module_length=None` skips the per-module op counts;
    `attention_dropout` (in the training forward+backward) as in [`build_proxy_model`]."""
    if size.num_hidden_layers != 1:
        raise ValueError(f"The proxies are per layer: `size` must have one layer, got {size.num_hidden_layers}.")
    torch.manual_seed(seed)
    model, backend = build_proxy_model(row, size, length, dtype, device, attention_dropout)
    inputs = make_inputs(row, size, 1, length, device, seed)
    apart = apart_modules(model)
    layer = first_layer(model)
    # Warm-up of each mode's path (their lazily built patterns and caches; a family may take another path in
    # training, as the Sparse Transformer with attention dropout): measured, with it a second forward+backward counts
    # what the first one did.
    _record(model, inputs, "fwd", apart, row.family, seed, backend)
    _record(model, inputs, "fwd_bwd", apart, row.family, seed, backend)
    fwd = _record(model, inputs, "fwd", apart, row.family, seed, backend)
    fwd_bwd = _record(model, inputs, "fwd_bwd", {**apart, "layer": layer}, row.family, seed, backend)
    result = LayerProxies(
        row=row.name,
        family=row.family,
        length=length,
        dtype=str(dtype).removeprefix("torch."),
        fwd=ModeProxies.from_recorder(fwd, tuple(apart)),
        fwd_bwd=ModeProxies.from_recorder(fwd_bwd, tuple(apart)),
        saved_bytes=sum(fwd_bwd.saved.get("layer", {}).values()),
        ffn_bytes=max(length, size.hidden_size) * size.intermediate_size * torch.finfo(dtype).bits // 8,
    )
    del model
    if module_length is not None:
        module_length = min(module_length, length)
        model, backend = build_proxy_model(row, size, module_length, dtype, device, attention_dropout)
        small_inputs = make_inputs(row, size, 1, module_length, device, seed)
        layers = {"layer": first_layer(model), **apart_layers(model)}
        counted = module_ops(model, small_inputs, layers, row.family, seed, backend)
        result.layer_module = counted.pop("layer")
        result.apart_layers = list(counted.values())
    return result


def first_layer(model: nn.Module) -> nn.Module:
    """The first encoder layer of a zoo model."""
    return model.encoder.layers[0]


def module_ops(
    model: nn.Module,
    inputs: dict,
    modules: dict[str, nn.Module],
    family: str | None,
    seed: int = 0,
    backend: str = "fast",
) -> dict[str, ModuleOps]:
    """Op counts of each of `modules` run on its own, on the inputs it received in one forward of `model`: an eval
    forward, and a training forward+backward of `mean(output ** 2)` with every parameter of the module trainable
    (a frozen network counted apart trains when a head gives it labels); `backend` is the row's ([`cuda_code_path`]).
    """
    device = next(model.parameters()).device.type
    captured: dict[str, tuple[tuple, dict]] = {}
    handles = [
        module.register_forward_pre_hook(
            lambda module, args, kwargs, name=name: captured.setdefault(name, (args, kwargs)), with_kwargs=True
        )
        for name, module in modules.items()
    ]
    model.eval()
    capture = OpRecorder()  # entered: a stubbed kernel zero-fills only outputs allocated while recording
    try:
        with cuda_code_path(capture, family, device, backend), capture, torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    results = {}
    for name, module in modules.items():
        args, kwargs = captured[name]
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        trainable = [p.requires_grad for p in module.parameters()]
        module.requires_grad_(True)
        counts = {}
        try:
            for mode in ("fwd", "fwd_bwd"):
                recorder = OpRecorder()
                module.train(mode == "fwd_bwd")
                torch.manual_seed(seed)
                hidden, *rest = args
                with cuda_code_path(recorder, family, device, backend), recorder:
                    if mode == "fwd":
                        with torch.no_grad():
                            module(hidden, *rest, **kwargs)
                    else:
                        output = module(hidden.requires_grad_(True), *rest, **kwargs)
                        output = output[0] if isinstance(output, (tuple, list)) else output
                        output.float().pow(2).mean().backward()
                counts[mode] = recorder.total()
        finally:
            for parameter, flag in zip(module.parameters(), trainable, strict=True):
                parameter.requires_grad_(flag)
                parameter.grad = None
        results[name] = ModuleOps(
            name=name,
            fwd=counts["fwd"].num_ops,
            fwd_bwd=counts["fwd_bwd"].num_ops,
            sdpa_head_dims=sorted({head_dim for head_dim, _ in counts["fwd"].sdpa}),
        )
    return results

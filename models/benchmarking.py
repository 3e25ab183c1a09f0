"""Measuring code of `scripts/benchmark.py`: time, peak memory and saved-for-backward bytes of every family.

Everything that decides *how* a number is measured lives here, so it can be imported and tested; the script only
parses arguments and writes files. The methodology (docs: `research/performance.md` §3 and §5):

- **Modes**: `fwd` is inference (eval mode, no autograd); `fwd_bwd` is a training step (train mode, so sampling
  methods sample) on `mean(last_hidden_state ** 2)` plus any auxiliary loss. Dropout is 0 everywhere.
- **Levels**: `model` is the whole encoder (embeddings + layers); `layer` is its first encoder layer alone.
- **Time**: all models of one sequence length live in one process and are timed in interleaved round-robin rounds
  with a rotating start order, after warm-up steps. Each round gives every model a ratio to our dense family measured
  within that same round, so a noisy neighbour that slows one round slows numerator and denominator alike; the
  report is the median of these per-round ratios and their inter-quartile range. Threads are pinned and recorded,
  `/proc/loadavg` is recorded at start and end, and `runs > 1` repeats the whole sweep in fresh processes to expose
  run-to-run drift.
- **Peak memory**: on CUDA `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus the allocation
  before the step. On CPU a fresh subprocess per (model, length) resets the process high-water mark through
  `/proc/self/clear_refs` and reads `VmHWM - VmRSS` across one step; `MALLOC_MMAP_THRESHOLD_=65536` makes freed
  buffers go back to the OS so earlier steps do not hide later peaks. Gradient buffers are allocated before the
  measured step (parameters and their gradients are reported apart as `parameters_mb`), so the peak is what the
  step itself needs: activations and temporaries.
- **Saved-for-backward bytes**: unique storages packed by autograd (`torch.autograd.graph.saved_tensors_hooks`),
  parameters excluded. Exact and noise-free, so tests may assert on it.
- **Equivalence**: before timing, each family's fast path is compared with its `attention_backend="reference"` path
  on the same weights (outputs and parameter gradients, eval mode); speed-ups of a family that fails are flagged.

Run `python -m attnzoo.benchmarking memory-worker|timing-worker SETTINGS_JSON` only through :func:`run_benchmark`.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import datetime
import gc
import importlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .core.layers import EncoderLayer

SCHEMA_VERSION = 1
MODES = ("fwd", "fwd_bwd")
LEVELS = ("model", "layer")
REFERENCE_MODEL = "dense"
HF_BASELINES = ("bert-sdpa", "bert-eager", "bigbird", "longformer")
DEFAULT_HF_BASELINES = ("bert-sdpa", "bigbird", "longformer")
# Subprocess results are printed on one line behind this marker, so library warnings on stdout cannot corrupt them.
_RESULT_MARKER = "ATTNZOO_BENCHMARK_RESULT "
# Two runs whose median ratios differ by more than this factor are flagged (performance.md §5.3).
RUN_AGREEMENT = 1.15


@dataclass(frozen=True)
class ModelSize:
    """Shared size of every benchmarked model: the issue's 2-layer, width-256, 4-head encoder by default."""

    vocab_size: int = 8000
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 1024

    def config_kwargs(self, length: int) -> dict[str, Any]:
        """Config fields common to the zoo and to HF: size, dropout 0 (timing) and positions for `length`.

        `max_position_embeddings` follows the length (+2 because Longformer's RoBERTa-style positions start after
        the padding index) so that no model carries, and computes gradients for, a larger position table than
        the others.
        """
        return {
            **dataclasses.asdict(self),
            "max_position_embeddings": length + 2,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        }


@dataclass
class BenchmarkSettings:
    """Everything that defines a benchmark run (stored verbatim in the JSON output).

    Args:
        families: family names, model types or `attnzoo` subpackages to import; `None` means every registered one.
        hf_baselines: keys of :data:`HF_BASELINES` to add.
        lengths: sequence lengths run for every model.
        extra_lengths: longer lengths run for the zoo families only.
        rounds / warmup: timed rounds and untimed warm-up steps per (model, level, mode); `None` picks a device
            default (CPU 7 / 1, CUDA 20 / 10).
        threads: intra-op CPU threads (1 on shared machines: more threads amplify neighbours' noise).
        levels: `"model"` (the whole encoder) and/or `"layer"` (the first encoder layer on captured inputs).
        memory: on CPU, measure peak memory in a fresh subprocess per (model, length).
        memory_lengths: lengths to measure CPU peak memory at (`None` = all).
        memory_jobs: CPU memory subprocesses running at once (memory does not suffer from sharing the CPU).
        max_seconds_per_step: once a step of a model exceeds this, longer lengths of that model are skipped.
        runs: repeat the timing sweep in this many fresh processes (1 = in this process).
        check_equivalence: compare each family's fast path with its reference path before timing.
    """

    families: list[str] | None = None
    hf_baselines: list[str] = field(default_factory=lambda: list(DEFAULT_HF_BASELINES))
    lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096])
    extra_lengths: list[int] = field(default_factory=list)
    batch_size: int = 1
    rounds: int | None = None
    warmup: int | None = None
    threads: int = 1
    device: str = "cpu"
    dtype: str = "fp32"
    levels: list[str] = field(default_factory=lambda: ["model", "layer"])
    memory: bool = False
    memory_lengths: list[int] | None = None
    memory_jobs: int = 1
    max_seconds_per_step: float | None = 30.0
    runs: int = 1
    check_equivalence: bool = True
    check_length: int | None = None
    seed: int = 0
    cpu_affinity: list[int] | None = None
    size: ModelSize = field(default_factory=ModelSize)

    def __post_init__(self) -> None:
        if isinstance(self.size, dict):
            self.size = ModelSize(**self.size)
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"`device` must be 'cpu' or 'cuda', got {self.device!r}.")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"`dtype` must be 'fp32' or 'bf16', got {self.dtype!r}.")
        unknown = set(self.levels) - set(LEVELS) or set(self.hf_baselines) - set(HF_BASELINES)
        if unknown:
            raise ValueError(f"Unknown level or HF baseline: {sorted(unknown)}.")
        if not self.lengths or min(self.lengths + self.extra_lengths) < 1:
            raise ValueError("`lengths` must be a non-empty list of positive integers.")
        self.rounds = self.rounds or (20 if self.device == "cuda" else 7)
        self.warmup = self.warmup if self.warmup is not None else (10 if self.device == "cuda" else 1)

    @property
    def all_lengths(self) -> list[int]:
        """Lengths in the order they run: the common ones, then the families-only extra ones."""
        return sorted(set(self.lengths)) + sorted(set(self.extra_lengths) - set(self.lengths))

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype == "bf16" else torch.float32

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchModel:
    """One row of the benchmark: a zoo family (optionally a variant) or a transformers baseline.

    Args:
        name: row label (`"dense"`, `"sbm:fastrg-2%"`, `"hf:bert-sdpa"`).
        kind: `"family"` (runs the extra lengths) or `"hf"`.
        build: `build(size, length) -> nn.Module` returning a fresh model in eval mode.
        global_first_token: pass Longformer's `global_attention_mask` with global attention on token 0.
        family / variant / overrides: where a zoo row comes from (recorded in the JSON).
    """

    name: str
    kind: str
    build: Callable[[ModelSize, int], nn.Module]
    global_first_token: bool = False
    family: str | None = None
    variant: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "family": self.family,
            "variant": self.variant,
            "overrides": self.overrides,
        }


def resolve_families(names: list[str] | None, errors: dict[str, str] | None = None) -> list[Any]:
    """Registered families named by `names` (family name, model type or subpackage); `None` = all registered.

    Names not registered yet are imported as `attnzoo.<name>` first, which registers families still in development.
    A name that cannot be resolved raises `ValueError`, or, when `errors` is given, is recorded there and skipped
    (one unfinished family must not cost the whole run).
    """
    import attnzoo

    families = attnzoo.FAMILIES
    if names is None:
        return list(families.values())

    def find(name: str) -> Any | None:
        for family in families.values():
            package = family.config_class.__module__.rsplit(".", 1)[0]
            if name in (family.name, family.model_type, package, package.removeprefix("attnzoo.")):
                return family
        return None

    resolved = []
    for name in names:
        family = find(name)
        try:
            if family is None:
                try:
                    importlib.import_module(f"attnzoo.{name}")
                except Exception as err:  # noqa: BLE001 - a half-written family may raise anything on import
                    raise ValueError(
                        f"Unknown family {name!r}: not registered and `attnzoo.{name}` cannot be imported "
                        f"({type(err).__name__}: {err})."
                    ) from err
                family = find(name)
            if family is None:
                raise ValueError(f"Importing `attnzoo.{name}` registered no family called {name!r}.")
        except ValueError as err:
            if errors is None:
                raise
            errors[name] = str(err)
            continue
        if family not in resolved:
            resolved.append(family)
    return resolved


def family_variants(family: Any) -> dict[str, dict[str, Any]]:
    """The family package's optional `BENCHMARK_VARIANTS` (variant name -> config overrides)."""
    package = importlib.import_module(family.config_class.__module__.rsplit(".", 1)[0])
    return dict(getattr(package, "BENCHMARK_VARIANTS", {}) or {})


def _family_builder(family: Any, overrides: dict[str, Any]) -> Callable[[ModelSize, int], nn.Module]:
    def build(size: ModelSize, length: int) -> nn.Module:
        config = family.config_class(**{**size.config_kwargs(length), **overrides})
        return family.model_class(config).eval()

    return build


def _hf_builder(key: str) -> Callable[[ModelSize, int], nn.Module]:
    def build(size: ModelSize, length: int) -> nn.Module:
        from transformers import (
            BertConfig,
            BertModel,
            BigBirdConfig,
            BigBirdModel,
            LongformerConfig,
            LongformerModel,
        )

        common = size.config_kwargs(length)
        if key in ("bert-sdpa", "bert-eager"):
            config = BertConfig(**common, attn_implementation=key.removeprefix("bert-"))
            model = BertModel(config, add_pooling_layer=False)
        elif key == "bigbird":
            config = BigBirdConfig(**common, attention_type="block_sparse", block_size=64, num_random_blocks=3)
            model = BigBirdModel(config, add_pooling_layer=False)
        elif key == "longformer":
            model = LongformerModel(LongformerConfig(**common, attention_window=256), add_pooling_layer=False)
        else:
            raise ValueError(f"Unknown HF baseline {key!r}; choose from {HF_BASELINES}.")
        # The pooler is dropped because the zoo's `<Prefix>Model` has none; everything else is the stock model.
        return model.eval()

    return build


def benchmark_models(
    families: list[str] | None, hf_baselines: list[str], errors: dict[str, str] | None = None
) -> list[BenchModel]:
    """Rows of the benchmark: every family (plus its variants), then the HF baselines. Dense family comes first.

    `errors`, when given, collects the families that could not be loaded instead of raising.
    """
    rows = []
    for family in resolve_families(families, errors):
        rows.append(BenchModel(family.name, "family", _family_builder(family, {}), family=family.name))
        for variant, overrides in family_variants(family).items():
            rows.append(
                BenchModel(
                    f"{family.name}:{variant}",
                    "family",
                    _family_builder(family, overrides),
                    family=family.name,
                    variant=variant,
                    overrides=dict(overrides),
                )
            )
    for key in hf_baselines:
        rows.append(BenchModel(f"hf:{key}", "hf", _hf_builder(key), global_first_token=key == "longformer"))
    rows.sort(key=lambda row: row.name != REFERENCE_MODEL)
    return rows


def make_inputs(row: BenchModel, size: ModelSize, batch: int, length: int, device: str, seed: int) -> dict:
    """Identical random token ids (and an all-ones mask) for every model; Longformer also gets its global token."""
    generator = torch.Generator().manual_seed(seed + length)
    # Ids from 5 upwards avoid the special tokens (padding would change what some models compute).
    input_ids = torch.randint(5, size.vocab_size, (batch, length), generator=generator)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if row.global_first_token:
        global_mask = torch.zeros_like(input_ids)
        global_mask[:, 0] = 1
        inputs["global_attention_mask"] = global_mask
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def _hidden(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0]


def first_encoder_layer(model: nn.Module) -> nn.Module:
    """The first encoder layer: `encoder.layers[0]` in the zoo, `encoder.layer[0]` in BERT-like HF models."""
    encoder = model.encoder
    layers = getattr(encoder, "layers", None) or encoder.layer
    return layers[0]


class Workload:
    """One (model, level) at one length on one device: the module, its inputs and the timed step callables.

    At `level="layer"` the first encoder layer is replayed on the exact positional and keyword arguments it received
    during one full forward (captured by a forward pre-hook), which covers every model's private layer signature
    (BigBird's band masks, Longformer's global-attention flags) without re-implementing any of them.
    """

    def __init__(self, row: BenchModel, level: str, length: int, settings: BenchmarkSettings):
        self.row, self.level, self.length = row, level, length
        self.device = settings.device
        torch.manual_seed(settings.seed)
        self.model = row.build(settings.size, length).to(device=settings.device, dtype=settings.torch_dtype)
        self.inputs = make_inputs(row, settings.size, settings.batch_size, length, settings.device, settings.seed)
        self.notes: list[str] = []
        self.density: float | None = None
        with torch.no_grad():
            if level == "layer":
                captured: dict[str, Any] = {}

                def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
                    captured.setdefault("args", args)
                    captured.setdefault("kwargs", kwargs)

                self.module = first_encoder_layer(self.model)
                handle = self.module.register_forward_pre_hook(capture, with_kwargs=True)
                try:
                    output = self.model(**self.inputs)
                finally:
                    handle.remove()
                self.args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in captured["args"])
                self.kwargs = dict(captured["kwargs"])
            else:
                self.module = self.model
                output = self.model(**self.inputs)
        density = getattr(output, "attention_density", None)
        if density is not None:
            self.density = float(density.float().mean())
        if getattr(self.model, "attention_type", None) == "original_full":
            # HF BigBird silently switches itself to full attention below (5 + 2 * random blocks) * block_size.
            self.notes.append("BigBird fell back to full attention at this length")

    def _call(self, grad: bool) -> Any:
        if self.level == "model":
            return self.module(**self.inputs)
        hidden, *rest = self.args
        if grad:
            # The layer's input needs a gradient too: in a model the backward continues into the layer below.
            hidden = hidden.detach().requires_grad_(True)
        return self.module(hidden, *rest, **self.kwargs)

    def prepare(self, mode: str, keep_grads: bool = False) -> None:
        """Untimed set-up before a step: eval for the forward, training mode and no stale grads for fwd+bwd.

        Timing frees the gradients (`set_to_none`, as Trainer does). Memory measurements keep them allocated
        (zeroed) so that a step's peak is its activations and temporaries, not the parameter-sized gradient buffers
        every model of this size allocates alike (performance.md §5.1: parameters and gradients apart).
        """
        self.module.train(mode == "fwd_bwd")
        if mode == "fwd_bwd":
            self.module.zero_grad(set_to_none=not keep_grads)

    def step(self, mode: str) -> None:
        """One forward (no autograd) or one forward+backward of `mean(last_hidden_state ** 2)` (+ auxiliary loss)."""
        if mode == "fwd":
            with torch.no_grad():
                self._call(grad=False)
            return
        output = self._call(grad=True)
        loss = _hidden(output).float().pow(2).mean()
        aux_loss = getattr(output, "aux_loss", None)
        if isinstance(self.module, EncoderLayer):
            aux_loss = output[2]  # a zoo layer returns (hidden, weights, aux_loss, density)
        if aux_loss is not None:
            # Methods with an auxiliary loss (SBM's density term) pay its backward in real training too.
            loss = loss + aux_loss.float()
        loss.backward()

    def parameters_bytes(self) -> int:
        """Bytes of the measured module's parameters (their gradients take as much again)."""
        return sum(p.numel() * p.element_size() for p in self.module.parameters())

    def saved_for_backward_bytes(self) -> int:
        """Bytes autograd keeps for the backward of one training step (unique storages, parameters excluded)."""
        self.prepare("fwd_bwd")
        param_storages = {p.untyped_storage().data_ptr() for p in self.module.parameters()}
        seen: dict[Any, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            try:
                storage = tensor.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):
                # Sparse and other non-strided tensors have no single storage: count their elements once.
                key, nbytes = ("id", id(tensor)), tensor.numel() * tensor.element_size()
            if key not in param_storages and nbytes:
                seen[key] = nbytes
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = self._call(grad=True)
        del output
        self.module.zero_grad(set_to_none=True)
        return sum(seen.values())

    def close(self) -> None:
        self.model = self.module = self.inputs = self.args = self.kwargs = None


# --------------------------------------------------------------------------------------------------------------
# Timing and memory primitives
# --------------------------------------------------------------------------------------------------------------


def timed(step: Callable[[], None], device: str) -> float:
    """Seconds of one call: CUDA events around it (after draining the queue) or `perf_counter` on CPU."""
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    start_time = time.perf_counter()
    step()
    return time.perf_counter() - start_time


def cuda_peak_bytes(step: Callable[[], None]) -> int:
    """Peak CUDA allocation of one call above what was allocated before it."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _proc_status_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        match = re.search(rf"^{field_name}:\s+(\d+) kB", status.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field_name}.")
    return int(match.group(1))


def cpu_peak_bytes(step: Callable[[], None]) -> int:
    """Increase of the resident high-water mark during one call (Linux; needs `/proc/self/clear_refs`)."""
    gc.collect()
    with contextlib.suppress(OSError):
        # Hand freed heap pages back so the baseline RSS is the live data only.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # "5" resets VmHWM to the current RSS
    before = _proc_status_kib("VmRSS")
    step()
    return (_proc_status_kib("VmHWM") - before) * 1024


def loadavg() -> list[float] | None:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def apply_threads(settings: BenchmarkSettings) -> None:
    """Pin intra-op threads (and, if asked, CPU affinity) before any tensor work."""
    if settings.cpu_affinity:
        os.sched_setaffinity(0, settings.cpu_affinity)
    torch.set_num_threads(settings.threads)
    # Fails once inter-op work ran in this process (e.g. in tests); the value is then already fixed.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def summarize(values: list[float]) -> tuple[float, list[float]]:
    """Median and inter-quartile range `[q1, q3]` (a single value is its own range)."""
    if len(values) == 1:
        return values[0], [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), [q1, q3]


# --------------------------------------------------------------------------------------------------------------
# Equivalence check
# --------------------------------------------------------------------------------------------------------------


def check_equivalence(row: BenchModel, settings: BenchmarkSettings, length: int) -> dict[str, Any]:
    """Compare a family's fast path with `attention_backend="reference"` on the same weights (fp32, eval mode).

    Eval mode makes sampling methods deterministic; both outputs and every parameter gradient of
    `mean(last_hidden_state ** 2)` must agree within `atol + rtol * max|reference|`.
    """
    atol, rtol = 1e-4, 2e-3
    try:
        torch.manual_seed(settings.seed)
        fast = row.build(settings.size, length).to(settings.device)
        reference_config = copy.deepcopy(fast.config)
        reference_config.attention_backend = "reference"
        reference = type(fast)(reference_config).to(settings.device).eval()
        reference.load_state_dict(fast.state_dict())
        inputs = make_inputs(row, settings.size, 1, length, settings.device, settings.seed)
        outputs = []
        for model in (fast, reference):
            hidden = model(**inputs).last_hidden_state
            hidden.float().pow(2).mean().backward()
            grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
            outputs.append((hidden.detach(), grads))
        (out_fast, grads_fast), (out_ref, grads_ref) = outputs
        output_error = float((out_fast - out_ref).abs().max()) / (atol + rtol * float(out_ref.abs().max()))
        # Some gradients are zero in exact arithmetic (the key bias: softmax ignores a per-query constant), so the
        # absolute tolerance of each gradient scales with the largest gradient of the model, not its own.
        grad_scale = max((float(g.abs().max()) for g in grads_ref.values()), default=0.0)
        grad_error = 0.0
        for name, grad_ref in grads_ref.items():
            if name in grads_fast:
                diff = float((grads_fast[name] - grad_ref).abs().max())
                grad_error = max(grad_error, diff / (atol * grad_scale + rtol * float(grad_ref.abs().max()) + 1e-30))
        passed = output_error <= 1 and grad_error <= 1 and grads_fast.keys() == grads_ref.keys()
        return {
            "length": length,
            "passed": bool(passed),
            # error / tolerance: pass at <= 1
            "output_error": output_error,
            "grad_error": grad_error,
            "error": None,
        }
    except Exception as err:  # noqa: BLE001 - a broken family must not stop the benchmark of the others
        return {"length": length, "passed": False, "error": f"{type(err).__name__}: {err}"}


# --------------------------------------------------------------------------------------------------------------
# One timing sweep (one process)
# --------------------------------------------------------------------------------------------------------------


def _short_error(err: BaseException) -> str:
    return f"error: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


Task = tuple[tuple[str, str], str]  # ((model, level), mode)


def time_interleaved(
    workloads: dict[tuple[str, str], Workload], settings: BenchmarkSettings
) -> tuple[dict[Task, list[float]], dict[Task, float], dict[tuple[str, str], str]]:
    """Warm up every (workload, mode), then time them in `settings.rounds` round-robin rounds.

    Round `r` starts at task `r mod T`, which spreads "first after a pause" effects (caches, clock frequency) over
    all models. Returns per-task times (one per round), the slowest warm-up step per task, and the error of every
    workload that raised (e.g. out of memory); a failed workload is dropped from the remaining rounds.
    """
    tasks: list[Task] = [(key, mode) for key in workloads for mode in MODES]
    times: dict[Task, list[float]] = {task: [] for task in tasks}
    warm: dict[Task, float] = {}
    failed: dict[tuple[str, str], str] = {}

    def run(task: Task) -> float | None:
        key, mode = task
        if key in failed:
            return None
        workload = workloads[key]
        try:
            workload.prepare(mode)
            return timed(lambda: workload.step(mode), settings.device)
        except Exception as err:  # noqa: BLE001 - e.g. out of memory at this length; the others go on
            failed[key] = _short_error(err)
            if settings.device == "cuda":
                torch.cuda.empty_cache()
            return None

    for task in tasks:
        for _ in range(settings.warmup):
            seconds = run(task)
            if seconds is not None:
                warm[task] = max(warm.get(task, 0.0), seconds)
    # A garbage collection inside a timed step would charge one model for everybody's garbage (as timeit does).
    gc.collect()
    gc.disable()
    try:
        for round_index in range(settings.rounds):
            shift = round_index % max(len(tasks), 1)
            for task in tasks[shift:] + tasks[:shift]:
                seconds = run(task)
                if seconds is not None:
                    times[task].append(seconds)
    finally:
        gc.enable()
    return times, warm, failed


def _memory_of(workload: Workload, settings: BenchmarkSettings) -> dict[str, Any]:
    """In-process memory numbers of a workload: saved-for-backward bytes, and on CUDA the peak per mode."""
    result: dict[str, Any] = {"saved_bytes": workload.saved_for_backward_bytes()}
    if settings.device == "cuda":
        peaks = {}
        for mode in MODES:
            workload.prepare(mode, keep_grads=True)
            peaks[mode] = cuda_peak_bytes(lambda mode=mode: workload.step(mode))
        result["cuda_peak_bytes"] = peaks
    return result


def timing_sweep(settings: BenchmarkSettings, log: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Time every (model, level, mode) at every length in interleaved rounds; raw per-round data, JSON-able.

    All models of one length live in this process together (fresh instances per length: HF BigBird switches itself
    to full attention for short inputs, and position tables follow the length). Returns
    `{"loadavg_start", "loadavg_end", "entries": [...]}`; an entry has `model`, `level`, `length`, `status`, `notes`,
    `loadavg`, `warmup_s`, `times_s` and `ratios` (per mode, one value per round), `saved_bytes`,
    `cuda_peak_bytes`, `parameters_bytes` and `attention_density`.
    """
    apply_threads(settings)
    rows = benchmark_models(settings.families, settings.hf_baselines, errors={})  # the parent reports failures
    start_load = loadavg()
    too_slow: set[tuple[str, str]] = set()
    entries = []
    for length in settings.all_lengths:
        active = [row for row in rows if length in settings.lengths or row.kind == "family"]
        workloads: dict[tuple[str, str], Workload] = {}
        length_entries: dict[tuple[str, str], dict[str, Any]] = {}
        for row in active:
            for level in settings.levels:
                key = (row.name, level)
                entry = {"model": row.name, "level": level, "length": length, "status": "ok", "notes": []}
                length_entries[key] = entry
                if key in too_slow:
                    entry["status"] = "skipped: too slow"
                    continue
                try:
                    workloads[key] = Workload(row, level, length, settings)
                except Exception as err:  # noqa: BLE001 - record and keep benchmarking the other models
                    entry["status"] = _short_error(err)
                    continue
                entry["notes"] += workloads[key].notes
                entry["attention_density"] = workloads[key].density
                entry["parameters_bytes"] = workloads[key].parameters_bytes()
        length_load = loadavg()
        log(f"N={length}: timing {len(workloads)} workloads x {len(MODES)} modes, loadavg {length_load}")
        times, warm, failed = time_interleaved(workloads, settings)
        for key, entry in length_entries.items():
            entry["loadavg"] = length_load
            if key in failed:
                entry["status"] = failed[key]
            if entry["status"] != "ok":
                continue
            entry["times_s"] = {mode: times[key, mode] for mode in MODES}
            entry["warmup_s"] = {mode: warm.get((key, mode)) for mode in MODES}
            slowest = max(value for mode in MODES for value in [*times[key, mode], warm.get((key, mode), 0.0)])
            if settings.max_seconds_per_step is not None and slowest > settings.max_seconds_per_step:
                too_slow.add(key)
                entry["notes"].append(f"a step took {slowest:.1f} s: longer lengths skipped")
        for (_, level), entry in length_entries.items():
            reference = length_entries.get((REFERENCE_MODEL, level))
            if entry["status"] == "ok" and reference is not None and reference["status"] == "ok":
                # Same round, same conditions: the ratio cancels whatever slowed that round down.
                entry["ratios"] = {
                    mode: [t / r for t, r in zip(entry["times_s"][mode], reference["times_s"][mode], strict=True)]
                    for mode in MODES
                }
        for key, workload in workloads.items():
            if length_entries[key]["status"] == "ok":
                try:
                    length_entries[key].update(_memory_of(workload, settings))
                except Exception as err:  # noqa: BLE001
                    length_entries[key]["notes"].append(f"memory measurement failed ({_short_error(err)})")
            workload.close()
        workloads.clear()
        gc.collect()
        if settings.device == "cuda":
            torch.cuda.empty_cache()
        entries.extend(length_entries.values())
    return {"loadavg_start": start_load, "loadavg_end": loadavg(), "entries": entries}


def memory_worker(settings: BenchmarkSettings, model_name: str, length: int) -> dict[str, dict[str, int]]:
    """CPU peak memory of one model at one length, for each level and mode (run in a fresh process)."""
    apply_threads(settings)
    rows = benchmark_models(settings.families, settings.hf_baselines, errors={})
    row = next(row for row in rows if row.name == model_name)
    peaks: dict[str, dict[str, int]] = {}
    for level in settings.levels:
        workload = Workload(row, level, length, settings)
        peaks[level] = {}
        for mode in MODES:
            # One untimed step first: lazy initialisation (kernels, caches, gradient buffers) is not the step's
            # working set.
            workload.prepare(mode)
            workload.step(mode)
            workload.prepare(mode, keep_grads=True)
            peaks[level][mode] = cpu_peak_bytes(lambda workload=workload, mode=mode: workload.step(mode))
        workload.close()
        del workload
    return peaks


def _subprocess_env(settings: BenchmarkSettings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MALLOC_MMAP_THRESHOLD_": "65536",  # large buffers are mmapped and returned on free (see module doc)
            "OMP_NUM_THREADS": str(settings.threads),
            "MKL_NUM_THREADS": str(settings.threads),
            "TOKENIZERS_PARALLELISM": "false",
            "TRANSFORMERS_VERBOSITY": "error",
        }
    )
    return env


def _run_worker(kind: str, payload: dict[str, Any], settings: BenchmarkSettings) -> subprocess.Popen:
    command = [sys.executable, "-m", "attnzoo.benchmarking", kind, json.dumps(payload)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_subprocess_env(settings)
    )


def _collect_worker(process: subprocess.Popen) -> Any:
    stdout, stderr = process.communicate()
    for line in reversed(stdout.splitlines()):
        if line.startswith(_RESULT_MARKER):
            return json.loads(line[len(_RESULT_MARKER) :])
    tail = (stderr or stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"benchmark worker failed (exit {process.returncode}): {' | '.join(tail)}")


def cpu_memory(
    settings: BenchmarkSettings, jobs: list[tuple[str, int]], log: Callable[[str], None]
) -> dict[tuple[str, int], Any]:
    """Run :func:`memory_worker` for each (model, length) in fresh subprocesses, `settings.memory_jobs` at a time."""
    results: dict[tuple[str, int], Any] = {}
    pending = list(jobs)
    running: list[tuple[tuple[str, int], subprocess.Popen]] = []
    while pending or running:
        while pending and len(running) < max(settings.memory_jobs, 1):
            name, length = pending.pop(0)
            payload = {"settings": settings.to_json(), "model": name, "length": length}
            running.append(((name, length), _run_worker("memory-worker", payload, settings)))
        job, process = running.pop(0)
        try:
            results[job] = _collect_worker(process)
        except (RuntimeError, json.JSONDecodeError) as err:
            results[job] = _short_error(err)
        log(f"memory {job[0]} N={job[1]}: {results[job]}")
    return results


# --------------------------------------------------------------------------------------------------------------
# Whole benchmark: header, runs, aggregation
# --------------------------------------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def machine_header(settings: BenchmarkSettings) -> dict[str, Any]:
    """What the numbers depend on: hardware, threads, library versions, commit, date."""
    import transformers

    import attnzoo

    cpu_model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read(), re.MULTILINE)
            cpu_model = match.group(1).strip() if match else cpu_model
    except OSError:
        pass
    header = {
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": settings.threads,
        "torch_num_threads": torch.get_num_threads(),
        "device": settings.device,
        "dtype": settings.dtype,
        "gpu": None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attnzoo": attnzoo.__version__,
        "git_commit": _git("rev-parse", "HEAD"),
        # Uncommitted or untracked code changes the numbers; result folders elsewhere in the tree do not.
        "git_dirty": bool(_git("status", "--porcelain", "--", "models", "scripts", "pyproject.toml")),
        "date_start": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if settings.device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        header["gpu"] = {
            "name": properties.name,
            "memory_gib": round(properties.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "capability": list(torch.cuda.get_device_capability(0)),
        }
    return header


def _aggregate_mode(runs: list[dict[str, Any]], mode: str, tokens: int) -> dict[str, Any]:
    times = [t for run in runs for t in run.get("times_s", {}).get(mode, [])]
    ratios = [r for run in runs for r in run.get("ratios", {}).get(mode, [])]
    median_s, iqr_s = summarize(times)
    result: dict[str, Any] = {
        "ms": median_s * 1e3,
        "ms_iqr": [t * 1e3 for t in iqr_s],
        "tokens_per_s": tokens / median_s if median_s > 0 else None,
        "rounds": len(times),
        "ratio": None,
        "ratio_iqr": None,
        "run_ratios": [],
        "runs_agree": None,
    }
    if ratios:
        result["ratio"], result["ratio_iqr"] = summarize(ratios)
        run_medians = [statistics.median(run["ratios"][mode]) for run in runs if run.get("ratios")]
        result["run_ratios"] = run_medians
        result["runs_agree"] = max(run_medians) <= RUN_AGREEMENT * min(run_medians) if len(run_medians) > 1 else None
    return result


def aggregate(
    sweeps: list[dict[str, Any]],
    memory: dict[tuple[str, int], Any],
    settings: BenchmarkSettings,
) -> list[dict[str, Any]]:
    """Merge the runs' raw entries into one result per (model, level, length), with ratios to the dense family."""
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for sweep in sweeps:
        for entry in sweep["entries"]:
            grouped.setdefault((entry["model"], entry["level"], entry["length"]), []).append(entry)
    results = []
    for (name, level, length), runs in grouped.items():
        ok = [run for run in runs if run["status"] == "ok"]
        notes = sorted({note for run in runs for note in run["notes"]})
        failed = [run["status"] for run in runs if run["status"] != "ok"]
        if ok and failed:
            notes.append(f"{len(failed)} of {len(runs)} runs failed: {failed[0]}")
        result: dict[str, Any] = {
            "model": name,
            "level": level,
            "length": length,
            "status": "ok" if ok else runs[0]["status"],
            "notes": notes,
            "attention_density": ok[0].get("attention_density") if ok else None,
            "saved_for_backward_mb": None,
            "parameters_mb": None,
            "memory": None,
        }
        if ok:
            tokens = settings.batch_size * length
            for mode in MODES:
                result[mode] = _aggregate_mode(ok, mode, tokens)
            saved = [run["saved_bytes"] for run in ok if run.get("saved_bytes") is not None]
            result["saved_for_backward_mb"] = saved[0] / 2**20 if saved else None
            result["parameters_mb"] = ok[0].get("parameters_bytes", 0) / 2**20
            result["loadavg"] = [run.get("loadavg") for run in runs]
            cuda = [run["cuda_peak_bytes"] for run in ok if run.get("cuda_peak_bytes")]
            cpu = memory.get((name, length))
            if cuda:
                result["memory"] = {
                    "method": "cuda_max_memory_allocated",
                    **{f"{mode}_mb": statistics.median(c[mode] for c in cuda) / 2**20 for mode in MODES},
                }
            elif isinstance(cpu, dict) and level in cpu:
                result["memory"] = {
                    "method": "cpu_vmhwm",
                    **{f"{mode}_mb": cpu[level][mode] / 2**20 for mode in MODES},
                }
            elif isinstance(cpu, str):
                result["notes"].append(f"memory worker {cpu}")
        results.append(result)
    by_key = {(r["model"], r["level"], r["length"]): r for r in results}
    for result in results:
        reference = by_key.get((REFERENCE_MODEL, result["level"], result["length"]))
        result["saved_ratio"] = _ratio(result.get("saved_for_backward_mb"), reference, "saved_for_backward_mb")
        if result["memory"] is not None:
            ref_memory = reference.get("memory") if reference else None
            for mode in MODES:
                result["memory"][f"{mode}_ratio"] = _ratio(result["memory"][f"{mode}_mb"], ref_memory, f"{mode}_mb")
    results.sort(key=lambda r: (LEVELS.index(r["level"]), r["length"], r["model"] != REFERENCE_MODEL))
    return results


def _ratio(value: float | None, reference: dict[str, Any] | None, key: str) -> float | None:
    denominator = reference.get(key) if reference else None
    if value is None or not denominator or denominator <= 0:
        return None
    return value / denominator


def run_benchmark(settings: BenchmarkSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole benchmark: header, equivalence checks, timing run(s), CPU memory subprocesses, aggregation."""
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but CUDA is not available.")
    if settings.memory and settings.device == "cpu" and not os.path.exists("/proc/self/clear_refs"):
        raise RuntimeError("CPU peak memory needs Linux's /proc/self/clear_refs.")
    apply_threads(settings)
    header = machine_header(settings)
    header["loadavg_start"] = loadavg()
    load_errors: dict[str, str] = {}
    rows = benchmark_models(settings.families, settings.hf_baselines, load_errors)
    for error in load_errors.values():
        log(f"not benchmarked: {error}")
    if not any(row.name == REFERENCE_MODEL for row in rows):
        raise ValueError(f"The dense family ({REFERENCE_MODEL!r}) must be benchmarked: every ratio is relative to it.")
    models = []
    for row in rows:
        description = row.describe()
        description["equivalence"] = None
        if row.kind == "family" and settings.check_equivalence:
            check_length = settings.check_length or min(settings.lengths)
            description["equivalence"] = check_equivalence(row, settings, check_length)
            log(f"equivalence {row.name}: {description['equivalence']}")
        models.append(description)

    if settings.runs == 1:
        sweeps = [timing_sweep(settings, log)]
    else:
        # Each run in a fresh process: allocator state, thread pools and neighbours differ, which is the point.
        sweeps = []
        for run_index in range(settings.runs):
            log(f"timing run {run_index + 1}/{settings.runs} (subprocess)")
            process = _run_worker("timing-worker", {"settings": settings.to_json()}, settings)
            sweeps.append(_collect_worker(process))

    memory: dict[tuple[str, int], Any] = {}
    if settings.memory and settings.device == "cpu":
        lengths = settings.memory_lengths or settings.all_lengths
        jobs = sorted(
            {
                (e["model"], e["length"])
                for sweep in sweeps
                for e in sweep["entries"]
                if e["status"] == "ok" and e["length"] in lengths
            },
            key=lambda job: (job[1], job[0]),
        )
        memory = cpu_memory(settings, jobs, log)

    results = aggregate(sweeps, memory, settings)
    failed = {m["name"] for m in models if m["equivalence"] is not None and not m["equivalence"]["passed"]}
    for result in results:
        if result["model"] in failed:
            result["notes"].append("equivalence check FAILED: ratios not trustworthy")
    header["loadavg_end"] = loadavg()
    header["date_end"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    busy_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    loads = [load[0] for load in (header["loadavg_start"], header["loadavg_end"]) if load]
    # Load above the core count means other processes competed for the CPU during the run.
    header["load_warning"] = bool(loads and max(loads) > (busy_cores or 1))
    header["runs"] = [
        {"loadavg_start": sweep["loadavg_start"], "loadavg_end": sweep["loadavg_end"]} for sweep in sweeps
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "reference": REFERENCE_MODEL,
        "machine": header,
        "settings": settings.to_json(),
        "models": models,
        "unavailable": load_errors,
        "results": results,
    }


# --------------------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"


def _fmt_ratio(mode: dict[str, Any] | None) -> str:
    if not mode or mode.get("ratio") is None:
        return "–"
    low, high = mode["ratio_iqr"]
    text = f"{mode['ratio']:.2f} [{low:.2f}–{high:.2f}]"
    if mode.get("runs_agree") is False:
        text += " ⚠runs"
    return text


def markdown_report(report: dict[str, Any]) -> str:
    """A Markdown table per level: per length and model, times, ratios to dense (median [IQR]) and memory."""
    machine, settings = report["machine"], report["settings"]
    size = settings["size"]
    lines = [
        "# attnzoo benchmark",
        "",
        f"- machine: {machine['cpu_model']} ({machine['cpu_count']} cores), device {machine['device']}"
        + (f" ({machine['gpu']['name']})" if machine.get("gpu") else "")
        + f", {machine['dtype']}, {machine['threads']} thread(s)",
        f"- torch {machine['torch']}, transformers {machine['transformers']}, attnzoo {machine['attnzoo']}, "
        f"commit {(machine['git_commit'] or '?')[:10]}{' (dirty)' if machine['git_dirty'] else ''}",
        f"- {machine['date_start']} → {machine['date_end']}; loadavg {machine['loadavg_start']} → "
        f"{machine['loadavg_end']}" + (" **(load above the core count: noisy)**" if machine["load_warning"] else ""),
        f"- size: {size['num_hidden_layers']} layers, hidden {size['hidden_size']}, "
        f"{size['num_attention_heads']} heads, FFN {size['intermediate_size']}, vocab {size['vocab_size']}; "
        f"batch {settings['batch_size']}; {settings['rounds']} rounds after {settings['warmup']} warm-up; "
        f"{settings['runs']} run(s)",
        f"- ratios: median over rounds of (model time / `{report['reference']}` time in the same round) [IQR]; "
        "memory: peak above the pre-step baseline; saved: bytes autograd keeps for backward; density: attended "
        "fraction of (query, key) pairs (eval mode)",
        "",
    ]
    warnings = [f"- not benchmarked: **{name}** ({error})" for name, error in report.get("unavailable", {}).items()]
    failed = [m for m in report["models"] if m["equivalence"] is not None and not m["equivalence"]["passed"]]
    for model in failed:
        detail = model["equivalence"].get("error") or (
            f"output error {model['equivalence']['output_error']:.2g}, "
            f"gradient error {model['equivalence']['grad_error']:.2g} (× tolerance)"
        )
        warnings.append(f"- ⚠ **{model['name']}: fast path ≠ reference path** ({detail}); its ratios are marked †")
    if warnings:
        lines += [*warnings, ""]
    failed_names = {m["name"] for m in failed}
    for level in LEVELS:
        level_results = [r for r in report["results"] if r["level"] == level]
        if not level_results:
            continue
        lines += [
            f"## {'whole model' if level == 'model' else 'one encoder layer'}",
            "",
            "| N | model | fwd ms | fwd+bwd ms | fwd × dense | fwd+bwd × dense | peak MB fwd+bwd | mem × dense "
            "| saved MB | density | notes |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in level_results:
            mark = " †" if r["model"] in failed_names else ""
            notes = "; ".join(r["notes"]) if r["status"] == "ok" else "; ".join([r["status"], *r["notes"]])
            memory = r.get("memory") or {}
            lines.append(
                f"| {r['length']} | {r['model']}{mark} | {_fmt((r.get('fwd') or {}).get('ms'), 1)} "
                f"| {_fmt((r.get('fwd_bwd') or {}).get('ms'), 1)} | {_fmt_ratio(r.get('fwd'))} "
                f"| {_fmt_ratio(r.get('fwd_bwd'))} | {_fmt(memory.get('fwd_bwd_mb'), 1)} "
                f"| {_fmt(memory.get('fwd_bwd_ratio'))} | {_fmt(r.get('saved_for_backward_mb'), 1)} "
                f"| {_fmt(r.get('attention_density'), 3)} | {notes} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_report(report: dict[str, Any], path: str | Path) -> bool:
    """Log-log plot of time (fwd, fwd+bwd) and memory against N per model, dense family in bold black.

    Returns `False` (and writes nothing) when matplotlib is not installed (it is the optional `plots` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    levels = [level for level in LEVELS if any(r["level"] == level for r in report["results"])]
    memory_key = "memory"
    if not any(r.get("memory") for r in report["results"]):
        memory_key = "saved"  # without a peak measurement the saved-for-backward bytes are the memory proxy
    columns = [("fwd", "forward ms"), ("fwd_bwd", "forward+backward ms"), (memory_key, "peak MB (fwd+bwd)")]
    if memory_key == "saved":
        columns[2] = ("saved", "saved for backward MB")
    figure, axes = plt.subplots(len(levels), 3, figsize=(16, 4.8 * len(levels)), squeeze=False)
    names = list(dict.fromkeys(r["model"] for r in report["results"]))
    for row_index, level in enumerate(levels):
        for column_index, (key, title) in enumerate(columns):
            axis = axes[row_index][column_index]
            for name in names:
                points = []
                for r in report["results"]:
                    if r["model"] != name or r["level"] != level or r["status"] != "ok":
                        continue
                    if key in MODES:
                        value = r[key]["ms"]
                    elif key == "memory":
                        value = (r.get("memory") or {}).get("fwd_bwd_mb")
                    else:
                        value = r.get("saved_for_backward_mb")
                    if value is not None and value > 0:
                        points.append((r["length"], value))
                if not points:
                    continue
                points.sort()
                style = {"color": "black", "linewidth": 2.5, "zorder": 3} if name == REFERENCE_MODEL else {}
                linestyle = "--" if name.startswith("hf:") else "-"
                axis.plot(*zip(*points, strict=True), marker="o", linestyle=linestyle, label=name, **style)
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("sequence length N")
            axis.set_title(f"{'model' if level == 'model' else 'one layer'}: {title}")
            axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6) or 1)
    machine = report["machine"]
    figure.suptitle(
        f"attnzoo benchmark — {machine['device']} {machine['dtype']}, {machine['threads']} thread(s), "
        f"commit {(machine['git_commit'] or '?')[:10]}"
    )
    figure.tight_layout(rect=(0, 0.06, 1, 0.96))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def write_reports(report: dict[str, Any], output_dir: str | Path) -> dict[str, Path | None]:
    """Write `benchmark.json`, `benchmark.md` and (with matplotlib) `benchmark.png` into `output_dir`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path | None] = {
        "json": output_dir / "benchmark.json",
        "markdown": output_dir / "benchmark.md",
        "plot": output_dir / "benchmark.png",
    }
    paths["json"].write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    paths["markdown"].write_text(markdown_report(report) + "\n")
    if not plot_report(report, paths["plot"]):
        paths["plot"] = None
    return paths


def _worker_main(argv: list[str]) -> None:
    """Entry point of the subprocesses started by :func:`run_benchmark` (not a user interface)."""
    import attnzoo  # noqa: F401  (registers the landed families before the settings name them)

    kind, payload = argv[0], json.loads(argv[1])
    settings = BenchmarkSettings(**payload["settings"])
    if kind == "memory-worker":
        result: Any = memory_worker(settings, payload["model"], payload["length"])
    elif kind == "timing-worker":
        result = timing_sweep(settings)
    else:
        raise SystemExit(f"unknown worker {kind!r}")
    print(_RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    _worker_main(sys.argv[1:])

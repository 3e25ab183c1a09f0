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

- **Rows**: every family (and its `variants`), the floor `null_attention` (the dense family whose attention returns
  its values: no attention can go under it) and the transformers peers (BERT with SDPA or eager attention, BigBird,
  Longformer, ModernBERT).
- **CPU proxies of GPU speed and memory** (`proxies`, `proxy_report`): aten ops, device syncs, saved bytes, largest
  intermediate and bytes written per encoder layer, counted through the CUDA code path (`recorder`).

Modules: `settings` (run settings, schema constants), `rows` (families, their `variants`, the floor, HF baselines),
`floor`, `workload` (one model and level at one length), `timing`, `memory`, `equivalence`, `machine` (run header),
`aggregate`, `runner` (:func:`run_benchmark`), `report` (JSON, Markdown with the crossover table, plot),
`kernel_timing` (kernel micro-benchmarks against SDPA), `recorder`, `proxies`, `proxy_report` and `subprocesses` /
`__main__` (the worker processes). Run `python -m attnzoo.benchmarking memory-worker|timing-worker SETTINGS_JSON`
only through :func:`run_benchmark`.
"""

from .aggregate import RUN_AGREEMENT, aggregate, summarize
from .equivalence import check_equivalence
from .floor import FLOOR_MODEL, NullAttention, NullAttentionModel
from .kernel_timing import KERNEL_BENCHMARKS, kernel_markdown, register_kernel_benchmark, time_kernels
from .machine import apply_threads, loadavg, machine_header
from .memory import cpu_memory, cpu_peak_bytes, cuda_peak_bytes, memory_worker
from .proxies import PROXY_LENGTH, PROXY_ROWS, PROXY_SIZE, LayerProxies, measure_layer_proxies
from .proxy_report import ProxySummary, proxies_markdown, run_proxies, summarize_proxies, write_proxies
from .recorder import OpRecorder
from .report import crossover_table, markdown_report, plot_report, write_reports
from .rows import BenchModel, benchmark_models, family_variants, make_inputs, resolve_families
from .runner import run_benchmark
from .settings import (
    DEFAULT_HF_BASELINES,
    HF_BASELINES,
    LEVELS,
    MAX_DEFAULT_CHECK_LENGTH,
    MODES,
    REFERENCE_MODEL,
    SCHEMA_VERSION,
    BenchmarkSettings,
    ModelSize,
)
from .timing import time_interleaved, timed, timing_sweep
from .workload import Workload, first_encoder_layer

__all__ = [
    "DEFAULT_HF_BASELINES",
    "FLOOR_MODEL",
    "KERNEL_BENCHMARKS",
    "PROXY_LENGTH",
    "PROXY_ROWS",
    "PROXY_SIZE",
    "LayerProxies",
    "NullAttention",
    "NullAttentionModel",
    "OpRecorder",
    "ProxySummary",
    "crossover_table",
    "kernel_markdown",
    "measure_layer_proxies",
    "proxies_markdown",
    "register_kernel_benchmark",
    "run_proxies",
    "summarize_proxies",
    "time_kernels",
    "write_proxies",
    "HF_BASELINES",
    "LEVELS",
    "MAX_DEFAULT_CHECK_LENGTH",
    "MODES",
    "REFERENCE_MODEL",
    "RUN_AGREEMENT",
    "SCHEMA_VERSION",
    "BenchModel",
    "BenchmarkSettings",
    "ModelSize",
    "Workload",
    "aggregate",
    "apply_threads",
    "benchmark_models",
    "check_equivalence",
    "cpu_memory",
    "cpu_peak_bytes",
    "cuda_peak_bytes",
    "family_variants",
    "first_encoder_layer",
    "loadavg",
    "machine_header",
    "make_inputs",
    "markdown_report",
    "memory_worker",
    "plot_report",
    "resolve_families",
    "run_benchmark",
    "summarize",
    "time_interleaved",
    "timed",
    "timing_sweep",
    "write_reports",
]

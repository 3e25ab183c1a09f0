"""What defines a benchmark run: the constants of the JSON schema, the model size and the run settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

SCHEMA_VERSION = 1
MODES = ("fwd", "fwd_bwd")
LEVELS = ("model", "layer")
REFERENCE_MODEL = "dense_transformer"
HF_BASELINES = ("bert-sdpa", "bert-eager", "bigbird", "longformer", "modernbert")
DEFAULT_HF_BASELINES = ("bert-sdpa", "bigbird", "longformer", "modernbert")
#: longest default fast-vs-reference check (the check's reference path materialises every `(query, key)` pair)
MAX_DEFAULT_CHECK_LENGTH = 4096


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
        rows: keep only these rows (`"dense_transformer"`, `"sbm:fastrg-2%"`, `"hf:bert-sdpa"`); `None` keeps
            every row of the chosen families and baselines. The dense family must stay: every ratio is relative to it.
        lengths: sequence lengths run for every model.
        extra_lengths: longer lengths run for the zoo families (and the floor row) only.
        rounds / warmup: timed rounds and untimed warm-up steps per (model, level, mode); `None` picks a device
            default (CPU 7 / 1, CUDA 20 / 10).
        threads: intra-op CPU threads (1 on shared machines: more threads amplify neighbours' noise).
        levels: `"model"` (the whole encoder) and/or `"layer"` (the first encoder layer on captured inputs).
        memory: on CPU, measure peak memory in a fresh subprocess per (model, length).
        memory_lengths: lengths to measure peak memory at (`None` = all): the CPU subprocesses, and on CUDA the
            in-process peak (four extra steps per model and length).
        memory_jobs: CPU memory subprocesses running at once (memory does not suffer from sharing the CPU).
        max_seconds_per_step: once a step of a model exceeds this (the median of its timed rounds, warm-up left out),
            longer lengths of that model are skipped.
        time_budget_s: a timing sweep starts a length only while its budget, at the pace of the previous length
            (time per token), leaves room for it; the lengths it skips are recorded as `"skipped: time budget"`.
            `None` runs them all. Counted from the start of `run_benchmark`: the equivalence checks spend from it
            (each timing run in its own process, `runs > 1`, gets what they left). The first length always runs.
        runs: repeat the timing sweep in this many fresh processes (1 = in this process).
        check_equivalence: compare each family's fast path with its reference path before timing.
    """

    families: list[str] | None = None
    hf_baselines: list[str] = field(default_factory=lambda: list(DEFAULT_HF_BASELINES))
    rows: list[str] | None = None
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
    time_budget_s: float | None = None
    runs: int = 1
    check_equivalence: bool = True
    check_length: int | None = None
    seed: int = 0
    cpu_affinity: list[int] | None = None
    size: ModelSize = field(default_factory=ModelSize)

    def default_check_length(self) -> int:
        """Length of the fast-vs-reference check: `check_length`, else the shortest benchmarked length capped at
        `MAX_DEFAULT_CHECK_LENGTH` (the reference path is dense: at 32768 tokens its scores alone are 17 GB)."""
        if self.check_length is not None:
            return self.check_length
        return min(min(self.lengths), MAX_DEFAULT_CHECK_LENGTH)

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

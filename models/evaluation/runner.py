"""Train and evaluate one family at one input length with a fixed budget (the same for every family)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import get_inverse_sqrt_schedule, get_linear_schedule_with_warmup

from ..core.configuration import ZooConfig
from ..registry import FAMILIES
from ..training.data.mlm import bert_masking
from .tasks import FIRST_SYMBOL_ID, MASK_ID, PAD_ID, Example, TaskData

logger = logging.getLogger(__name__)

#: Learning-rate schedules after the linear warm-up (see [`Budget`]).
SCHEDULES = {
    "linear": lambda optimizer, budget: get_linear_schedule_with_warmup(optimizer, budget.warmup_steps, budget.steps),
    "rsqrt": lambda optimizer, budget: get_inverse_sqrt_schedule(optimizer, budget.warmup_steps),
}
#: `Budget.group_by_length`: batches are cut from groups of this many batches' examples (transformers'
#: `LengthGroupedSampler` sorts "mega-batches" of 50 batches the same way).
GROUP_BATCHES = 50
#: Shortest input length a run accepts: `[CLS]`, one token of the example and `[SEP]`.
MIN_LENGTH = 3


@dataclass(frozen=True)
class ModelSize:
    """Encoder size shared by every family of a comparison (the issue's CPU setting by default)."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 512


@dataclass(frozen=True)
class Budget:
    """
    Training budget, identical for every family and length of a comparison.

    Args:
        steps / batch_size: optimizer steps and examples per step (at least 1).
        learning_rate / warmup_steps / weight_decay: AdamW; the learning rate is reached after the linear warm-up,
            which ends within the training (and within the pretraining, when there is one).
        schedule: after the warm-up, `"linear"` decays to 0 at the last step; `"rsqrt"` decays as
            `sqrt(warmup_steps / step)`, LRA's "constant * linear_warmup * rsqrt_decay" (its base rate 0.05 is a
            peak of `0.05 / sqrt(warmup_steps)`: 1.58e-3 for ListOps, 5.59e-4 for Text).
        seed: model initialisation and data order (and the ListOps training stream; never the task's validation
            seed, see [`check_training_seed`]).
        eval_batch_size: validation batch size (does not change the result).
        max_grad_norm: gradient clipping.
        bf16: run forward passes (training and evaluation) under bfloat16 autocast; parameters, optimizer state and
            the loss reduction stay float32.
        group_by_length: cut each batch from examples of similar length (see [`training_batches`]), so that a batch
            of short reviews is not padded to the one long review among them; transformers' `group_by_length`.
        pretrain_steps: masked-language-model steps on the task's own training inputs before the classifier is
            fine-tuned from the pretrained encoder ("self-pretraining", Amos et al. 2023, who show that it lifts
            Transformers from scratch on LRA); 0 trains the classifier from scratch, LRA's protocol. The steps use the
            same batch size, learning rate, warm-up and schedule as fine-tuning.
        mlm_probability: share of the real (non-special) tokens the pretraining predicts (BERT's 15%).

    Raises:
        ValueError: A field is out of its range; the message names the field and the value.
    """

    steps: int = 600
    batch_size: int = 8
    learning_rate: float = 5e-4
    warmup_steps: int = 60
    weight_decay: float = 0.01
    seed: int = 0
    eval_batch_size: int = 32
    max_grad_norm: float = 1.0
    schedule: str = "linear"
    bf16: bool = False
    group_by_length: bool = False
    pretrain_steps: int = 0
    mlm_probability: float = 0.15

    def __post_init__(self) -> None:
        # Checked here, not where the values are used: a bad value would otherwise record an untrained model
        # (`steps=0`), fail with an unrelated message (`batch_size=0`) or fail only after the training.
        if self.schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {sorted(SCHEDULES)}, got {self.schedule!r}.")
        for name in ("steps", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        # The range of `transformers.set_seed` (numpy's seeds); torch alone would overflow only at 2**64, mid-run.
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"`seed` must be in [0, 2**32), got {self.seed}.")
        if self.pretrain_steps < 0:
            raise ValueError(f"`pretrain_steps` must be >= 0, got {self.pretrain_steps}.")
        # A warm-up longer than the training never reaches the recorded learning rate; pretraining shares it.
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"`warmup_steps` must be in [0, steps={self.steps}], got {self.warmup_steps}.")
        if self.pretrain_steps and self.warmup_steps > self.pretrain_steps:
            raise ValueError(
                f"`warmup_steps` must be <= pretrain_steps={self.pretrain_steps} (the pretraining warms up the same "
                f"way), got {self.warmup_steps}."
            )
        if not 0.0 < self.learning_rate < math.inf:
            raise ValueError(f"`learning_rate` must be a positive number, got {self.learning_rate}.")
        if not 0.0 <= self.weight_decay < math.inf:
            raise ValueError(f"`weight_decay` must be >= 0, got {self.weight_decay}.")
        # 0 would zero every gradient; `inf` is allowed and means no clipping.
        if not self.max_grad_norm > 0.0:
            raise ValueError(f"`max_grad_norm` must be > 0, got {self.max_grad_norm}.")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"`mlm_probability` must be in (0, 1), got {self.mlm_probability}.")


@dataclass(frozen=True)
class RunSpec:
    """
    One row of the table: a family at a length, with config overrides (an ablation) and a display label.

    Args:
        model_type: key of `attnzoo.registry.FAMILIES`.
        length: longest input in tokens (`[CLS]` and `[SEP]` included; at least `MIN_LENGTH`).
        overrides: config fields on top of the family defaults (e.g. `{"num_global_tokens": 0}`).
        label: row name in the reports; defaults to the model_type plus the overrides.

    Raises:
        ValueError: An unknown family, or a length below `MIN_LENGTH`.
    """

    model_type: str
    length: int
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        if self.model_type not in FAMILIES:
            raise ValueError(f"Unknown family {self.model_type!r}; registered: {sorted(FAMILIES)}.")
        # Every length of a `TaskPlan` becomes a RunSpec (`planned_runs`) before a task is built or a model trained.
        if self.length < MIN_LENGTH:
            raise ValueError(
                f"`length` must be >= {MIN_LENGTH} ([CLS], at least one token and [SEP]), got {self.length}."
            )
        if not self.label:
            suffix = ",".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))
            object.__setattr__(self, "label", self.model_type + (f" [{suffix}]" if suffix else ""))

    @property
    def key(self) -> str:
        """Identifies a run inside one results file (task + key), so an interrupted evaluation can resume."""
        return f"{self.label}@{self.length}"


def collate(examples: list[Example], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Right-pad a batch to its longest example: `input_ids`, `attention_mask` `(B, L)` and `labels` `(B,)`, on
    `device`."""
    longest = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), longest), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), longest), dtype=torch.long)
    for row, (ids, _) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    labels = torch.tensor([label for _, label in examples])
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}


def training_batches(
    stream: Iterator[Example], batch_size: int, group_by_length: bool = False, seed: int = 0
) -> Iterator[list[Example]]:
    """Endless training batches of `batch_size` examples, taken from `stream` in order.

    With `group_by_length`, the examples of every `GROUP_BATCHES` consecutive batches are sorted by length, cut into
    batches and those batches come in a random order (seeded by `seed`): each example is still seen once per pass
    of the stream, but a batch is padded to the longest of similar examples instead of the longest of a random draw.
    """
    if not group_by_length:
        while True:
            yield list(itertools.islice(stream, batch_size))
    rng = random.Random(seed)
    while True:
        group = sorted(itertools.islice(stream, batch_size * GROUP_BATCHES), key=lambda example: len(example[0]))
        batches = [group[start : start + batch_size] for start in range(0, len(group), batch_size)]
        rng.shuffle(batches)
        yield from batches


def stored_budget(settings: dict[str, Any]) -> dict[str, Any]:
    """The budget a results file's `settings` were made with, every `Budget` field present: a field added later has
    the default that reproduces the runs made before it existed."""
    defaults = {item.name: item.default for item in dataclasses.fields(Budget)}
    return {**defaults, **settings["budget"]}


def check_training_seed(task: TaskData, budget: Budget) -> None:
    """Refuse a training stream that would repeat the validation set.

    Raises:
        ValueError: The task generates its validation examples from a seed (`task.info["validation_seed"]`, ListOps)
            and the budget's seed is that one: the training stream would be the validation examples, in order.
    """
    validation_seed = task.info.get("validation_seed")
    if validation_seed is not None and budget.seed == validation_seed:
        raise ValueError(
            f"The training seed {budget.seed} is the {task.name} task's validation seed: the model would train on "
            "the validation examples. Use another `seed`."
        )


def run_batches(task: TaskData, budget: Budget) -> Iterator[list[Example]]:
    """A run's endless training batches: the task's stream under the budget's seed, batch size and length grouping
    (the pretraining and the fine-tuning of a run each draw a fresh one, so both see the same order).

    Raises:
        ValueError: The budget's seed is the task's validation seed ([`check_training_seed`]).
    """
    check_training_seed(task, budget)
    return training_batches(task.train_stream(budget.seed), budget.batch_size, budget.group_by_length, budget.seed)


def model_config(task: TaskData, spec: RunSpec, size: ModelSize) -> ZooConfig:
    """The row's config on `task` (same size for every family; the task's protocol overrides, then the row's)."""
    family = FAMILIES[spec.model_type]
    fields = {
        **dataclasses.asdict(size),
        "vocab_size": task.vocab_size,
        "max_position_embeddings": max(spec.length, 512),
        "num_labels": task.num_labels,
        "pad_token_id": PAD_ID,
        **task.model_overrides,
        **spec.overrides,
    }
    return family.config_class(**fields)


def build_classifier(task: TaskData, spec: RunSpec, size: ModelSize) -> torch.nn.Module:
    """A freshly initialised `<Prefix>ForSequenceClassification` for the task."""
    return FAMILIES[spec.model_type].sequence_classification_class(model_config(task, spec, size))


def _autocast(device: torch.device, bf16: bool) -> torch.autocast:
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)


@torch.no_grad()
def evaluate(model: torch.nn.Module, examples: list[Example], batch_size: int, bf16: bool = False) -> dict[str, float]:
    """Accuracy and mean cross-entropy on `examples` (eval mode, on the model's device; batches in a fixed,
    length-sorted order)."""
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    correct, loss_sum = 0, 0.0
    for start in range(0, len(order), batch_size):
        batch = collate([examples[i] for i in order[start : start + batch_size]], device)
        labels = batch.pop("labels")
        with _autocast(device, bf16):
            logits = model(**batch).logits.float()
        loss_sum += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(-1) == labels).sum())
    return {"accuracy": correct / len(examples), "loss": loss_sum / len(examples)}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """`None` / `"auto"`: the first CUDA device when there is one, else the CPU; anything else as given."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def device_name(device: torch.device) -> str:
    """What a results record says the run ran on (`"cpu"`, `"cuda:0 (NVIDIA H100 80GB HBM3)"`)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def masked_batches(
    batches: Iterator[list[Example]], vocab_size: int, probability: float, seed: int, device: torch.device | str
) -> Iterator[dict[str, torch.Tensor]]:
    """Masked-language-model batches from classification batches: BERT's rule on the real tokens (not `[CLS]`,
    `[SEP]`, padding), random replacements among the task's symbols; the labels of the examples are dropped."""
    generator = torch.Generator().manual_seed(seed)
    for examples in batches:
        batch = collate(examples)
        ids = batch["input_ids"]
        input_ids, labels = bert_masking(
            ids, ids >= FIRST_SYMBOL_ID, probability, MASK_ID, (FIRST_SYMBOL_ID, vocab_size), generator
        )
        masked = {"input_ids": input_ids, "attention_mask": batch["attention_mask"], "labels": labels}
        yield {name: tensor.to(device, non_blocking=True) for name, tensor in masked.items()}


def optimize(
    model: torch.nn.Module,
    batches: Iterator[dict[str, torch.Tensor]],
    steps: int,
    budget: Budget,
    name: str,
    log_every: int = 25,
) -> dict[str, Any]:
    """`steps` AdamW steps of `model` on `batches` with `budget`'s learning rate, warm-up, schedule, clipping and
    precision (a run's pretraining and its fine-tuning both go through here).

    Returns:
        `curve` (mean training loss every `log_every` steps), `seconds` (wall time) and `tokens` (real tokens seen).

    Raises:
        FloatingPointError: A training loss is not finite.
    """
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=budget.learning_rate, weight_decay=budget.weight_decay)
    schedule = SCHEDULES[budget.schedule](optimizer, dataclasses.replace(budget, steps=steps))
    model.train()
    _synchronize(device)
    curve, window, tokens, start = [], [], 0, time.perf_counter()
    for step in range(1, steps + 1):
        batch = next(batches)
        tokens += int(batch["attention_mask"].sum())
        with _autocast(device, budget.bf16):
            loss = model(**batch).loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{name}: non-finite training loss at step {step}.")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), budget.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(float(loss.detach()))
        if step % log_every == 0 or step == steps:
            curve.append({"step": step, "loss": sum(window) / len(window)})
            window = []
            # Runs last minutes to hours on a CPU: the curve so far is the only sign of life until they end.
            logger.info(
                "%s: step %d/%d, training loss %.4f, %.0f s",
                name, step, steps, curve[-1]["loss"], time.perf_counter() - start,
            )  # fmt: skip
    _synchronize(device)
    return {"curve": curve, "seconds": time.perf_counter() - start, "tokens": tokens}


def train_and_evaluate(
    task: TaskData,
    spec: RunSpec,
    size: ModelSize,
    budget: Budget,
    log_every: int = 25,
    device: str | torch.device | None = "cpu",
) -> dict[str, Any]:
    """Train `spec`'s family on `task` for `budget.steps` steps (after `budget.pretrain_steps` masked-language-model
    steps on the task's training inputs, when set), then evaluate on the task's validation set.

    Args:
        device: where the model trains (`"auto"`: CUDA when available). Runs on two devices differ by
            floating-point order and by the devices' random streams (dropout masks, SBM's graph samples).

    Returns:
        A JSON-able record: accuracy, validation loss, the training-loss curve (mean over `log_every` steps), wall
        time of training, real (non-padding) training tokens per second, the parameter count and the device; with
        pretraining also its loss curve and wall time.

    Raises:
        ValueError: The task is encoded at another length, or the budget's seed is the task's validation seed
            ([`check_training_seed`]); both before a model is built.
    """
    if spec.length != task.length:
        raise ValueError(f"The task is encoded at length {task.length}, the run asks for {spec.length}.")
    check_training_seed(task, budget)  # before a model is built (`run_batches` checks again for its other callers)
    device = resolve_device(device)
    name = f"{spec.key} on {task.name}"
    torch.manual_seed(budget.seed)
    config = model_config(task, spec, size)
    family = FAMILIES[spec.model_type]
    model = family.sequence_classification_class(config).to(device)
    pretraining: dict[str, Any] = {}
    if budget.pretrain_steps:
        encoder = family.masked_lm_class(config).to(device)
        stream = masked_batches(
            run_batches(task, budget), task.vocab_size, budget.mlm_probability, budget.seed, device
        )
        pretraining = optimize(encoder, stream, budget.pretrain_steps, budget, f"{name} (pretraining)", log_every)
        # The classifier starts from the pretrained encoder; its head stays freshly initialised.
        model.model.load_state_dict(encoder.model.state_dict())
        del encoder
    trained = optimize(
        model, (collate(b, device) for b in run_batches(task, budget)), budget.steps, budget, name, log_every
    )
    metrics = evaluate(model, task.validation, budget.eval_batch_size, budget.bf16)
    record = {
        "task": task.name,
        "label": spec.label,
        "model_type": spec.model_type,
        "length": spec.length,
        "overrides": spec.overrides,
        "accuracy": metrics["accuracy"],
        "validation_loss": metrics["loss"],
        "train_seconds": trained["seconds"],
        "train_tokens_per_second": trained["tokens"] / trained["seconds"] if trained["seconds"] > 0 else math.nan,
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": device_name(device),
        "curve": trained["curve"],
    }
    if pretraining:
        record.update(pretrain_seconds=pretraining["seconds"], pretrain_curve=pretraining["curve"])
    return record

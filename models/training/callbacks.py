"""Callbacks and end-of-run outputs of the training scripts: the metrics JSON file and the training-curve plot."""

from __future__ import annotations

import json
import logging
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
LOG_HISTORY_FILE = "log_history.json"
PLOT_FILE = "training_curves.png"


class EpochSetterCallback(TrainerCallback):
    """Tell an epoch-aware collator (e.g. [`~attnzoo.training.MLMCollator`]) which epoch is starting."""

    def __init__(self, collator: Any):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        # `state.epoch` is fractional progress: a resumed run starts mid-epoch; a new epoch starts at a (rounded)
        # integer.
        self.collator.epoch = math.floor((state.epoch or 0.0) + 1e-6)


class GenerationLengthCallback(TrainerCallback):
    """
    Keep a seq2seq model's generation length as `max_new_tokens` alone. `Seq2SeqTrainer`'s prediction step fills the
    model's generation config with transformers' defaults (`max_length=20`); saved beside the run's
    `max_new_tokens`, that made every later `generate()` of the checkpoint warn that both were set. Cleared after each
    evaluation and prediction, before the checkpoint that follows is written.
    """

    def _clear(self, model: Any) -> None:
        generation = getattr(model, "generation_config", None)
        if generation is not None and generation.max_new_tokens is not None:
            generation.max_length = None

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self._clear(model)

    def on_predict(self, args, state, control, model=None, **kwargs):
        self._clear(model)


class StopAtStepCallback(TrainerCallback):
    """
    Stop training after global step `step` (after that step's checkpoint is written): splits a long run into
    sessions, e.g. on preemptible machines, and simulates an interruption in tests. Resume with
    `--resume_from_checkpoint last`.
    """

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_save = True
            control.should_training_stop = True
        return control


class TimeLimitCallback(TrainerCallback):
    """
    Stop training once `seconds` of wall time have passed since training began: a fixed time budget instead of a fixed
    step count, e.g. for a demo or a time-limited job. The model is then saved as usual, and a checkpoint is written
    where the run saves checkpoints at all (so that `--resume_from_checkpoint last` continues from the step it
    stopped at). `stopped` tells whether the budget ended the training before its last step.

    In a distributed run every process stops at the same step: each step the processes agree (one all-reduce of a
    flag) that one of them has run out of time, since clocks that disagree by a step would leave a process waiting for
    the others' gradients.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.stopped = False
        self._start: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()
        self.stopped = False

    def on_step_end(self, args, state, control, **kwargs):
        if self._start is None:
            return control
        out_of_time = time.perf_counter() - self._start >= self.seconds
        if args is not None and args.world_size > 1 and torch.distributed.is_initialized():
            flag = torch.tensor([float(out_of_time)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            out_of_time = bool(flag.item())
        # The step that completes the run's own budget ends it anyway: the limit stopped nothing then.
        last_step = control.should_training_stop or (state.max_steps > 0 and state.global_step >= state.max_steps)
        if out_of_time and not last_step:
            self.stopped = True
            control.should_training_stop = True
            if args is not None and args.save_strategy != "no":
                control.should_save = True
        return control


def finish_run(trainer: Any, metrics: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """
    Write the run's outputs (main process only): `metrics.json` (final metrics, data report, model info and
    environment), `log_history.json` (every logged value) and `training_curves.png`. A model loaded from a converted
    BERT / RoBERTa checkpoint passes its conversion report on, so the lineage (and the card's `base_model`) follows
    the model from run to run.

    Returns:
        The dictionary written to `metrics.json`.
    """
    payload = {
        "metrics": metrics,
        **(extra or {}),
        "global_step": trainer.state.global_step,
        "num_processes": trainer.args.world_size,
        "environment": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "transformers": transformers.__version__,
        },
    }
    if trainer.is_world_process_zero():
        out = Path(trainer.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / METRICS_FILE).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        (out / LOG_HISTORY_FILE).write_text(json.dumps(trainer.state.log_history, indent=2) + "\n")
        plot_training_curves(trainer.state.log_history, out / PLOT_FILE)
        source = ((extra or {}).get("model") or {}).get("source")
        if source is not None:
            from ..conversion import copy_report

            copy_report(source, out)
        logger.info("Metrics written to %s", out / METRICS_FILE)
    return payload


def plot_training_curves(log_history: list[dict[str, Any]], path: str | Path) -> Path | None:
    """
    Plot training loss, evaluation loss and evaluation metrics against the step into a PNG.

    Args:
        log_history: `trainer.state.log_history` (or the content of `log_history.json` / `trainer_state.json`).
        path: PNG file to write.

    Returns:
        The path written, or `None` when nothing was logged or matplotlib is not installed (then a message is logged).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'attnzoo[plots]'): no training-curve plot.")
        return None
    series: dict[str, tuple[list[float], list[float]]] = {}
    for entry in log_history:
        step = entry.get("step")
        if step is None:
            continue
        for key, value in entry.items():
            if key in ("step", "epoch") or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if _panel(key) is None:
                continue
            series.setdefault(key, ([], []))
            series[key][0].append(step)
            series[key][1].append(value)
    if not series:
        logger.info("Nothing logged to plot.")
        return None
    panels: dict[str, list[str]] = {}
    for key in series:
        panels.setdefault(_panel(key), []).append(key)
    order = [name for name in ("loss", "metrics", "learning rate") if name in panels]
    fig, axes = plt.subplots(1, len(order), figsize=(5 * len(order), 3.6), squeeze=False)
    for ax, name in zip(axes[0], order, strict=True):
        for key in panels[name]:
            steps, values = series[key]
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _panel(key: str) -> str | None:
    """Which panel a logged key goes to (keys may carry a `run:` prefix when several runs are compared)."""
    evaluation = key.startswith("eval_")
    base = (key[5:] if evaluation else key).rsplit(":", 1)[-1]
    if base.endswith(("runtime", "per_second", "flos")) or key.startswith("train_"):
        return None
    if base == "loss":
        return "loss"
    if base == "learning_rate" and not evaluation:
        return "learning rate"
    return "metrics" if evaluation else None


def setup_logging(training_args: Any) -> None:
    """Log to stderr (INFO on the main process, WARNING on the others), transformers and datasets included."""
    import datasets

    level = training_args.get_process_log_level()
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler()],
    )
    logging.getLogger("attnzoo").setLevel(level)
    logging.getLogger("__main__").setLevel(level)
    transformers.utils.logging.set_verbosity(level)
    datasets.utils.logging.set_verbosity(max(level, logging.WARNING))

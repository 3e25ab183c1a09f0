"""Training and evaluation helpers behind `scripts/run_mlm.py`, `run_glue.py`, `run_summarization.py` and `demo.py`.

The scripts stay thin: argument dataclasses and YAML/JSON recipes ([`arguments`]), data readers for the GLUE TSV
layouts, CNN/DailyMail `.story` files and PubMed JSON lines ([`data`]), offline metrics with the official definitions
([`metrics`]), model construction and warm starts ([`builders`]), and the callbacks, metrics file and training-curve
plot of a run ([`callbacks`]).
"""

from __future__ import annotations

from ..extras import require

require("train")

from .arguments import (  # noqa: E402
    ClassificationDataArguments,
    FineTuningArguments,
    MLMDataArguments,
    ModelArguments,
    SummarizationDataArguments,
    parse_arguments,
)
from .builders import build_model, load_tokenizer, resolve_checkpoint  # noqa: E402
from .callbacks import (  # noqa: E402
    EpochSetterCallback,
    GenerationLengthCallback,
    StopAtStepCallback,
    TimeLimitCallback,
    finish_run,
    plot_training_curves,
    setup_logging,
)
from .carry import carry_unloaded_tensors  # noqa: E402
from .data import (  # noqa: E402
    GLUE_TASKS,
    DataReport,
    GlueTask,
    MLMCollator,
    load_classification_splits,
    load_mlm_texts,
    load_summarization_splits,
    mask_dataset,
    read_cohan_jsonl,
    read_story,
    split_sentences,
    tokenize_pairs,
)
from .head_learning_rate import HeadLearningRateTrainer, new_head_parameters  # noqa: E402
from .metrics import classification_metrics, glue_metrics, rouge_scores, summary_metrics  # noqa: E402
from .run import start_run, train_and_evaluate  # noqa: E402

__all__ = [
    "GLUE_TASKS",
    "ClassificationDataArguments",
    "DataReport",
    "EpochSetterCallback",
    "FineTuningArguments",
    "GenerationLengthCallback",
    "GlueTask",
    "HeadLearningRateTrainer",
    "MLMCollator",
    "MLMDataArguments",
    "ModelArguments",
    "StopAtStepCallback",
    "SummarizationDataArguments",
    "TimeLimitCallback",
    "build_model",
    "carry_unloaded_tensors",
    "classification_metrics",
    "finish_run",
    "glue_metrics",
    "load_classification_splits",
    "load_mlm_texts",
    "load_summarization_splits",
    "load_tokenizer",
    "mask_dataset",
    "new_head_parameters",
    "parse_arguments",
    "plot_training_curves",
    "read_cohan_jsonl",
    "read_story",
    "resolve_checkpoint",
    "rouge_scores",
    "setup_logging",
    "start_run",
    "summary_metrics",
    "train_and_evaluate",
    "split_sentences",
    "tokenize_pairs",
]

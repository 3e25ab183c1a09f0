"""Data readers of the training scripts: GLUE (Hub or original TSV layouts), text classification, MLM corpora,
CNN/DailyMail (`.story` files, JSON lines, Hub) and PubMed (Cohan et al. JSON lines), plus the MLM collator.

Every reader checks columns before reading, refuses empty rows unless asked to skip them, and records how many
examples were dropped or truncated in a [`DataReport`], so no example is lost silently.

One module a job: [`records`] reads local tables and JSON lines and keeps the [`DataReport`] (with
[`tokenize_pairs`], shared by the scripts), [`classification`] GLUE and text classification, [`mlm`] MLM corpora
and masking, [`summarization`] CNN/DailyMail and PubMed, [`ectsum`] ECTSum's earnings-call transcripts.
"""

from __future__ import annotations

from .classification import (
    GLUE_TASKS,
    ClassificationSplits,
    GlueTask,
    load_classification_splits,
    normalize_task_name,
)
from .ectsum import EctsumRecord, read_ectsum
from .mlm import MLMCollator, load_mlm_texts, mask_dataset
from .records import JSON_SUFFIXES, TABLE_SUFFIXES, DataReport, read_records, tokenize_pairs
from .summarization import (
    SUMMARY_COLUMNS,
    load_summarization_splits,
    read_cohan_jsonl,
    read_story,
    split_sentences,
)

__all__ = [
    "GLUE_TASKS",
    "JSON_SUFFIXES",
    "SUMMARY_COLUMNS",
    "TABLE_SUFFIXES",
    "ClassificationSplits",
    "DataReport",
    "EctsumRecord",
    "GlueTask",
    "MLMCollator",
    "load_classification_splits",
    "load_mlm_texts",
    "load_summarization_splits",
    "mask_dataset",
    "normalize_task_name",
    "read_cohan_jsonl",
    "read_ectsum",
    "read_records",
    "read_story",
    "split_sentences",
    "tokenize_pairs",
]

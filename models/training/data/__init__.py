"""Data readers of the training scripts (see [`records`])."""

from __future__ import annotations

from .records import (
    GLUE_TASKS,
    JSON_SUFFIXES,
    SUMMARY_COLUMNS,
    TABLE_SUFFIXES,
    ClassificationSplits,
    DataReport,
    GlueTask,
    MLMCollator,
    load_classification_splits,
    load_mlm_texts,
    load_summarization_splits,
    mask_dataset,
    normalize_task_name,
    read_cohan_jsonl,
    read_records,
    read_story,
    split_sentences,
    tokenize_pairs,
)

__all__ = [
    "GLUE_TASKS",
    "JSON_SUFFIXES",
    "SUMMARY_COLUMNS",
    "TABLE_SUFFIXES",
    "ClassificationSplits",
    "DataReport",
    "GlueTask",
    "MLMCollator",
    "load_classification_splits",
    "load_mlm_texts",
    "load_summarization_splits",
    "mask_dataset",
    "normalize_task_name",
    "read_cohan_jsonl",
    "read_records",
    "read_story",
    "split_sentences",
    "tokenize_pairs",
]

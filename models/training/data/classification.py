"""GLUE tasks and text classification: reading the train/validation examples of a classification run.

GLUE is read from the Hub or from the original TSV layouts (column aliases, the headerless CoLA files); other
classification data from local tables or JSON lines, or from the Hub.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .records import DataReport, _check_row, _column, _limit, _require_columns, _sample_key, read_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlueTask:
    """
    A GLUE task: its columns (aliases cover the Hub and the original TSV layouts), labels and official metric.

    Args:
        name: Hub configuration name (`"sst2"`).
        text: column aliases of the first text; `text_pair`: of the second (empty for single-sentence tasks).
        label: column aliases of the label.
        label_names: names in id order as on the Hub; empty for the regression task STS-B.
        headerless: `(text, label)` positions of the original headerless layout (CoLA), or `None`.
        validation_split: name of the Hub evaluation split.
    """

    name: str
    text: tuple[str, ...]
    text_pair: tuple[str, ...]
    label: tuple[str, ...]
    label_names: tuple[str, ...]
    headerless: tuple[int, int] | None = None
    validation_split: str = "validation"

    @property
    def is_regression(self) -> bool:
        return not self.label_names


GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("cola", ("sentence",), (), ("label",), ("unacceptable", "acceptable"), headerless=(3, 1)),
    "sst2": GlueTask("sst2", ("sentence",), (), ("label",), ("negative", "positive")),
    "mrpc": GlueTask(
        "mrpc",
        ("sentence1", "#1 String"),
        ("sentence2", "#2 String"),
        ("label", "Quality"),
        ("not_equivalent", "equivalent"),
    ),
    "stsb": GlueTask("stsb", ("sentence1",), ("sentence2",), ("label", "score"), ()),
    "qqp": GlueTask("qqp", ("question1",), ("question2",), ("label", "is_duplicate"), ("not_duplicate", "duplicate")),
    "mnli": GlueTask(
        "mnli",
        ("premise", "sentence1"),
        ("hypothesis", "sentence2"),
        ("label", "gold_label"),
        ("entailment", "neutral", "contradiction"),
        validation_split="validation_matched",
    ),
    "qnli": GlueTask("qnli", ("question",), ("sentence",), ("label",), ("entailment", "not_entailment")),
    "rte": GlueTask("rte", ("sentence1",), ("sentence2",), ("label",), ("entailment", "not_entailment")),
    "wnli": GlueTask("wnli", ("sentence1",), ("sentence2",), ("label",), ("not_entailment", "entailment")),
}


def normalize_task_name(name: str) -> str:
    """Accept `SST-2`, `sst-2`, `sst2`, `STS-B`, `MNLI`, ... and return the Hub configuration name."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    if key not in GLUE_TASKS:
        raise ValueError(f"Unknown GLUE task {name!r}; expected one of {', '.join(GLUE_TASKS)} (or no task_name).")
    return key


@dataclass
class ClassificationSplits:
    """Examples of a classification run: `{split: {"text": [...], "text_pair": [...] | None, "label": [...]}}`."""

    splits: dict[str, dict[str, list | None]]
    label_names: list[str] | None  # None: regression
    report: DataReport


def _pick(available: Sequence[str], aliases: Sequence[str]) -> str | None:
    return next((a for a in aliases if a in available), None)


def _label_id(value: Any, label_names: Sequence[str], where: str) -> int:
    text = str(value).strip()
    if text in label_names:
        return label_names.index(text)
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(label_names):
        return int(text)
    raise ValueError(f"Unknown label {value!r} at {where}; expected one of {list(label_names)} or an id.")


def load_classification_splits(args: Any, cache_dir: str | None = None) -> ClassificationSplits:
    """
    Read the train/validation examples named by `ClassificationDataArguments`.

    Returns:
        [`ClassificationSplits`] with labels as ids (floats for STS-B), label names and a data report.
    """
    task = GLUE_TASKS[args.task_name] if args.task_name else None
    report = DataReport()
    if args.dataset_name is not None:
        raw, label_names = _classification_from_hub(args, task, cache_dir)
    else:
        raw = {}
        for split, path in (("train", args.train_file), ("validation", args.validation_file)):
            if path:
                raw[split] = _classification_from_file(path, args, task, report, split)
        label_names = _label_names(raw, task)
    splits = {}
    for split, rows in raw.items():
        if task is not None and task.is_regression:
            labels = [float(r["label"]) for r in rows]
        else:
            labels = [_label_id(r["label"], label_names, r["where"]) for r in rows]
        rows = _limit(
            list(zip(rows, labels, strict=True)), getattr(args, f"max_{_sample_key(split)}_samples"), report, split
        )
        splits[split] = {
            "text": [r["text"] for r, _ in rows],
            "text_pair": [r["text_pair"] for r, _ in rows] if rows and rows[0][0]["text_pair"] is not None else None,
            "label": [label for _, label in rows],
        }
        report.add(f"{split}_examples", len(rows))
    return ClassificationSplits(splits, label_names, report)


def _label_names(raw: dict[str, list[dict]], task: GlueTask | None) -> list[str] | None:
    if task is not None:
        return list(task.label_names) or None
    source = raw.get("train") or raw.get("validation") or []
    values = sorted({str(r["label"]).strip() for r in source})
    if values and all(v.isdigit() for v in values):
        # Integer labels keep their ids (0..max), the usual encoding of IMDB / AG News exports.
        ids = sorted(int(v) for v in values)
        unseen = sorted(set(range(ids[-1] + 1)) - set(ids))
        if unseen:
            logger.warning(
                "Integer labels keep their ids: the labels run from %d to %d, so the model gets %d classes, and "
                "class(es) %s never occur in the data. Renumber the labels from 0 if that is not intended.",
                ids[0], ids[-1], ids[-1] + 1, unseen,
            )  # fmt: skip
        return [str(i) for i in range(ids[-1] + 1)]
    return values


def _refuse_header_as_data(path: str, records: list[dict], label_col: str) -> None:
    """Columns given by position mean a table without a header row. A first row whose label is a word while every
    other row's is an integer is a header read as data: it would train as an example and add a class."""
    labels = [str(r.get(label_col) or "").strip() for r in records]
    first = labels[0] if labels else ""
    # Empty labels are empty rows (`skip_empty_rows` decides about them), not a header.
    others = [label for label in labels[1:] if label]
    if first and not first.isdigit() and others and all(label.isdigit() for label in others):
        row = {k: v for k, v in records[0].items() if k != "__line__"}
        raise ValueError(
            f"Line 1 of '{path}' looks like a header row ({row}): the columns were given by position, which "
            f"reads every line as data, and its label {first!r} is not an integer like every other line's. "
            "Name the columns (e.g. `--text_column text --label_column label`) or remove the header line."
        )


def _classification_from_file(path: str, args: Any, task: GlueTask | None, report: DataReport, split: str) -> list:
    text_col, pair_col, label_col = (
        _column(args.text_column),
        _column(args.text_pair_column),
        _column(args.label_column),
    )
    probe = [c for c in (text_col, pair_col, label_col) if c is not None]
    records, available = read_records(path, probe)
    if task is not None and text_col is None:
        text_col = _pick(available, task.text)
        if text_col is None and task.headerless is not None and len(available) == 4:
            # The original CoLA files have no header: source, label, original label, sentence.
            records, available = read_records(path, [0])
            text_col, label_col = str(task.headerless[0]), str(task.headerless[1])
        if task.text_pair and pair_col is None:
            pair_col = _pick(available, task.text_pair)
        if label_col is None:
            label_col = _pick(available, task.label)
        if text_col is None or (task.text_pair and pair_col is None) or label_col is None:
            wanted = [
                text_col or "/".join(task.text),
                (pair_col or "/".join(task.text_pair)) if task.text_pair else None,
            ]
            wanted.append(label_col or "/".join(task.label))
            _require_columns(path, available, wanted)
    else:
        text_col = text_col if text_col is not None else _pick(available, ("text", "sentence"))
        label_col = label_col if label_col is not None else _pick(available, ("label",))
        if text_col is None or label_col is None:
            _require_columns(path, available, [text_col or "text", label_col or "label"])
    positional = isinstance(label_col, int)
    text_col, pair_col, label_col = (str(c) if c is not None else None for c in (text_col, pair_col, label_col))
    _require_columns(path, available, [text_col, pair_col, label_col])
    if positional:
        _refuse_header_as_data(path, records, label_col)
    fields = [c for c in (text_col, pair_col, label_col) if c is not None]
    rows, dropped = [], 0
    for record in records:
        if not _check_row(path, record, fields, args.skip_empty_rows):
            dropped += 1
            continue
        rows.append(
            {
                "text": record[text_col],
                "text_pair": record[pair_col] if pair_col else None,
                "label": record[label_col],
                "where": f"line {record['__line__']} of '{path}'",
            }
        )
    if dropped:
        report.add(f"{split}_dropped_empty_rows", dropped)
    return rows


def _classification_from_hub(args: Any, task: GlueTask | None, cache_dir: str | None) -> tuple[dict, list | None]:
    from datasets import load_dataset

    data = load_dataset(args.dataset_name, args.dataset_config_name, cache_dir=cache_dir)
    eval_split = task.validation_split if task else ("validation" if "validation" in data else "test")
    text_col = args.text_column or (task.text[0] if task else "text")
    pair_col = args.text_pair_column or (task.text_pair[0] if task and task.text_pair else None)
    label_col = args.label_column or "label"
    raw: dict[str, list] = {}
    label_names = None
    for split, source in (("train", "train"), ("validation", eval_split)):
        if source not in data:
            continue
        table = data[source]
        _require_columns(f"{args.dataset_name}[{source}]", table.column_names, [text_col, pair_col, label_col])
        feature = table.features[label_col]
        if hasattr(feature, "names"):
            label_names = list(feature.names)
        raw[split] = [
            {
                "text": row[text_col],
                "text_pair": row[pair_col] if pair_col else None,
                "label": row[label_col],
                "where": f"row {i} of {args.dataset_name}[{source}]",
            }
            for i, row in enumerate(table)
        ]
    if task is not None:
        label_names = list(task.label_names) or None
    elif label_names is None:
        label_names = _label_names(raw, None)
    return raw, label_names

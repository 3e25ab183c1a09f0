"""Reading local tables and JSON lines into checked records, and counting what happens to the examples.

Every reader of [`attnzoo.training.data`] goes through [`read_records`] (or checks its rows the same way), so
columns are checked before reading, empty rows are refused unless asked to skip them, and examples dropped or
truncated are counted in a [`DataReport`]. [`tokenize_pairs`], shared by the three training scripts, counts the
truncated ones.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...tokenization import iter_json_records, tsv_is_csv_quoted

logger = logging.getLogger(__name__)

TABLE_SUFFIXES = (".tsv", ".csv")
JSON_SUFFIXES = (".jsonl", ".json", ".txt")


# --------------------------------------------------------------------------------------------------------------------
# Bookkeeping
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class DataReport:
    """Counts of what happened to the examples of a run; logged and written into the metrics file."""

    counts: dict[str, int | float] = field(default_factory=dict)

    def add(self, key: str, value: int | float) -> None:
        self.counts[key] = self.counts.get(key, 0) + value

    def log(self) -> None:
        for key, value in self.counts.items():
            logger.info("data: %s = %s", key, value)
        lost = {k: v for k, v in self.counts.items() if ("dropped" in k or "truncated" in k) and v}
        if lost:
            logger.warning("Examples dropped or truncated: %s", ", ".join(f"{k}={v}" for k, v in lost.items()))


def _column(value: str | int | None) -> str | int | None:
    """A column given as digits (`"0"`) is a position in a file without a header."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _limit(rows: list, limit: int | None, report: DataReport, split: str) -> list:
    if limit is not None and len(rows) > limit:
        report.add(f"{split}_dropped_by_max_samples", len(rows) - limit)
        logger.info("Keeping the first %d of %d %s examples (max samples).", limit, len(rows), split)
        return rows[:limit]
    return rows


def _sample_key(split: str) -> str:
    return "train" if split == "train" else "eval"


# --------------------------------------------------------------------------------------------------------------------
# Local table / JSON readers
# --------------------------------------------------------------------------------------------------------------------


def read_records(path: str | Path, columns: Sequence[str | int]) -> tuple[list[dict[str, Any]], list[str]]:
    """
    Read a local `.tsv`/`.csv`/`.jsonl`/`.json`/`.parquet` file into dictionaries.

    TSV files are read literally, as GLUE distributes them (quotes are text), unless they were written by a CSV
    writer (detected); a UTF-8 byte-order mark (MRPC) is dropped. When a requested column is an integer the table has
    no header row and rows are keyed by position (`"0"`, `"1"`, ...).

    Args:
        path: the file.
        columns: the columns the caller needs, used to decide whether the table has a header row.

    Returns:
        `(records, available_columns)`, each record with `"__line__"` holding its line number for error messages.

    Raises:
        ValueError: if the file does not exist, is empty or has an unsupported extension.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Data file not found: '{path}'.")
    suffix = path.suffix.lower()
    if suffix in TABLE_SUFFIXES:
        delimiter = "\t" if suffix == ".tsv" else ","
        quoted = suffix == ".csv" or tsv_is_csv_quoted(path)
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = (
                csv.reader(handle, delimiter=delimiter)
                if quoted
                else csv.reader(handle, delimiter=delimiter, quoting=csv.QUOTE_NONE)
            )
            rows = [(number, row) for number, row in enumerate(reader, start=1) if row]
        if not rows:
            raise ValueError(f"'{path}' is empty.")
        if any(isinstance(c, int) for c in columns):
            width = max(len(row) for _, row in rows)
            names = [str(i) for i in range(width)]
            body = rows
        else:
            names, body = rows[0][1], rows[1:]
        records = []
        for number, row in body:
            record: dict[str, Any] = {name: (row[i] if i < len(row) else None) for i, name in enumerate(names)}
            record["__line__"] = number
            records.append(record)
        return records, list(names)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path).to_pylist()
        return [{**r, "__line__": i} for i, r in enumerate(table, start=1)], list(table[0]) if table else []
    if suffix in JSON_SUFFIXES:
        records = []
        for number, record in iter_json_records(path):
            if not isinstance(record, dict):
                raise ValueError(f"Record {number} of '{path}' is not a JSON object.")
            records.append({**record, "__line__": number})
        if not records:
            raise ValueError(f"'{path}' contains no records.")
        return records, [k for k in records[0] if k != "__line__"]
    raise ValueError(
        f"Unsupported data file '{path}'; expected .tsv, .csv, .jsonl/.json/.txt (JSON lines) or .parquet."
    )


def _require_columns(path: str, available: Sequence[str], wanted: Iterable[str | int | None]) -> None:
    missing = [str(c) for c in wanted if c is not None and str(c) not in available]
    if missing:
        raise ValueError(
            f"Column(s) {', '.join(missing)} not found in '{path}'; available columns: {', '.join(available)}. "
            "For a file without a header row give column positions (0, 1, ...)."
        )


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _check_row(path: str, record: dict, fields: Sequence[str], skip: bool) -> bool:
    """True when the row is complete; an incomplete one raises unless `skip` (then the caller counts it)."""
    empty = [name for name in fields if _empty(record.get(name))]
    if not empty:
        return True
    if skip:
        return False
    raise ValueError(
        f"Row at line {record.get('__line__')} of '{path}' has an empty or missing {', '.join(empty)}; fix the file "
        "or pass `skip_empty_rows` to drop such rows (they are counted in the metrics)."
    )


# --------------------------------------------------------------------------------------------------------------------
# Tokenization (shared by the MLM, classification and summarization scripts)
# --------------------------------------------------------------------------------------------------------------------


def tokenize_pairs(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    max_length: int,
    report: DataReport,
    split: str,
    **kwargs: Any,
) -> dict[str, list]:
    """
    Tokenize (pairs of) texts truncated to `max_length`, counting the truncated examples into `report`
    (`<split>_truncated`). Extra keyword arguments go to the tokenizer.
    """
    encoded = tokenizer(
        list(texts), list(pairs) if pairs is not None else None, truncation=True, max_length=max_length, **kwargs
    )
    # Only a full-length result can have been cut: re-tokenize those without truncation to check.
    full = [i for i, ids in enumerate(encoded["input_ids"]) if len(ids) >= max_length]
    truncated = 0
    if full:
        again = tokenizer(
            [texts[i] for i in full],
            [pairs[i] for i in full] if pairs is not None else None,
            truncation=False,
            verbose=False,
            **kwargs,
        )
        truncated = sum(len(ids) > max_length for ids in again["input_ids"])
    report.add(f"{split}_truncated", truncated)
    return dict(encoded)

"""ECTSum (Mukherjee et al., EMNLP 2022): earnings-call transcripts with bullet-point summaries, as JSON lines.

One record per call: `id` (`<TICKER>_q<QUARTER>_<YEAR>`), `text` (the transcript, one sentence per line),
`summary` (the reference, one bullet per line) and optionally `source_file`. Files may be gzip-compressed
(`.jsonl.gz`). Every record is checked as it is read: a line that is not a JSON object, a missing, empty or
non-string field, a malformed or repeated `id` stops the reading with an error naming the file and the line.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: `<TICKER>_q<QUARTER>_<YEAR>`, e.g. `ABM_q1_2021` (tickers may hold `.`, `-` or `&`).
ID_PATTERN = re.compile(r"[A-Za-z0-9.&-]+_q[1-4]_\d{4}")
REQUIRED_FIELDS = ("id", "text", "summary")


@dataclass(frozen=True)
class EctsumRecord:
    """
    One earnings call.

    Args:
        id (`str`): `<TICKER>_q<QUARTER>_<YEAR>`.
        sentences (`tuple[str, ...]`): the transcript, one sentence per entry (its non-blank lines).
        bullets (`tuple[str, ...]`): the reference summary, one bullet per entry.
        line (`int`): the record's line in its file.
    """

    id: str
    sentences: tuple[str, ...]
    bullets: tuple[str, ...]
    line: int

    @property
    def document(self) -> str:
        """The transcript, one sentence per line."""
        return "\n".join(self.sentences)

    @property
    def summary(self) -> str:
        """The reference, one bullet per line (how ROUGE-Lsum delimits its sentences)."""
        return "\n".join(self.bullets)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        yield from enumerate(handle, start=1)


def _non_blank_lines(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _record(where: str, number: int, line: str) -> EctsumRecord:
    try:
        data: Any = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"Line {number} of '{where}' is not valid JSON ({err.msg} at column {err.colno}).") from err
    if not isinstance(data, dict):
        raise ValueError(f"Line {number} of '{where}' holds a JSON {type(data).__name__}, not an ECTSum record.")
    label = f"Line {number} of '{where}'" + (f" (id {data['id']!r})" if isinstance(data.get("id"), str) else "")
    for name in REQUIRED_FIELDS:
        value = data.get(name)
        if name not in data:
            problem = f" has no `{name}` field"
        elif not isinstance(value, str):
            problem = f": its `{name}` field is of type {type(value).__name__}, not a string"
        elif not value.strip():
            problem = f" has an empty `{name}` field"
        else:
            continue
        raise ValueError(f"{label}{problem}; an ECTSum record needs the strings id, text and summary.")
    if not ID_PATTERN.fullmatch(data["id"]):
        raise ValueError(f"{label}: the id is not of the form <TICKER>_q<QUARTER>_<YEAR> (e.g. ABM_q1_2021).")
    return EctsumRecord(data["id"], _non_blank_lines(data["text"]), _non_blank_lines(data["summary"]), number)


def read_ectsum(path: str | Path) -> list[EctsumRecord]:
    """
    Read an ECTSum split (`.jsonl` or `.jsonl.gz`, one JSON object per line; blank lines are skipped).

    Args:
        path (`str` or `Path`): the file.

    Returns:
        `list[EctsumRecord]`, in file order.

    Raises:
        ValueError: the file is missing or holds no record, or a record is bad (the message names the line).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"ECTSum file not found: '{path}'.")
    records: list[EctsumRecord] = []
    first_line: dict[str, int] = {}
    try:
        for number, line in _lines(path):
            if not line.strip():
                continue
            record = _record(str(path), number, line)
            if record.id in first_line:
                raise ValueError(
                    f"Line {number} of '{path}' repeats the id {record.id!r} of line {first_line[record.id]}; every "
                    "call appears once."
                )
            first_line[record.id] = number
            records.append(record)
    except (OSError, UnicodeDecodeError) as err:  # a truncated or mislabelled gzip file, bytes that are not UTF-8
        raise ValueError(f"Cannot read '{path}' as UTF-8 JSON lines ({type(err).__name__}: {err}).") from err
    if not records:
        raise ValueError(f"'{path}' holds no ECTSum record.")
    return records

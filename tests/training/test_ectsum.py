"""`attnzoo.training.data.read_ectsum`: the ECTSum JSON-lines format (plain or gzip), and bad records named by line.

The records are made up here in ECTSum's layout (the shared copy is third-party text and stays out of the repository).
"""

from __future__ import annotations

import gzip
import json

import pytest

from attnzoo.training.data import EctsumRecord, read_ectsum


def _record(call_id: str = "ABM_q1_2021", **fields: object) -> dict[str, object]:
    return {
        "id": call_id,
        "text": "Revenue was $1.5 billion.\nMargins rose 40 basis points.\n\nWe expect growth.",
        "summary": "q1 revenue $1.5 billion.\nsees fy growth.",
        "source_file": f"data/final/val/ects/{call_id}.txt",
        **fields,
    }


def _write(path, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("name", ["calls.jsonl", "calls.jsonl.gz"])
def test_reads_sentences_bullets_and_line_numbers_from_plain_and_gzip_files(tmp_path, name):
    path = tmp_path / name
    _write(path, [json.dumps(_record()), "", json.dumps(_record("BRK.B_q4_2019", summary="one bullet"))])
    first, second = read_ectsum(path)
    assert first == EctsumRecord(
        "ABM_q1_2021",
        ("Revenue was $1.5 billion.", "Margins rose 40 basis points.", "We expect growth."),  # blank line dropped
        ("q1 revenue $1.5 billion.", "sees fy growth."),
        1,
    )
    assert first.document == "Revenue was $1.5 billion.\nMargins rose 40 basis points.\nWe expect growth."
    assert first.summary == "q1 revenue $1.5 billion.\nsees fy growth."
    assert (second.id, second.bullets, second.line) == ("BRK.B_q4_2019", ("one bullet",), 3)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "ABM_q1_2021", "text": "a"', r"Line 2 of '.*' is not valid JSON"),
        ('["ABM_q1_2021", "text"]', "Line 2 of '.*' holds a JSON list, not an ECTSum record"),
        (json.dumps({"id": "X_q1_2020", "text": "t"}), r"Line 2 of '.*' \(id 'X_q1_2020'\) has no `summary` field"),
        (json.dumps(_record("X_q1_2020", summary="  \n ")), r"\(id 'X_q1_2020'\) has an empty `summary` field"),
        (json.dumps(_record("X_q1_2020", text=["a", "b"])), r": its `text` field is of type list, not a string"),
        (json.dumps(_record(id=7)), "Line 2 of '.*': its `id` field is of type int, not a string"),
        (json.dumps(_record("ABM-2021-Q1")), r"\(id 'ABM-2021-Q1'\): the id is not of the form"),
        (json.dumps(_record()), "Line 2 of '.*' repeats the id 'ABM_q1_2021' of line 1"),
    ],
)
def test_a_bad_record_is_an_error_naming_its_line(tmp_path, line, message):
    path = tmp_path / "calls.jsonl"
    _write(path, [json.dumps(_record()), line, json.dumps(_record("OK_q2_2020"))])
    with pytest.raises(ValueError, match=message):
        read_ectsum(path)


def test_missing_empty_and_unreadable_files_are_errors(tmp_path):
    with pytest.raises(ValueError, match="ECTSum file not found"):
        read_ectsum(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl.gz"
    _write(empty, ["", "  "])
    with pytest.raises(ValueError, match="holds no ECTSum record"):
        read_ectsum(empty)
    not_gzip = tmp_path / "plain.jsonl.gz"
    not_gzip.write_text(json.dumps(_record()) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="Cannot read .* as UTF-8 JSON lines"):
        read_ectsum(not_gzip)

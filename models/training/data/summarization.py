"""Summarization: CNN/DailyMail (`.story` files, JSON lines, Hub) and PubMed/arXiv (Cohan et al. JSON lines).

Also the rule-based sentence splitter that ROUGE-Lsum uses ([`split_sentences`]).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from ...story_format import story_parts
from .records import DataReport, _check_row, _limit, _require_columns, _sample_key, read_records

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_S_TAG = re.compile(r"</?S>")

#: (document, summary) column pairs recognised without `text_column` / `summary_column`.
SUMMARY_COLUMNS = (
    ("article", "highlights"),
    ("article_text", "abstract_text"),
    ("article", "abstract"),
    ("document", "summary"),
    ("text", "summary"),
)


def split_sentences(text: str) -> list[str]:
    """
    Split text into sentences with a rule (end punctuation, then whitespace and an upper-case letter or digit).

    Used for ROUGE-Lsum, which scores newline-separated sentences; it avoids NLTK's punkt data download. Existing
    newlines are kept as sentence boundaries.
    """
    sentences = []
    for line in text.split("\n"):
        sentences.extend(part.strip() for part in _SENTENCE_END.split(line) if part.strip())
    return sentences


def read_story(path: str | Path) -> tuple[str, str]:
    """
    Read a CNN/DailyMail `.story` file.

    Returns:
        `(article, summary)`: the article paragraphs joined with spaces, and the `@highlight` sentences joined with
        newlines (one summary sentence per line, as ROUGE-Lsum expects).
    """
    article, highlights = story_parts(path)
    return " ".join(article), "\n".join(highlights)


def read_cohan_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """
    Read the PubMed/arXiv summarization format of Cohan et al. (2018): JSON lines with `article_text` (a list of
    sentences) and `abstract_text` (a list of `<S> ... </S>` sentences).

    Returns:
        Records `{"document": ..., "summary": ..., "__line__": n}`: sentences joined with spaces for the article and
        with newlines for the abstract, `<S>` tags removed.
    """
    records, available = read_records(path, [])
    _require_columns(str(path), available, ["article_text", "abstract_text"])
    out = []
    for record in records:
        abstract = [_S_TAG.sub("", s).strip() for s in record.get("abstract_text") or []]
        out.append(
            {
                "document": " ".join(s.strip() for s in record.get("article_text") or []),
                "summary": "\n".join(s for s in abstract if s),
                "__line__": record["__line__"],
            }
        )
    return out


def _story_records(folder: Path, url_list: str | None) -> list[dict[str, Any]]:
    if url_list:
        urls = [u.strip() for u in Path(url_list).read_text(encoding="utf-8").splitlines() if u.strip()]
        names = [hashlib.sha1(u.encode()).hexdigest() + ".story" for u in urls]
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ValueError(
                f"{len(missing)} of the {len(names)} stories listed in '{url_list}' are missing from '{folder}' "
                f"(first: {missing[0]})."
            )
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.story"))
        if not files:
            raise ValueError(f"No .story files in '{folder}'.")
    records = []
    for number, path in enumerate(files, start=1):
        article, summary = read_story(path)
        records.append({"document": article, "summary": summary, "__line__": f"{number} ({path.name})"})
    return records


def summary_columns(
    where: str, available: list[str], text_col: str | None, summary_col: str | None
) -> tuple[str, str]:
    """The (document, summary) columns: those given, and a missing one from a known pair ([`SUMMARY_COLUMNS`]) that
    agrees with the one given.

    Raises:
        ValueError: a column is missing and no known pair in `available` agrees with the one given.
    """
    if text_col is not None and summary_col is not None:
        return text_col, summary_col
    pair = next(
        (
            (t, s)
            for t, s in SUMMARY_COLUMNS
            if t in available and s in available and text_col in (None, t) and summary_col in (None, s)
        ),
        None,
    )
    if pair is None:
        given = {"text_column": text_col, "summary_column": summary_col}
        said = ", ".join(f"`{k}={v}`" for k, v in given.items() if v is not None)
        raise ValueError(
            f"Cannot find document/summary columns in {where} (available: {', '.join(available)})"
            + (f" to go with {said}" if said else "")
            + "; pass `text_column` and `summary_column`."
        )
    return pair


def _summarization_from_file(path: str, url_list: str | None, args: Any) -> tuple[list[dict], str]:
    source = Path(path)
    if source.is_dir() or source.suffix.lower() == ".story":
        if source.is_file():
            article, summary = read_story(source)
            return [{"document": article, "summary": summary, "__line__": 1}], path
        return _story_records(source, url_list), path
    if url_list:
        raise ValueError("A URL list only applies to a folder of CNN/DailyMail .story files.")
    records, available = read_records(path, [])
    text_col, summary_col = summary_columns(f"'{path}'", available, args.text_column, args.summary_column)
    _require_columns(path, available, [text_col, summary_col])
    if (text_col, summary_col) == ("article_text", "abstract_text"):
        return read_cohan_jsonl(path), path
    return [{"document": r[text_col], "summary": r[summary_col], "__line__": r["__line__"]} for r in records], path


def load_summarization_splits(
    args: Any, cache_dir: str | None = None
) -> tuple[dict[str, dict[str, list]], DataReport]:
    """
    Read the train/validation (document, summary) pairs named by `SummarizationDataArguments`.

    Returns:
        `({split: {"document": [...], "summary": [...]}}, report)`.
    """
    report = DataReport()
    raw: dict[str, tuple[list[dict], str]] = {}
    if args.dataset_name is not None:
        from datasets import load_dataset

        data = load_dataset(args.dataset_name, args.dataset_config_name, cache_dir=cache_dir)
        for split in ("train", "validation"):
            if split not in data:
                continue
            table = data[split]
            text_col, summary_col = summary_columns(
                args.dataset_name, table.column_names, args.text_column, args.summary_column
            )
            _require_columns(f"{args.dataset_name}[{split}]", table.column_names, [text_col, summary_col])
            rows = [
                {"document": _join(r[text_col], " "), "summary": _join(r[summary_col], "\n"), "__line__": i}
                for i, r in enumerate(table)
            ]
            raw[split] = (rows, f"{args.dataset_name}[{split}]")
    else:
        for split, path, urls in (
            ("train", args.train_file, args.train_url_list),
            ("validation", args.validation_file, args.validation_url_list),
        ):
            if path:
                raw[split] = _summarization_from_file(path, urls, args)
    out = {}
    for split, (rows, where) in raw.items():
        kept = [r for r in rows if _check_row(where, r, ["document", "summary"], args.skip_empty_rows)]
        if len(kept) < len(rows):
            report.add(f"{split}_dropped_empty_rows", len(rows) - len(kept))
        kept = _limit(kept, getattr(args, f"max_{_sample_key(split)}_samples"), report, split)
        out[split] = {"document": [r["document"] for r in kept], "summary": [r["summary"] for r in kept]}
        report.add(f"{split}_examples", len(kept))
    return out, report


def _join(value: Any, separator: str) -> str:
    if isinstance(value, list):
        return separator.join(_S_TAG.sub("", str(v)).strip() for v in value)
    return value

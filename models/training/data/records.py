"""Data readers of the training scripts: GLUE (Hub or original TSV layouts), text classification, MLM corpora,
CNN/DailyMail (`.story` files, JSON lines, Hub) and PubMed (Cohan et al. JSON lines), plus the MLM collator.

Every reader checks columns before reading, refuses empty rows unless asked to skip them, and records how many
examples were dropped or truncated in a [`DataReport`], so no example is lost silently.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...tokenization import iter_json_records, iter_texts_from_dataset, iter_texts_from_files, tsv_is_csv_quoted

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


def _split_files(value: str | None) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()] if value else []


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
# GLUE and text classification
# --------------------------------------------------------------------------------------------------------------------


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


def _sample_key(split: str) -> str:
    return "train" if split == "train" else "eval"


def _label_names(raw: dict[str, list[dict]], task: GlueTask | None) -> list[str] | None:
    if task is not None:
        return list(task.label_names) or None
    source = raw.get("train") or raw.get("validation") or []
    values = sorted({str(r["label"]).strip() for r in source})
    if values and all(v.isdigit() for v in values):
        # Integer labels keep their ids (0..max), the usual encoding of IMDB / AG News exports.
        return [str(i) for i in range(max(int(v) for v in values) + 1)]
    return values


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
    text_col, pair_col, label_col = (str(c) if c is not None else None for c in (text_col, pair_col, label_col))
    _require_columns(path, available, [text_col, pair_col, label_col])
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


# --------------------------------------------------------------------------------------------------------------------
# MLM corpora
# --------------------------------------------------------------------------------------------------------------------


def load_mlm_texts(args: Any, split: str) -> list[str]:
    """
    Texts of an MLM split: local files (`.txt`, `.jsonl`/`.json`, `.csv`/`.tsv`, `.story`, `.parquet`) or a Hub
    dataset. Blank lines of text files separate paragraphs and are not examples.
    """
    if args.dataset_name is not None:
        hub_split = "train" if split == "train" else "validation"
        try:
            return list(
                iter_texts_from_dataset(
                    args.dataset_name,
                    split=hub_split,
                    text_column=args.text_column or "text",
                    config_name=args.dataset_config_name,
                )
            )
        except ValueError:
            if split == "train":
                raise
            return []
    files = _split_files(args.train_file if split == "train" else args.validation_file)
    texts: list[str] = []
    for path in files:
        if path.lower().endswith(".parquet"):
            texts.extend(iter_texts_from_dataset("parquet", data_files=path, text_column=args.text_column or "text"))
        else:
            texts.extend(iter_texts_from_files(path, text_column=_column(args.text_column)))
    return texts


@dataclass
class MLMCollator:
    """
    Pads a batch and masks it for masked-language modelling (BERT's 80/10/10 rule) deterministically.

    The mask of an example is a pure function of `(seed, epoch, token ids)`: a batch gets the same masks however the
    data is sharded across processes, and a run resumed from a checkpoint masks exactly as the uninterrupted run
    would (the global RNG, which Trainer restores, is left to dropout and the sampling attentions). `epoch` is set by
    [`~attnzoo.training.EpochSetterCallback`] so each epoch draws new masks. Examples that already carry `labels`
    (a pre-masked evaluation set, see [`mask_dataset`]) are only padded.

    Args:
        tokenizer: the tokenizer (needs `mask_token`, `pad_token`).
        mlm_probability (`float`): fraction of (non-special) tokens to predict.
        seed (`int`): base seed of the masks.
        pad_to_multiple_of (`int`, *optional*): pad the batch length to a multiple of this.
    """

    tokenizer: Any
    mlm_probability: float = 0.15
    seed: int = 0
    pad_to_multiple_of: int | None = None
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.tokenizer.mask_token_id is None:
            raise ValueError("The tokenizer has no mask token; masked-language modelling needs one.")
        self._special = torch.tensor(sorted(set(self.tokenizer.all_special_ids)))

    def mask(self, input_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Masked input ids and labels (-100 where nothing is predicted) of one example."""
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        digest = hashlib.blake2b(ids.numpy().tobytes(), digest_size=8)
        digest.update(f"{self.seed}:{self.epoch}".encode())
        generator = torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF)
        n = len(ids)
        selected = (torch.rand(n, generator=generator) < self.mlm_probability) & ~torch.isin(ids, self._special)
        action = torch.rand(n, generator=generator)
        random_ids = torch.randint(len(self.tokenizer), (n,), generator=generator)
        labels = torch.where(selected, ids, torch.full_like(ids, -100))
        masked = torch.where(selected & (action < 0.8), torch.full_like(ids, self.tokenizer.mask_token_id), ids)
        masked = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, masked)
        return masked.tolist(), labels.tolist()

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        inputs, labels = [], []
        for feature in features:
            feature = {k: v for k, v in feature.items() if k != "special_tokens_mask"}
            label = feature.pop("labels", None)
            if label is None:
                feature["input_ids"], label = self.mask(feature["input_ids"])
            inputs.append(feature)
            labels.append(list(label))
        batch = dict(self.tokenizer.pad(inputs, return_tensors="pt", pad_to_multiple_of=self.pad_to_multiple_of))
        width = batch["input_ids"].shape[1]
        batch["labels"] = torch.tensor([row + [-100] * (width - len(row)) for row in labels], dtype=torch.long)
        return batch


def mask_dataset(dataset: Any, collator: MLMCollator) -> Any:
    """Fix the masks of an evaluation set once (epoch -1), so every evaluation scores the same predictions."""
    fixed = MLMCollator(collator.tokenizer, collator.mlm_probability, collator.seed, collator.pad_to_multiple_of, -1)

    def apply(batch: dict[str, list]) -> dict[str, list]:
        masked = [fixed.mask(ids) for ids in batch["input_ids"]]
        return {"input_ids": [m for m, _ in masked], "labels": [lab for _, lab in masked]}

    return dataset.map(apply, batched=True, desc="Masking the evaluation set")


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


# --------------------------------------------------------------------------------------------------------------------
# Summarization
# --------------------------------------------------------------------------------------------------------------------

_HIGHLIGHT = "@highlight"
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
    article: list[str] = []
    highlights: list[str] = []
    in_highlight = False
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line == _HIGHLIGHT:
            in_highlight = True
            continue
        (highlights if in_highlight else article).append(line)
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
    text_col, summary_col = args.text_column, args.summary_column
    if text_col is None and summary_col is None:
        pair = next(((t, s) for t, s in SUMMARY_COLUMNS if t in available and s in available), None)
        if pair is None:
            raise ValueError(
                f"Cannot find document/summary columns in '{path}' (available: {', '.join(available)}); pass "
                "`text_column` and `summary_column`."
            )
        text_col, summary_col = pair
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
            text_col, summary_col = args.text_column, args.summary_column
            if text_col is None or summary_col is None:
                pair = next(
                    ((t, s) for t, s in SUMMARY_COLUMNS if t in table.column_names and s in table.column_names), None
                )
                if pair is None:
                    raise ValueError(
                        f"Cannot find document/summary columns in {args.dataset_name} (available: "
                        f"{', '.join(table.column_names)}); pass `text_column` and `summary_column`."
                    )
                text_col, summary_col = pair
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

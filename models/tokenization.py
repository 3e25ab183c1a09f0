"""WordPiece tokenizer training and corpus readers for the attnzoo models.

The model configs in this package hard-code ``pad_token_id=0``, ``bos_token_id=decoder_start_token_id=2`` and
``eos_token_id=3``, so every tokenizer trained here places [`SPECIAL_TOKENS`] first, in that order, and checks the
resulting ids before returning.

Example:

```python
>>> from attnzoo.tokenization import iter_texts_from_files, train_wordpiece_tokenizer
>>> tokenizer = train_wordpiece_tokenizer(iter_texts_from_files(["corpus.txt"]), vocab_size=8000)
>>> tokenizer.save_pretrained("my-tokenizer")
```
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from .story_format import story_parts

logger = logging.getLogger(__name__)

__all__ = [
    "SPECIAL_TOKENS",
    "SUPPORTED_EXTENSIONS",
    "iter_texts_from_dataset",
    "iter_texts_from_files",
    "train_wordpiece_tokenizer",
]

PathLike = str | os.PathLike[str]

#: Special tokens in id order: [PAD]=0, [UNK]=1, [CLS]=2 (bos / decoder start), [SEP]=3 (eos), [MASK]=4.
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

#: File extensions understood by [`iter_texts_from_files`].
SUPPORTED_EXTENSIONS: tuple[str, ...] = (".txt", ".jsonl", ".json", ".csv", ".tsv", ".story")

# Column names picked automatically from a header when `text_column` is not given (GLUE single-sentence tasks use
# `sentence`, most other corpora use `text`).
_DEFAULT_TABLE_COLUMNS: tuple[str, ...] = ("text", "sentence")


# --------------------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------------------


def train_wordpiece_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 8000,
    *,
    min_frequency: int = 2,
    lowercase: bool = True,
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """
    Train a BERT-style WordPiece tokenizer from raw texts.

    The pipeline is the one BERT uses: the BERT normalizer (control-character cleanup, CJK spacing and, when
    `lowercase` is set, lowercasing plus NFD accent stripping), the BERT pre-tokenizer (whitespace and punctuation
    split), a WordPiece model with a `##` continuing-subword prefix, a WordPiece decoder (so `decode` rejoins subwords)
    and the `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` post-processor with token type ids 0/1 for pairs.

    Args:
        texts (`Iterable[str]`):
            The training corpus, one document, paragraph or sentence per item. Blank items are skipped. It is
            consumed once, so a generator (e.g. from [`iter_texts_from_files`]) is fine.
        vocab_size (`int`, *optional*, defaults to 8000):
            Target vocabulary size, special tokens included. Must exceed `len(SPECIAL_TOKENS)`. A small corpus may
            yield fewer tokens; the initial character alphabet is always kept, so it may also slightly exceed it.
        min_frequency (`int`, *optional*, defaults to 2):
            Minimum number of occurrences for a merge to enter the vocabulary.
        lowercase (`bool`, *optional*, defaults to `True`):
            Lowercase and strip accents (uncased model). With `False` the text is kept as is (cased model).
        model_max_length (`int`, *optional*, defaults to 512):
            Stored as the tokenizer's `model_max_length`, used by `truncation=True`.

    Returns:
        [`~transformers.PreTrainedTokenizerFast`]: The trained tokenizer, padding on the right, with
        `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]` at ids 0-4 (`bos_token` is `[CLS]`, `eos_token` is `[SEP]`).

    Raises:
        ValueError: If an argument is out of range or the corpus has no non-blank text.
        TypeError: If `texts` is a single string or yields non-string items.
    """
    if isinstance(texts, (str, bytes)):
        # Iterating a string would train on single characters, which is never what the caller meant.
        raise TypeError("`texts` must be an iterable of strings, not a single string; wrap it in a list.")
    _check_int("vocab_size", vocab_size, minimum=len(SPECIAL_TOKENS) + 1)
    _check_int("min_frequency", min_frequency, minimum=0)
    _check_int("model_max_length", model_max_length, minimum=1)

    corpus = _non_blank_texts(texts)
    # Peek at the first text so an empty corpus fails with a clear message instead of producing a vocabulary made of
    # special tokens only.
    first = next(corpus, None)
    if first is None:
        raise ValueError("Cannot train a tokenizer on an empty corpus: `texts` yielded no non-blank text.")

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    backend.train_from_iterator(itertools.chain([first], corpus), trainer=trainer)
    # The trainer numbers tokens of equal frequency in hash-map order, which differs from one process to the next:
    # the same corpus gave the same vocabulary with other ids. WordPiece splits a word by the vocabulary's strings,
    # never by its ids, so numbering the tokens in a fixed order (special tokens first, then single characters, then
    # longer pieces, each alphabetically) keeps every split and makes the ids reproducible.
    pieces = sorted(
        (token for token in backend.get_vocab(with_added_tokens=False) if token not in SPECIAL_TOKENS),
        key=lambda token: (len(token.removeprefix("##")) > 1, token.startswith("##"), token),
    )
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *pieces])}
    backend.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##")

    # The trainer adds special tokens first, in list order; verify rather than assume because the model configs
    # depend on these exact ids (a plain `assert` would vanish under `python -O`).
    ids = {token: backend.token_to_id(token) for token in SPECIAL_TOKENS}
    expected = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    if ids != expected:
        raise RuntimeError(f"Special tokens got ids {ids}, expected {expected}.")

    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        bos_token="[CLS]",
        eos_token="[SEP]",
        model_max_length=model_max_length,
        padding_side="right",
        # transformers 5 no longer returns token type ids by default; BERT-style sentence-pair inputs need them.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    # `bool` is an `int` subclass; `vocab_size=True` is a bug, not a vocabulary of one.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"`{name}` must be an integer, got {value!r}.")
    if value < minimum:
        if name == "vocab_size":
            raise ValueError(
                f"`vocab_size` must be larger than the {len(SPECIAL_TOKENS)} special tokens {SPECIAL_TOKENS}, "
                f"got {value}."
            )
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}.")


def _non_blank_texts(texts: Iterable[str]) -> Iterator[str]:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"`texts` must yield strings, item {index} is {type(text).__name__}.")
        if text.strip():
            yield text


# --------------------------------------------------------------------------------------------------------------------
# File readers
# --------------------------------------------------------------------------------------------------------------------


def iter_texts_from_files(
    paths: PathLike | Iterable[PathLike],
    *,
    text_column: str | int | None = None,
) -> Iterator[str]:
    """
    Stream training texts from local files, picking the reader from each file's extension.

    Supported formats:

    - `.txt`: one text per non-blank line (surrounding whitespace stripped).
    - `.jsonl` / `.json`: JSON Lines, one object per line (a `.json` file holding a single top-level array of
      objects is accepted too). The field is `text_column`, or `text` when present, or the record's only string
      field. A field holding a list of strings (e.g. PubMed `article_text`) is joined with spaces.
    - `.csv` / `.tsv`: delimited table with a header row; the column is `text_column`, else `text` or `sentence`.
      Pass an `int` `text_column` for a headerless file (e.g. GLUE CoLA), selecting that column by position.
      `.csv` uses standard CSV quoting. `.tsv` files are read literally, as GLUE distributes them (a field such as
      `" I think , " he said` keeps its quotes), unless every field that starts with a quote is a complete CSV-quoted
      field, in which case the file was written by a CSV writer and is unquoted accordingly.
    - `.story`: CNN/DailyMail story; each non-blank article paragraph, then each highlight line, with the
      `@highlight` marker lines dropped.

    All paths, extensions and columns are checked before the first text is returned, so a bad input fails at the
    call rather than halfway through training.

    Args:
        paths (`str`, `os.PathLike` or an iterable of them):
            One file or several files, read in the given order.
        text_column (`str` or `int`, *optional*):
            Column or field holding the text for JSON and table files. Ignored for `.txt` and `.story` files.

    Returns:
        `Iterator[str]`: The texts, file after file.

    Raises:
        ValueError: If no path is given, a file does not exist, its extension is unsupported, the text column is
            missing (the message lists the available ones) or a JSON line cannot be parsed.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = [Path(path) for path in paths]
    if not files:
        raise ValueError("`paths` is empty: give at least one file to read texts from.")
    readers = [_prepare_reader(path, text_column) for path in files]
    return itertools.chain.from_iterable(reader() for reader in readers)


def _prepare_reader(path: Path, text_column: str | int | None) -> Any:
    """Validates `path` eagerly and returns a zero-argument callable producing its texts."""
    if not path.exists():
        raise ValueError(f"File not found: '{path}'.")
    if not path.is_file():
        raise ValueError(f"'{path}' is not a file.")
    suffix = path.suffix.lower()
    if suffix == ".txt":
        _warn_if_json_lines(path)
        return lambda: _read_txt(path)
    if suffix == ".story":
        return lambda: _read_story(path)
    if suffix in (".jsonl", ".json"):
        if isinstance(text_column, int):
            raise ValueError(
                f"An integer `text_column` ({text_column}) only applies to .csv/.tsv files, not '{path}'."
            )
        field = _resolve_json_field(path, text_column)
        return lambda: _read_jsonl(path, field)
    if suffix in (".csv", ".tsv"):
        delimiter = "\t" if suffix == ".tsv" else ","
        quoted = suffix == ".csv" or tsv_is_csv_quoted(path)
        index, has_header = _resolve_table_column(path, text_column, delimiter, quoted)
        return lambda: _read_table(path, index, has_header, delimiter, quoted)
    raise ValueError(
        f"Unsupported file extension '{path.suffix}' for '{path}'; expected one of {', '.join(SUPPORTED_EXTENSIONS)}."
    )


def _warn_if_json_lines(path: Path) -> None:
    """A `.txt` file is one text per line; one whose first line is a JSON object (e.g. PubMed in Cohan et al.'s
    format) would be learnt with its JSON syntax and field names."""
    first = next(_read_txt(path), "")
    try:
        is_object = isinstance(json.loads(first), dict)
    except ValueError:
        is_object = False
    if is_object:
        logger.warning(
            "'%s' is read as plain text, one text per line, but its first line is a JSON object: its JSON syntax "
            "and field names become text. Name the file .jsonl (with `text_column`) to read one field.",
            path,
        )


def _read_txt(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line:
                yield line


def _read_story(path: Path) -> Iterator[str]:
    article, highlights = story_parts(path)
    yield from article
    yield from highlights


def iter_json_records(path: Path) -> Iterator[tuple[int, Any]]:
    """`(line number, record)` of a JSON Lines file, or of a whole-file JSON array (`.json`)."""
    with path.open(encoding="utf-8") as handle:
        head = handle.read(4096).lstrip()
    if path.suffix.lower() == ".json" and head.startswith("["):
        # A whole-file JSON array rather than JSON Lines.
        try:
            records = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"Invalid JSON in '{path}': {err}.") from err
        yield from enumerate(records, start=1)
        return
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"Invalid JSON on line {line_number} of '{path}': {err}.") from err


def _resolve_json_field(path: Path, text_column: str | None) -> str:
    first = next(iter_json_records(path), None)
    if first is None:
        raise ValueError(f"'{path}' contains no JSON records.")
    _, record = first
    if not isinstance(record, dict):
        raise ValueError(f"'{path}' must contain JSON objects, found {type(record).__name__}.")
    if text_column is not None:
        if text_column not in record:
            raise ValueError(
                f"Column '{text_column}' not found in '{path}'; available columns: {', '.join(map(str, record))}."
            )
        return text_column
    if isinstance(record.get("text"), str):
        return "text"
    string_fields = [key for key, value in record.items() if isinstance(value, str)]
    if len(string_fields) == 1:
        return string_fields[0]
    raise ValueError(
        f"Cannot pick the text column of '{path}': pass `text_column`; available columns: "
        f"{', '.join(map(str, record))}."
    )


def _read_jsonl(path: Path, field: str) -> Iterator[str]:
    for line_number, record in iter_json_records(path):
        if not isinstance(record, dict) or field not in record:
            raise ValueError(f"Record {line_number} of '{path}' has no column '{field}'.")
        text = _as_text(record[field])
        if text is not None and text.strip():
            yield text


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    # Sentence-split corpora (PubMed/arXiv `article_text`, `abstract_text`) store a document as a list of strings.
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return " ".join(value)
    return None


def _is_csv_quoted_field(field: str) -> bool:
    # A CSV writer wraps the field in quotes and doubles any quote inside it; removing the doubled quotes must leave
    # no lone quote behind.
    return len(field) >= 2 and field[0] == field[-1] == '"' and '"' not in field[1:-1].replace('""', "")


def tsv_is_csv_quoted(path: Path) -> bool:
    """Whether a TSV file wraps fields in double quotes CSV-style (AG News, IMDB) rather than raw (GLUE)."""
    found_quoted = False
    with path.open(encoding="utf-8", newline="") as handle:
        for line in handle:
            for field in line.rstrip("\r\n").split("\t"):
                if field.startswith('"'):
                    if not _is_csv_quoted_field(field):
                        # GLUE-style literal quotes: stop at the first counterexample.
                        return False
                    found_quoted = True
    return found_quoted


def _table_reader(handle: Any, delimiter: str, quoted: bool) -> Iterator[list[str]]:
    if quoted:
        return csv.reader(handle, delimiter=delimiter)
    return csv.reader(handle, delimiter=delimiter, quoting=csv.QUOTE_NONE)


def _resolve_table_column(path: Path, text_column: str | int | None, delimiter: str, quoted: bool) -> tuple[int, bool]:
    # `utf-8-sig` drops the byte-order mark some GLUE files (MRPC) start with, so the first header name matches.
    with path.open(encoding="utf-8-sig", newline="") as handle:
        header = next(_table_reader(handle, delimiter, quoted), None)
    if header is None:
        raise ValueError(f"'{path}' is empty.")
    if isinstance(text_column, int) and not isinstance(text_column, bool):
        if not 0 <= text_column < len(header):
            raise ValueError(
                f"Column index {text_column} is out of range for '{path}', which has {len(header)} columns."
            )
        return text_column, False
    if text_column is not None:
        if text_column not in header:
            raise ValueError(f"Column '{text_column}' not found in '{path}'; available columns: {', '.join(header)}.")
        return header.index(text_column), True
    for name in _DEFAULT_TABLE_COLUMNS:
        if name in header:
            return header.index(name), True
    raise ValueError(
        f"Cannot pick the text column of '{path}': pass `text_column` (a name, or an index for a file without a "
        f"header); available columns: {', '.join(header)}."
    )


def _read_table(path: Path, index: int, has_header: bool, delimiter: str, quoted: bool) -> Iterator[str]:
    with path.open(encoding="utf-8-sig", newline="") as handle:
        rows = _table_reader(handle, delimiter, quoted)
        if has_header:
            next(rows, None)
        for row in rows:
            if index < len(row) and row[index].strip():
                yield row[index]


# --------------------------------------------------------------------------------------------------------------------
# `datasets` reader
# --------------------------------------------------------------------------------------------------------------------

# Local file extension -> `datasets` packaged builder, so a plain file path can be given as `name_or_path`.
_BUILDER_FOR_EXTENSION = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "csv"}


def iter_texts_from_dataset(
    name_or_path: str,
    *,
    split: str = "train",
    text_column: str = "text",
    config_name: str | None = None,
    data_files: str | Sequence[str] | None = None,
    cache_dir: str | None = None,
) -> Iterator[str]:
    """
    Stream training texts from a `datasets` dataset.

    Args:
        name_or_path (`str`):
            A packaged builder name used with `data_files` (`"text"`, `"json"`, `"csv"`, ...), a local dataset
            directory, a local data file (its extension picks the builder) or a Hugging Face Hub dataset name. Only a
            Hub name makes `datasets` go online, and only because the caller asked for it.
        split (`str`, *optional*, defaults to `"train"`):
            Split to read.
        text_column (`str`, *optional*, defaults to `"text"`):
            Column holding the text. A column holding lists of strings is joined with spaces.
        config_name (`str`, *optional*):
            Dataset configuration name (e.g. `"wikitext-2-raw-v1"`).
        data_files (`str` or `list[str]`, *optional*):
            Data files for a packaged builder.
        cache_dir (`str`, *optional*):
            `datasets` cache directory; defaults to the `datasets` default.

    Returns:
        `Iterator[str]`: The non-blank texts of the split, in order.

    Raises:
        ValueError: If the split or the column does not exist.
    """
    from .extras import require

    require("train", "datasets")
    from datasets import load_dataset  # Imported lazily: `datasets` is slow to import and only needed here.

    builder = name_or_path
    local = Path(name_or_path)
    if data_files is None and local.is_file():
        if local.suffix.lower() not in _BUILDER_FOR_EXTENSION:
            raise ValueError(
                f"Unsupported file extension '{local.suffix}' for '{local}'; expected one of "
                f"{', '.join(_BUILDER_FOR_EXTENSION)}."
            )
        builder, data_files = _BUILDER_FOR_EXTENSION[local.suffix.lower()], str(local)
    kwargs: dict[str, Any] = {}
    if builder == "csv" and data_files is not None:
        files = [data_files] if isinstance(data_files, str) else list(data_files)
        if all(str(file).lower().endswith(".tsv") for file in files):
            kwargs["sep"] = "\t"
    if data_files is not None:
        # A bare string becomes the "train" split in `datasets`; keep it so `split="train"` finds it.
        kwargs["data_files"] = data_files if isinstance(data_files, str) else list(data_files)

    dataset_dict = load_dataset(builder, config_name, cache_dir=cache_dir, **kwargs)
    if split not in dataset_dict:
        raise ValueError(
            f"Split '{split}' not found in '{name_or_path}'; available splits: {', '.join(dataset_dict)}."
        )
    dataset = dataset_dict[split]
    if text_column not in dataset.column_names:
        raise ValueError(
            f"Column '{text_column}' not found in '{name_or_path}'; available columns: "
            f"{', '.join(dataset.column_names)}."
        )
    return _iter_dataset_column(dataset, text_column)


def _iter_dataset_column(dataset: Any, text_column: str) -> Iterator[str]:
    # Iterating one column avoids materialising the other (possibly large) columns of each row.
    for value in dataset.select_columns([text_column]):
        text = _as_text(value[text_column])
        if text is not None and text.strip():
            yield text

"""The long-input tasks: IMDB reviews as WordPiece tokens, LRA Text (the same reviews as bytes) and LRA ListOps.

Every task yields examples as token-id lists that start with `[CLS]` (id 2) and end with `[SEP]` (id 3), with `[PAD]`
= 0, as the zoo's WordPiece tokenizers do, so one model config serves all of them. Truncation to the run's length is
counted and reported, never silent.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import itertools
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..tokenization import SPECIAL_TOKENS, train_wordpiece_tokenizer, tsv_is_csv_quoted
from ..training.data.listops import VOCABULARY as LISTOPS_VOCABULARY
from ..training.data.listops import ListOpsSettings, generate_listops, shallow_baselines
from .byte_ngrams import byte_ngram_accuracy

PAD_ID, CLS_ID, SEP_ID, MASK_ID = (SPECIAL_TOKENS.index(token) for token in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
FIRST_SYMBOL_ID = len(SPECIAL_TOKENS)
TASK_NAMES = ("imdb", "text", "listops")
#: Training trees the ListOps reference predictors (majority class, first operator) are fitted on.
BASELINE_FIT_EXAMPLES = 2000
#: LRA's protocol for its tasks, whatever the model: classify from the first token (`pooling_mode = "CLS"` in its
#: ListOps config, `classifier_pool = "CLS"` in its Text config). The zoo's sparse families pool the mean by default,
#: which read IMDB better (the long-inputs study); on ListOps it hides the outermost operator the answer hangs on.
LRA_MODEL_OVERRIDES: dict[str, Any] = {"classifier_pooling": "cls"}
#: What the Text task may pool (`text_task(pooling=...)`): LRA's first token, or the mean of the real tokens.
TEXT_POOLINGS = ("cls", "mean")

Example = tuple[list[int], int]


@dataclass
class TaskData:
    """
    A task encoded at one input length.

    Args:
        name: `"imdb"`, `"text"` or `"listops"`.
        length: longest input in tokens (`[CLS]` and `[SEP]` included); longer examples are truncated and counted.
        vocab_size / num_labels: for the model config.
        train_stream: `seed -> endless iterator of training examples` (epochs of a shuffled list, or a generator).
        validation: the fixed validation examples.
        info: what a reader of the results needs (split sizes and seeds, truncation counts, tokenizer).
        model_overrides: config fields every family gets on this task (the benchmark's protocol), under each row's
            own overrides; also listed in `info`.
    """

    name: str
    length: int
    vocab_size: int
    num_labels: int
    train_stream: Callable[[int], Iterator[Example]]
    validation: list[Example]
    info: dict[str, Any] = field(default_factory=dict)
    model_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.info = {**self.info, "model_overrides": dict(self.model_overrides)}


def _wrap(symbol_ids: Sequence[int], length: int) -> tuple[list[int], bool]:
    """`[CLS] symbols [SEP]` cut to `length` tokens (the `[SEP]` kept); returns the ids and whether it was cut."""
    if length < 2:
        raise ValueError(f"The input length must leave room for [CLS] and [SEP], got {length}.")
    truncated = len(symbol_ids) > length - 2
    return [CLS_ID, *symbol_ids[: length - 2], SEP_ID], truncated


def epoch_stream(examples: list[Example]) -> Callable[[int], Iterator[Example]]:
    def stream(seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        order = list(range(len(examples)))
        while True:
            rng.shuffle(order)
            yield from (examples[i] for i in order)

    return stream


def read_reviews(path: str | Path) -> list[tuple[str, int]]:
    """`(text, label)` rows of a `text<TAB>label` file with a header (the IMDB subset's layout; CSV-quoted or not)."""
    csv.field_size_limit(1 << 30)
    quoting = csv.QUOTE_MINIMAL if tsv_is_csv_quoted(Path(path)) else csv.QUOTE_NONE
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=quoting))
    if not rows or not {"text", "label"} <= set(rows[0]):
        raise ValueError(f"{path} must be a TSV with the columns `text` and `label`.")
    return [(row["text"], int(row["label"])) for row in rows]


def reviews_digest(path: str | Path) -> str:
    """`sha256:<16 hex digits>` of a reviews file: what a results folder records to refuse runs on other data."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def split_reviews(
    reviews: list[tuple[str, int]], validation_size: int, seed: int
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """A fixed random train / validation split (`validation_size` reviews, permutation seeded by `seed`)."""
    if not 0 < validation_size < len(reviews):
        raise ValueError(f"validation_size must be in (0, {len(reviews)}), got {validation_size}.")
    order = list(range(len(reviews)))
    random.Random(seed).shuffle(order)
    validation = [reviews[i] for i in order[:validation_size]]
    train = [reviews[i] for i in order[validation_size:]]
    return train, validation


def _encode_all(items: list[tuple[Sequence[int], int]], length: int) -> tuple[list[Example], int]:
    encoded, cut = [], 0
    for symbols, label in items:
        ids, truncated = _wrap(symbols, length)
        encoded.append((ids, label))
        cut += truncated
    return encoded, cut


def position_reach(examples: list[Example], length: int) -> dict[str, int]:
    """`{"p": how many examples hold a token at position p}` for p = 512, 1024, ... below `length`.

    A learned position table trains row `p` on these examples only: the rows past the typical length see a fraction
    of the data (the long-inputs study: position handling).
    """
    marks = [512 * 2**k for k in range(16) if 512 * 2**k < length]
    return {str(p): sum(len(ids) > p for ids, _ in examples) for p in marks}


def _split_info(
    train: list[Example], validation: list[Example], cut_train: int, cut_validation: int, length: int, **extra: Any
) -> dict[str, Any]:
    return {
        "train_examples": len(train),
        "validation_examples": len(validation),
        "train_truncated": cut_train,
        "validation_truncated": cut_validation,
        "train_reaching_position": position_reach(train, length),
        **extra,
    }


def _split_tokenizer(
    train: list[tuple[str, int]], vocab_size: int, folder: Path | None, split: dict[str, Any]
) -> PreTrainedTokenizerBase:
    """The WordPiece tokenizer of a split's training reviews.

    Training one is not reproducible: the trainer breaks ties between equally frequent merges differently from run to
    run (two trainings on the same reviews differ in a few hundred of 8,000 entries). So with `folder` the first run
    saves its tokenizer there and every later one (another length, a resumed run, another process on the same results
    folder) reads that one: all rows of a folder see the same token ids.

    Raises:
        ValueError: `folder` holds a tokenizer of another split (`split`: reviews, sizes, seed, vocabulary).
    """
    if folder is None:
        return train_wordpiece_tokenizer((text for text, _ in train), vocab_size=vocab_size)
    record = folder / "split.json"
    if not record.is_file():
        trained = train_wordpiece_tokenizer((text for text, _ in train), vocab_size=vocab_size)
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
        trained.save_pretrained(staging)
        (staging / "split.json").write_text(json.dumps(split, indent=1) + "\n", encoding="utf-8")
        try:
            os.rename(staging, folder)  # atomic: another process sees no folder or a complete one
        except OSError:  # another process saved its tokenizer first: every run uses that one
            shutil.rmtree(staging, ignore_errors=True)
    stored = json.loads(record.read_text(encoding="utf-8"))
    if stored != split:
        raise ValueError(
            f"{folder} holds the tokenizer of another split ({stored}), not {split}; use a new output folder."
        )
    return AutoTokenizer.from_pretrained(folder)


def imdb_task(
    reviews_file: str | Path,
    length: int,
    *,
    validation_size: int = 500,
    split_seed: int = 0,
    vocab_size: int = 8000,
    tokenizer_dir: str | Path | None = None,
) -> TaskData:
    """IMDB sentiment with a WordPiece tokenizer trained on the training part of the split only (saved in and read
    from `tokenizer_dir` when given, so that every run of a results folder uses the same one)."""
    train, validation = split_reviews(read_reviews(reviews_file), validation_size, split_seed)
    split = {
        "reviews": reviews_digest(reviews_file),
        "validation_size": validation_size,
        "split_seed": split_seed,
        "vocab_size": vocab_size,
    }
    tokenizer = _split_tokenizer(train, vocab_size, None if tokenizer_dir is None else Path(tokenizer_dir), split)

    def ids(rows: list[tuple[str, int]]) -> list[tuple[list[int], int]]:
        # Without special tokens: `_wrap` adds them and counts what the length cuts off (so the tokenizer's warning
        # about sequences over `model_max_length` says nothing new: verbose=False).
        encoded = tokenizer([text for text, _ in rows], add_special_tokens=False, verbose=False)["input_ids"]
        return [(row, label) for row, (_, label) in zip(encoded, rows, strict=True)]

    train_examples, cut_train = _encode_all(ids(train), length)
    validation_examples, cut_validation = _encode_all(ids(validation), length)
    return TaskData(
        "imdb",
        length,
        len(tokenizer),
        2,
        epoch_stream(train_examples),
        validation_examples,
        _split_info(
            train_examples,
            validation_examples,
            cut_train,
            cut_validation,
            length,
            split_seed=split_seed,
            tokenizer=f"WordPiece {len(tokenizer)} trained on the training split"
            + ("" if tokenizer_dir is None else f" (saved in {Path(tokenizer_dir).name}/)"),
        ),
    )


def text_task(
    reviews_file: str | Path, length: int, *, validation_size: int = 500, split_seed: int = 0, pooling: str = "cls"
) -> TaskData:
    """LRA Text: the same reviews and split as [`imdb_task`], one token per UTF-8 byte.

    `pooling` is the task's `classifier_pooling` for every family: `"cls"` is LRA's protocol; `"mean"` (the sparse
    families' default) lets small byte-level models learn on a CPU budget (the long-inputs study).
    """
    if pooling not in TEXT_POOLINGS:
        raise ValueError(f"The Text task's pooling must be one of {TEXT_POOLINGS}, got {pooling!r}.")
    train, validation = split_reviews(read_reviews(reviews_file), validation_size, split_seed)

    def ids(rows: list[tuple[str, int]]) -> list[tuple[list[int], int]]:
        return [([FIRST_SYMBOL_ID + b for b in text.encode("utf-8")], label) for text, label in rows]

    def read(rows: list[tuple[str, int]]) -> list[tuple[bytes, int]]:
        return [(text.encode("utf-8")[: length - 2], label) for text, label in rows]  # what a model reads

    train_examples, cut_train = _encode_all(ids(train), length)
    validation_examples, cut_validation = _encode_all(ids(validation), length)
    # The bar to read the models against: what a bag of byte n-grams gets from the same bytes.
    shallow = byte_ngram_accuracy(read(train), read(validation))
    return TaskData(
        "text",
        length,
        FIRST_SYMBOL_ID + 256,
        2,
        epoch_stream(train_examples),
        validation_examples,
        _split_info(
            train_examples,
            validation_examples,
            cut_train,
            cut_validation,
            length,
            split_seed=split_seed,
            tokenizer="bytes",
            byte_ngram_accuracy=shallow,
        ),
        {**LRA_MODEL_OVERRIDES, "classifier_pooling": pooling},
    )


def check_listops_fits(length: int, settings: ListOpsSettings) -> None:
    """Check that every tree `settings` generates fits `length` whole, with `[CLS]` and `[SEP]`.

    Raises:
        ValueError: The longest tree of `settings` plus `[CLS]` and `[SEP]` does not fit `length`. A cut tree would
            keep the label of the whole tree: a wrong label, not a shorter example.
    """
    if settings.max_length > length - 2:
        raise ValueError(
            f"ListOps trees of up to {settings.max_length} tokens plus [CLS] and [SEP] do not fit length {length}: "
            f"use a length of at least {settings.max_length + 2}, or trees of at most {length - 2} tokens "
            "(`ListOpsSettings.max_length`, `--listops_tree_lengths`)."
        )


@dataclass(frozen=True)
class ListOpsCurriculum:
    """
    A length curriculum for ListOps: the first `examples` training examples are trees of `settings` (shorter ones),
    the rest trees of the task's own shape. Validation is always the task's own trees.

    A classifier leaves the label prior by learning that the pooled token must read the outermost operator; with trees
    of 500-2000 tokens that signal is spread over ~1,100 positions at initialisation, and at a CPU budget dense
    attention itself never finds it (the long-inputs study, `results/listops-2048-cpu/`). Short trees teach it
    first.

    Args:
        settings: shape of the first trees (e.g. 100-500 tokens).
        examples: how many training examples come from `settings` (the runner's steps times its batch size).

    Raises:
        ValueError: `examples` below 1.
    """

    settings: ListOpsSettings
    examples: int

    def __post_init__(self) -> None:
        if self.examples < 1:
            raise ValueError(f"`examples` of a ListOps curriculum must be >= 1, got {self.examples}.")

    def describe(self) -> dict[str, Any]:
        """JSON-able record of the curriculum (the task's `info["curriculum"]`)."""
        return {"examples": self.examples, "generator": dataclasses.asdict(self.settings)}


def listops_task(
    length: int,
    *,
    validation_size: int = 500,
    validation_seed: int = 1_000_003,
    settings: ListOpsSettings | None = None,
    curriculum: ListOpsCurriculum | None = None,
) -> TaskData:
    """ListOps: training examples generated on the fly from the run's seed; a fixed validation set of its own seed.
    Every tree fits `length` whole (the label is the value of the whole tree). With a `curriculum`, the training
    stream starts with its trees ([`ListOpsCurriculum`]); validation trees are `settings`' either way.

    The validation stream's seed differs from every training seed used by the runner (small integers), so the two
    are independent draws; an exact repeat of a 500-2000 token tree is practically impossible.
    """
    settings = settings or ListOpsSettings()
    check_listops_fits(length, settings)
    if curriculum is not None:
        check_listops_fits(length, curriculum.settings)
    symbol = {s: FIRST_SYMBOL_ID + i for i, s in enumerate(LISTOPS_VOCABULARY)}

    def encoded(stream: Iterable[tuple[list[str], int]]) -> Iterator[tuple[Example, bool]]:
        for tokens, label in stream:
            ids, truncated = _wrap([symbol[t] for t in tokens], length)
            yield (ids, label), truncated

    validation_trees = list(itertools.islice(generate_listops(validation_seed, settings), validation_size))
    validation_pairs = list(encoded(validation_trees))
    validation = [example for example, _ in validation_pairs]
    cut_validation = sum(truncated for _, truncated in validation_pairs)
    # What reading (almost) nothing scores, fitted on the default training stream: the bars to read results against.
    fit_trees = itertools.islice(generate_listops(0, settings), BASELINE_FIT_EXAMPLES)
    baselines = shallow_baselines(fit_trees, validation_trees)

    def train_stream(seed: int) -> Iterator[Example]:
        trees = generate_listops(seed, settings)
        if curriculum is not None:
            first = itertools.islice(generate_listops(seed, curriculum.settings), curriculum.examples)
            trees = itertools.chain(first, trees)
        return (example for example, _ in encoded(trees))

    return TaskData(
        "listops",
        length,
        FIRST_SYMBOL_ID + len(LISTOPS_VOCABULARY),
        10,
        train_stream,
        validation,
        {
            "train_examples": "generated (steps x batch)",
            "validation_examples": len(validation),
            "validation_truncated": cut_validation,
            "validation_seed": validation_seed,
            "majority_class_accuracy": baselines["majority_class"],
            "first_operator_accuracy": baselines["first_operator"],
            "generator": dataclasses.asdict(settings),
            **({} if curriculum is None else {"curriculum": curriculum.describe()}),
        },
        dict(LRA_MODEL_OVERRIDES),
    )

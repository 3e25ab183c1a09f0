"""Argument dataclasses of the training scripts and a parser that takes a YAML/JSON recipe plus overrides.

A recipe (`configs/train/*.yaml`) is a flat mapping of argument names to values, covering these dataclasses and
transformers' `TrainingArguments` / `Seq2SeqTrainingArguments`. Paths in a recipe are relative to the working
directory (run the scripts from the repository root).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser

RECIPE_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class ModelArguments:
    """
    Which model to train and how to build it.

    Three ways to get a model: `config_path` alone builds a fresh model from an architecture file;
    `model_name_or_path` alone loads a checkpoint (to fine-tune or continue); both together warm-start the
    architecture of `config_path` from the checkpoint (e.g. a dense MLM into a sparse family): parameters are loaded
    name for name, the method's own new parameters are initialised fresh, and the missing/unexpected keys are
    reported. With `family`, `model_name_or_path` is a BERT / RoBERTa checkpoint that is first converted into that
    family at `max_position_embeddings` positions (into `<output_dir>/converted`, see `attnzoo.conversion`).

    Args:
        config_path (`str`, *optional*):
            Architecture: a `config.json`-style file such as `configs/models/smart_bird/small.json`, or a folder
            holding a `config.json`.
        model_name_or_path (`str`, *optional*):
            Checkpoint folder (or Hub name) to fine-tune, or the source of a warm start when `config_path` is set.
        tokenizer_name_or_path (`str`, *optional*):
            Tokenizer folder (from `scripts/train_tokenizer.py`) or Hub name; defaults to `model_name_or_path`.
        config_overrides (`dict` or `str`, *optional*):
            Config fields to override: a mapping in a recipe, or `"field=value,field=value"` on the command line
            (e.g. `"hidden_dropout_prob=0.0,num_hidden_layers=4"`). Unknown fields are an error.
        cache_dir (`str`, *optional*):
            Cache folder for Hub downloads.
        family (`str`, *optional*):
            Convert the BERT / RoBERTa `model_name_or_path` into this `model_type` first (`config_overrides` set its
            method fields); the run then trains the converted checkpoint.
        max_position_embeddings (`int`, *optional*):
            Length of that conversion (required with `family`).
    """

    config_path: str | None = field(
        default=None, metadata={"help": "Architecture file (configs/models/<family>/<size>.json) or folder."}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Checkpoint to fine-tune, or to warm-start `config_path` from."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub name (defaults to model_name_or_path)."}
    )
    config_overrides: dict | str | None = field(
        default=None, metadata={"help": "Config fields to override, 'field=value,field=value'."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Cache folder for Hub downloads."})
    family: str | None = field(
        default=None, metadata={"help": "Convert the BERT/RoBERTa model_name_or_path into this model_type first."}
    )
    max_position_embeddings: int | None = field(
        default=None, metadata={"help": "Length of the conversion (with --family)."}
    )

    def __post_init__(self) -> None:
        _unset_empty_strings(self, ("config_path", "model_name_or_path", "tokenizer_name_or_path", "family"))
        if self.config_path is None and self.model_name_or_path is None:
            raise ValueError("Give `config_path` (a fresh model), `model_name_or_path` (a checkpoint), or both.")
        if self.family is not None:
            if self.model_name_or_path is None or self.max_position_embeddings is None:
                raise ValueError(
                    "`family` converts a BERT / RoBERTa checkpoint: give it as `model_name_or_path`, with the new "
                    "length as `max_position_embeddings`."
                )
            if self.config_path is not None:
                raise ValueError(
                    "Give either `family` (convert a BERT / RoBERTa checkpoint) or `config_path`, not both."
                )
        elif self.max_position_embeddings is not None:
            raise ValueError(
                "`max_position_embeddings` is the length of a conversion and needs `family`; to lengthen a fresh "
                "model use `config_overrides`."
            )
        if self.tokenizer_name_or_path is None:
            if self.model_name_or_path is None:
                raise ValueError("`tokenizer_name_or_path` is required when no `model_name_or_path` is given.")
            self.tokenizer_name_or_path = self.model_name_or_path


def _unset_empty_strings(arguments: Any, names: tuple[str, ...]) -> None:
    """An empty string (e.g. `--config_path ""` over a recipe's) means "not given"."""
    for name in names:
        if getattr(arguments, name) == "":
            setattr(arguments, name, None)


@dataclass
class _SourceArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset name (needs network)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Local training data file."})
    validation_file: str | None = field(default=None, metadata={"help": "Local validation data file."})
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training examples (reported in the metrics)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N evaluation examples (reported in the metrics)."}
    )
    max_train_seconds: float | None = field(
        default=None,
        metadata={
            "help": "Stop training after this many seconds (then save and evaluate as usual); the metrics record "
            "the steps done and whether the limit stopped the run."
        },
    )

    def _check_source(self) -> None:
        _unset_empty_strings(self, ("dataset_name", "dataset_config_name", "train_file", "validation_file"))
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("Give a `dataset_name` or local `train_file` / `validation_file`.")
        if self.dataset_name is not None and (self.train_file or self.validation_file):
            raise ValueError("Give either `dataset_name` or local files (`train_file`, `validation_file`), not both.")
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value}.")
        if self.max_train_seconds is not None and not self.max_train_seconds > 0:
            raise ValueError(f"`max_train_seconds` must be a positive number, got {self.max_train_seconds}.")


@dataclass
class MLMDataArguments(_SourceArguments):
    """
    Data of masked-language-model pretraining (`scripts/run_mlm.py`).

    Args:
        dataset_name / dataset_config_name (`str`, *optional*): a Hub dataset (e.g. `wikitext`,
            `wikitext-103-raw-v1`).
        train_file / validation_file (`str`, *optional*): local `.txt` (one text per line), `.jsonl`/`.json`,
            `.csv`/`.tsv`, `.parquet` or CNN/DailyMail `.story` files. Several files: comma-separated.
        text_column (`str`, *optional*): column holding the text (auto-detected when omitted).
        max_seq_length (`int`, *optional*, defaults to 512): length of the training blocks (up to the model's
            `max_position_embeddings`, e.g. 4096 for long-context pretraining).
        line_by_line (`bool`, *optional*, defaults to `False`): one example per text (truncated, counted) instead of
            concatenating texts and cutting them into blocks of `max_seq_length` tokens.
        mlm_probability (`float`, *optional*, defaults to 0.15): fraction of tokens to predict.
        validation_split_percentage (`int`, *optional*, defaults to 0): carve this percentage off the training
            texts for evaluation when no validation data is given.
        pad_to_multiple_of (`int`, *optional*): pad batches to a multiple of this (a method's block size).
    """

    text_column: str | None = field(default=None, metadata={"help": "Text column (auto-detected if omitted)."})
    max_seq_length: int = field(default=512, metadata={"help": "Block length in tokens."})
    line_by_line: bool = field(default=False, metadata={"help": "One example per text instead of packed blocks."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Fraction of tokens to mask."})
    validation_split_percentage: int = field(
        default=0, metadata={"help": "Percent of the training texts held out when no validation data is given."}
    )
    pad_to_multiple_of: int | None = field(default=None, metadata={"help": "Pad batches to a multiple of this."})

    def __post_init__(self) -> None:
        self._check_source()
        if self.max_seq_length < 8:
            raise ValueError(f"`max_seq_length` must be at least 8, got {self.max_seq_length}.")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"`mlm_probability` must be in (0, 1), got {self.mlm_probability}.")
        if not 0 <= self.validation_split_percentage < 100:
            raise ValueError(
                f"`validation_split_percentage` must be in [0, 100), got {self.validation_split_percentage}."
            )


@dataclass
class ClassificationDataArguments(_SourceArguments):
    """
    Data of GLUE and text-classification fine-tuning (`scripts/run_glue.py`).

    Args:
        task_name (`str`, *optional*): a GLUE task (`cola`, `sst2`, `mrpc`, `stsb`, `qqp`, `mnli`, `qnli`, `rte`,
            `wnli`): sets the columns, labels and the official metric. Without it the data is any text
            classification set with a text (and optional text-pair) column and a label column (IMDB, AG News).
        dataset_name / dataset_config_name (`str`, *optional*): a Hub dataset; for a GLUE task without local files it
            defaults to `nyu-mll/glue` with the task as configuration.
        train_file / validation_file (`str`, *optional*): local `.tsv` (including the original GLUE layouts),
            `.csv`, `.jsonl`/`.json` or `.parquet` files.
        text_column / text_pair_column / label_column (`str`, *optional*): column names, or positions (`"0"`,
            `"1"`, ...) for a file without a header row (e.g. AG News `text<TAB>label`).
        max_seq_length (`int`, *optional*, defaults to 128): longer inputs are truncated and counted.
        skip_empty_rows (`bool`, *optional*, defaults to `False`): drop rows with an empty text or label (and report
            how many) instead of stopping with an error.
        pad_to_multiple_of (`int`, *optional*): pad batches to a multiple of this (a method's block size).
    """

    task_name: str | None = field(default=None, metadata={"help": "GLUE task name, or empty for any text data."})
    text_column: str | None = field(default=None, metadata={"help": "Text column (name or position)."})
    text_pair_column: str | None = field(default=None, metadata={"help": "Second text column of pair tasks."})
    label_column: str | None = field(default=None, metadata={"help": "Label column (name or position)."})
    max_seq_length: int = field(default=128, metadata={"help": "Maximum input length in tokens."})
    skip_empty_rows: bool = field(default=False, metadata={"help": "Drop (and count) rows with empty fields."})
    pad_to_multiple_of: int | None = field(default=None, metadata={"help": "Pad batches to a multiple of this."})

    def __post_init__(self) -> None:
        from .data import GLUE_TASKS, normalize_task_name

        if self.task_name is not None:
            self.task_name = normalize_task_name(self.task_name)
            if self.dataset_name is None and self.train_file is None and self.validation_file is None:
                self.dataset_name, self.dataset_config_name = "nyu-mll/glue", GLUE_TASKS[self.task_name].name
        self._check_source()
        if self.max_seq_length < 4:
            raise ValueError(f"`max_seq_length` must be at least 4, got {self.max_seq_length}.")


@dataclass
class FineTuningArguments:
    """
    How a checkpoint's new task head is trained (`scripts/run_glue.py`).

    Args:
        head_learning_rate (`float`, *optional*): peak learning rate of the head's parameters that the checkpoint did
            not provide (BERT's `classifier`, the zoo's `classifier.out_proj`; the whole head of a fresh model), on
            the same schedule as `learning_rate`, which trains every other parameter. Default: `learning_rate`.
    """

    head_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Peak learning rate of the task head's new parameters (default: learning_rate)."},
    )

    def __post_init__(self) -> None:
        from .head_learning_rate import check_head_learning_rate

        check_head_learning_rate(self.head_learning_rate)


@dataclass
class SummarizationDataArguments(_SourceArguments):
    """
    Data and generation settings of summarization (`scripts/run_summarization.py`).

    Args:
        dataset_name / dataset_config_name (`str`, *optional*): a Hub dataset (e.g. `abisee/cnn_dailymail` /
            `3.0.0`, `ccdv/pubmed-summarization`).
        train_file / validation_file (`str`, *optional*): JSON lines (including the PubMed/arXiv format of Cohan et
            al. with `article_text` / `abstract_text` sentence lists and `<S>` tags), `.csv`, `.parquet`, or a
            folder of CNN/DailyMail `.story` files.
        train_url_list / validation_url_list (`str`, *optional*): for a `.story` folder, the CNN/DailyMail URL list
            selecting the split (stories are named by the SHA-1 of their URL); every listed story must exist.
        text_column / summary_column (`str`, *optional*): columns of the document and of the reference summary
            (auto-detected for the common layouts).
        max_source_length (`int`, *optional*, defaults to 1024): input length (4096 for the long-document setting).
        max_target_length (`int`, *optional*, defaults to 128): reference summary length in training and evaluation.
        generation_max_new_tokens / num_beams / no_repeat_ngram_size / length_penalty: decoding settings, written
            into the model's generation config (and saved with it).
        skip_empty_rows (`bool`, *optional*, defaults to `False`): drop (and count) empty documents or summaries
            instead of stopping with an error.
        pad_to_multiple_of (`int`, *optional*): pad inputs to a multiple of this (a method's block size).
    """

    train_url_list: str | None = field(default=None, metadata={"help": "CNN/DM URL list for the training split."})
    validation_url_list: str | None = field(
        default=None, metadata={"help": "CNN/DM URL list for the validation split."}
    )
    text_column: str | None = field(default=None, metadata={"help": "Document column (auto-detected if omitted)."})
    summary_column: str | None = field(default=None, metadata={"help": "Summary column (auto-detected)."})
    max_source_length: int = field(default=1024, metadata={"help": "Maximum input length in tokens."})
    max_target_length: int = field(default=128, metadata={"help": "Maximum summary length in tokens."})
    generation_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Longest generated summary (defaults to max_target_length)."}
    )
    num_beams: int = field(default=1, metadata={"help": "Beam size for generation."})
    no_repeat_ngram_size: int = field(default=0, metadata={"help": "Forbid repeating n-grams of this size (0: off)."})
    length_penalty: float = field(default=1.0, metadata={"help": "Beam-search length penalty."})
    skip_empty_rows: bool = field(default=False, metadata={"help": "Drop (and count) rows with empty fields."})
    pad_to_multiple_of: int | None = field(default=None, metadata={"help": "Pad inputs to a multiple of this."})

    def __post_init__(self) -> None:
        self._check_source()
        for name in ("max_source_length", "max_target_length", "num_beams"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)}.")
        if self.generation_max_new_tokens is None:
            self.generation_max_new_tokens = self.max_target_length


def parse_arguments(dataclass_types: Sequence[type], argv: Sequence[str] | None = None) -> tuple[Any, ...]:
    """
    Parse command-line arguments into dataclasses, optionally starting from a YAML/JSON recipe.

    When the first argument is a `.yaml`/`.yml`/`.json` file, its mapping supplies the values and the remaining
    command-line flags override them (`run_glue.py configs/train/x.yaml --learning_rate 3e-4`). Keys of the recipe
    that no dataclass knows are an error.

    Args:
        dataclass_types (`Sequence[type]`): the dataclasses to fill (e.g. `ModelArguments`, `TrainingArguments`).
        argv (`Sequence[str]`, *optional*): arguments without the program name; defaults to `sys.argv[1:]`.

    Returns:
        `tuple`: one instance per dataclass, in order.

    Raises:
        ValueError: for a missing or malformed recipe, unknown recipe keys or invalid values.
    """
    parser = HfArgumentParser(list(dataclass_types))
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-") and args[0].lower().endswith(RECIPE_SUFFIXES):
        recipe = read_recipe(Path(args.pop(0)))
        known = {action.dest for action in parser._actions}
        unknown = sorted(set(recipe) - known)
        if unknown:
            raise ValueError(f"Unknown keys in the recipe: {', '.join(unknown)}.")
        for action in parser._actions:
            if action.dest in recipe:
                # A value from the recipe satisfies a required flag.
                action.required = False
        parser.set_defaults(**recipe)
    return tuple(parser.parse_args_into_dataclasses(args=args))


def read_recipe(path: Path) -> dict[str, Any]:
    """The argument names and values of a YAML/JSON recipe; `ValueError` naming the file if it is missing or is not
    a mapping."""
    if not path.is_file():
        raise ValueError(f"Recipe file not found: '{path}'.")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"Cannot parse the recipe '{path}': {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"The recipe '{path}' must hold a mapping of argument names to values.")
    return data

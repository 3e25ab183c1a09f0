#!/usr/bin/env python
"""Train an attnzoo WordPiece tokenizer and save it with `save_pretrained`.

Examples:

```bash
# From local files (.txt, .jsonl/.json, .csv/.tsv, CNN/DailyMail .story)
python scripts/train_tokenizer.py --files tests/fixtures/data/text/wikitext_train.txt \
    --vocab_size 8000 --output_dir out/tokenizer

# From a `datasets` builder with local data files (PubMed JSON lines, list-of-sentence column)
python scripts/train_tokenizer.py --dataset json --data_files tests/fixtures/data/pubmed/train.txt \
    --text_column article_text --output_dir out/pubmed-tokenizer

# From a Hub dataset (needs network access, which is then the user's explicit choice)
python scripts/train_tokenizer.py --dataset wikitext --dataset_config wikitext-103-raw-v1 --output_dir out/wt103
```
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from transformers import PreTrainedTokenizerFast

from attnzoo.tokenization import iter_texts_from_dataset, iter_texts_from_files, train_wordpiece_tokenizer

SAMPLE_TEXT = "Sparse attention lets Transformers read much longer documents."


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """
    Parse the command line.

    Args:
        argv (`Sequence[str]`, *optional*):
            Arguments without the program name; defaults to `sys.argv[1:]`.

    Returns:
        `argparse.Namespace`: The parsed options.
    """
    parser = argparse.ArgumentParser(description="Train a BERT-style WordPiece tokenizer for the attnzoo models.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--files", nargs="+", help="Local .txt, .jsonl/.json, .csv/.tsv or .story files.")
    source.add_argument("--dataset", help="`datasets` builder or Hub name, local dataset directory or data file.")
    parser.add_argument("--dataset_config", default=None, help="Dataset configuration name.")
    parser.add_argument("--data_files", nargs="+", default=None, help="Data files for a packaged `--dataset` builder.")
    parser.add_argument("--split", default="train", help="Dataset split (default: train).")
    parser.add_argument(
        "--text_column",
        default=None,
        help="Column/field with the text (default: auto-detect for files, `text` for datasets). For headerless "
        ".csv/.tsv files give the column position as an integer.",
    )
    parser.add_argument("--vocab_size", type=int, default=8000, help="Target vocabulary size (default: 8000).")
    parser.add_argument("--min_frequency", type=int, default=2, help="Minimum merge frequency (default: 2).")
    parser.add_argument("--model_max_length", type=int, default=512, help="Tokenizer model_max_length (default: 512).")
    parser.add_argument("--no_lowercase", action="store_true", help="Train a cased tokenizer (no lowercasing).")
    parser.add_argument("--output_dir", required=True, help="Directory for save_pretrained.")
    args = parser.parse_args(argv)
    if args.files is not None and (args.dataset_config or args.data_files or args.split != "train"):
        parser.error("--dataset_config, --data_files and --split only apply with --dataset.")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """
    Train, report and save a tokenizer.

    Args:
        argv (`Sequence[str]`, *optional*):
            Arguments without the program name; defaults to `sys.argv[1:]`.

    Returns:
        `int`: The process exit status (2 for bad inputs such as a missing file or column).
    """
    args = parse_args(argv)
    try:
        tokenizer = train_from_args(args)
    except ValueError as err:
        # Bad inputs (missing file, unknown column, ...) are user errors: report them without a traceback.
        print(f"error: {err}", file=sys.stderr)
        return 2

    encoding = tokenizer(SAMPLE_TEXT)
    print(f"vocab size: {len(tokenizer)}")
    print(f"sample: {SAMPLE_TEXT!r}")
    print(f"  tokens: {tokenizer.convert_ids_to_tokens(encoding['input_ids'])}")
    print(f"  ids:    {encoding['input_ids']}")
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved to {args.output_dir}")
    return 0


def train_from_args(args: argparse.Namespace) -> PreTrainedTokenizerFast:
    """
    Build the text stream named by the options and train on it.

    Args:
        args (`argparse.Namespace`):
            Options from [`parse_args`].

    Returns:
        [`~transformers.PreTrainedTokenizerFast`]: The trained tokenizer.
    """
    if args.files is not None:
        # An all-digit column is a position in a headerless table (e.g. GLUE CoLA column 3).
        column = int(args.text_column) if args.text_column and args.text_column.isdigit() else args.text_column
        texts = iter_texts_from_files(args.files, text_column=column)
    else:
        texts = iter_texts_from_dataset(
            args.dataset,
            split=args.split,
            text_column=args.text_column or "text",
            config_name=args.dataset_config,
            data_files=args.data_files,
        )
    return train_wordpiece_tokenizer(
        texts,
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        lowercase=not args.no_lowercase,
        model_max_length=args.model_max_length,
    )


if __name__ == "__main__":
    sys.exit(main())

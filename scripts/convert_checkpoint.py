#!/usr/bin/env python
"""Convert a BERT or RoBERTa checkpoint into an attnzoo family at a new length (or a BERT2BERT encoder-decoder).

    python scripts/convert_checkpoint.py --model_name_or_path outputs/bert-source --family smart_bird \
        --max_position_embeddings 4096 --output_dir outputs/smart_bird-from-bert
    python scripts/convert_checkpoint.py --model_name_or_path roberta-base --family dense_transformer \
        --max_position_embeddings 1024 --seq2seq --output_dir outputs/roberta2roberta

The report (every source tensor and where it went, every new tensor and its initialisation) is printed and saved as
`conversion_report.md` / `.json` beside the weights. Logic: `attnzoo.conversion`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from transformers import HfArgumentParser

import attnzoo  # noqa: F401  (registers the families)
from attnzoo.conversion import ConversionArguments, convert_checkpoint


def main(argv: Sequence[str] | None = None) -> int:
    """Run the conversion; returns the exit status (2 with one line on stderr for a source or option error)."""
    parser = HfArgumentParser(ConversionArguments, description=__doc__.split("\n\n")[0])
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    try:
        report = convert_checkpoint(
            args.model_name_or_path,
            args.family,
            args.max_position_embeddings,
            args.output_dir,
            config_overrides=args.config_overrides,
            seq2seq=args.seq2seq,
        )
    except ValueError as err:  # a ConversionError, or a config field the family does not have
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.render())
    print(f"Saved {report.target_class} to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

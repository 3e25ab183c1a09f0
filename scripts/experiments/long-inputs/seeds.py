"""Read a seed sweep of `run_long_eval.py` together: accuracy per seed, mean ± SD, paired differences to a baseline.

Each folder is one `run_long_eval.py --output_dir` (one seed). Rows are told apart by task, label, length and the
settings that differ between the folders read (e.g. `pretrain_steps`), so self-pretrained and from-scratch runs of the
same model are two rows. The logic lives in `attnzoo.evaluation.seeds`.

Example:
    # the study README's LRA Text table: from scratch (H100) and self-pretrained (H200), against self-pretrained dense
    python scripts/experiments/long-inputs/seeds.py \
        scripts/experiments/speed-memory/results/gpu-2026-11-26-h100/text/seed* \
        scripts/experiments/speed-memory/results/gpu-2026-11-26-h200/text/spt900-seed* \
        --baseline "dense_transformer [position_embedding_type=sinusoidal]@1024 (pretrain_steps=900)"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnzoo.evaluation.report import TASK_TITLES
from attnzoo.evaluation.seeds import find_row, load_seed_rows, seeds_markdown, seeds_records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="results folders of run_long_eval.py, one seed each")
    parser.add_argument(
        "--baseline",
        help="row the paired differences are taken against, as the table names it: 'LABEL@LENGTH' or "
        "'LABEL@LENGTH (PROTOCOL)' (without it the table has no differences)",
    )
    parser.add_argument("--task", choices=sorted(TASK_TITLES), default="text", help="the baseline's task")
    parser.add_argument("--output", help="write the Markdown to this .md file and the numbers beside it as .json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.output and not args.output.endswith(".md"):
        raise SystemExit(f"--output names the Markdown file (NAME.md; the numbers go to NAME.json), got {args.output}")
    try:
        rows = load_seed_rows(args.folders)
        baselines = {} if args.baseline is None else {args.task: find_row(rows, args.task, args.baseline)}
    except ValueError as error:  # a missing folder or row, or a seed twice: the message says which
        raise SystemExit(f"seeds: {error}") from None
    markdown = seeds_markdown(rows, baselines)
    print(markdown)
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(markdown, encoding="utf-8")
        text = json.dumps(seeds_records(rows, baselines), indent=1, allow_nan=False)
        output.with_suffix(".json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

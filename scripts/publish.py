"""Publish a trained attnzoo checkpoint: assemble the Hub folder (weights, config with `auto_map`, tokenizer, model
card, flat remote code) and, with `--push`, upload it.

    python scripts/publish.py --checkpoint runs/sst2-dense --metrics runs/sst2-dense/metrics.json \
        --repo_id my-org/dense-tiny-sst2 --dataset_name "GLUE SST-2" --dataset_id nyu-mll/glue \
        --dataset_config sst2 --output_dir publish/dense-tiny-sst2 [--push --token hf_...]

Without `--push` nothing leaves the machine. See the README's "Publishing" and `scripts/README.md`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

import attnzoo  # noqa: F401  (registers the families)
from attnzoo.hub import PublishError, PublishOptions, assemble, upload

CARD_DIR = Path(__file__).resolve().parent.parent / "model_cards"


@dataclass
class PushOptions:
    push: bool = field(default=False, metadata={"help": "Upload the assembled folder (default: only write it)."})
    token: str | None = field(default=None, metadata={"help": "Hub token (default: HF_TOKEN or the stored login)."})
    private: bool = field(default=False, metadata={"help": "Create the repository as private."})
    commit_message: str | None = field(default=None, metadata={"help": "Message of the upload commit."})


def main(argv: list[str] | None = None) -> int:
    parser = HfArgumentParser((PublishOptions, PushOptions), description=__doc__.split("\n\n")[0])
    # The cards are text of this checkout, not of the installed package.
    parser.set_defaults(card_dir=str(CARD_DIR))
    options, push = parser.parse_args_into_dataclasses(args=argv)
    try:
        assembled = assemble(options)
        print(f"Assembled {assembled.folder} ({len(assembled.files)} files):")
        for name in assembled.files:
            print(f"  {name}")
        if push.push:
            url = upload(
                assembled,
                options.repo_id,
                token=push.token,
                private=push.private or None,
                commit_message=push.commit_message,
            )
            print(f"Uploaded to {options.repo_id}: {url}")
        else:
            print("Not uploaded (pass --push to upload).")
    except PublishError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

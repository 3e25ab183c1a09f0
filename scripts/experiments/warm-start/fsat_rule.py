#!/usr/bin/env python
"""FSAT's warm-start rule, ablated (issue 21): the conversion's rule against carrying BERT's attention, and scratch.

The conversion starts FSAT's keys and values fresh and its output projection at zero
(`FSATAttention.not_from_source`): FSAT projects keys and values from its pooled cross, which a BERT checkpoint's
`W_K` / `W_V` never read. Until that rule, they were carried like every other family's. This script measures both
rules from one source, next to the same architecture from scratch, with the budgets of the study's `run.py`
(masked-LM loss after conversion, 60 continued steps at 2048 tokens beside the dense family's, SST-2 with two seeds,
IMDB), and writes the results to `scripts/experiments/warm-start/results/`.

`--source first` (the default) starts from the first source of `run.py` (its steps `data` and
`source`; about 30 minutes of one thread here) and writes `fsat-rule.json`; `--source long` starts from the main
table's longer source (the step `source_long`, 75 more minutes of two threads here) and writes
`fsat-rule-long.json`. Run from the repository root:

    OMP_NUM_THREADS=1 python scripts/experiments/warm-start/run.py data
    OMP_NUM_THREADS=1 python scripts/experiments/warm-start/run.py source
    OMP_NUM_THREADS=1 python scripts/experiments/warm-start/fsat_rule.py --jobs 2
    OMP_NUM_THREADS=1 python scripts/experiments/warm-start/run.py source_long --fp32
    OMP_NUM_THREADS=1 python scripts/experiments/warm-start/fsat_rule.py --jobs 2 --source long
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

# The study's driver, beside this file (Python puts a script's folder first on the path).
import run as evidence

#: Each source (`--source`): its folder, and the name of this script's work folder, logs and results.
SOURCES = {"first": (evidence.FIRST_SOURCE, "fsat-rule"), "long": (evidence.LONG_SOURCE_DIR, "fsat-rule-long")}
SOURCE, NAME = SOURCES["first"]
WORK = evidence.WORK / NAME
RULES = ("fresh", "carried")
#: FSAT's key, value and output projections (zoo names, after `zoo_name`): the earlier rule took all of them from
#: the source; the current one takes only the output bias.
EARLIER_RULE = re.compile(r"^encoder\.layers\.\d+\.attention\.[kvo]_proj\.")


def carry_source_attention(converted: Path, output: Path) -> None:
    """The earlier rule: `converted` (an FSAT conversion of `SOURCE`) with the source's `W_K`, `W_V` and `W_O` put
    back into every encoder layer, saved to `output` with the tokenizer."""
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM

    import attnzoo  # noqa: F401  (registers the families)
    from attnzoo.conversion.bert_names import zoo_name

    model = AutoModelForMaskedLM.from_pretrained(evidence.ROOT / converted)
    state = model.state_dict()
    for name, tensor in load_file(str(evidence.ROOT / SOURCE / "model.safetensors")).items():
        destination = zoo_name(name)
        if destination is not None and EARLIER_RULE.match(destination):
            state[f"model.{destination}"] = tensor
    model.load_state_dict(state)
    model.save_pretrained(evidence.ROOT / output)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(evidence.ROOT / converted / name, evidence.ROOT / output / name)


def convert(rule: str, length: int) -> dict[str, Any]:
    fresh = WORK / "converted" / f"fresh-{length}"
    command = [
        "scripts/convert_checkpoint.py",
        "--model_name_or_path", str(SOURCE),
        "--family", "fsat",
        "--max_position_embeddings", str(length),
        "--output_dir", str(fresh),
    ]  # fmt: skip
    record: dict[str, Any] = {"command": evidence.shell_command(command)}
    if not (evidence.ROOT / fresh / "conversion_report.json").is_file():
        record = evidence.run(f"{NAME}-convert-{length}", command)
    output = WORK / "converted" / f"{rule}-{length}"
    if rule == "carried":
        record = {"from": str(fresh), "then": "carry_source_attention (W_K, W_V, W_O of every layer from the source)"}
        if not (evidence.ROOT / output / "config.json").is_file():
            carry_source_attention(fresh, output)
    record["eval_128"] = evidence.mlm_eval(f"{NAME}-{rule}-{length}", output, 128, evidence.EVAL_BLOCKS_128)
    return record


def finetunes(task: str, data: dict[str, Any], warm: dict[str, Path], seed: str) -> dict[str, Any]:
    """Each rule's warm start and the scratch model (the fresh conversion's config) on `task` with `seed`."""
    runs = f"{task}-seed{seed}"
    scratch = WORK / "converted" / "fresh-512"
    models = {rule: ["--model_name_or_path", str(path)] for rule, path in warm.items()}
    models["scratch"] = ["--config_path", str(scratch), "--tokenizer_name_or_path", str(scratch)]
    tasks = {
        start: lambda start=start, model=model: evidence.finetune(
            f"{NAME}-{runs}-{start}", WORK / runs / start, model, task, data, seed
        )
        for start, model in models.items()
    }
    return {"budget": data, "seed": seed, **evidence.in_parallel(tasks), "paired": paired(WORK / runs)}


def right_answers(run: Path) -> list[bool]:
    """Whether a fine-tuned run got each held-back example right."""
    return [label == guess for label, guess in evidence.read_predictions(run)]


def paired(runs: Path) -> dict[str, Any]:
    """The fresh rule's warm start against scratch and against the carried rule, example by example (McNemar)."""
    right = {start: right_answers(runs / start) for start in (*RULES, "scratch")}
    results = {}
    for other in ("scratch", "carried"):
        only_fresh, only_other = evidence.discordant(right["fresh"], right[other])
        results[f"fresh_vs_{other}"] = {
            "only_fresh_right": only_fresh,
            f"only_{other}_right": only_other,
            "mcnemar_p": evidence.mcnemar(only_fresh, only_other),
        }
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="programs run at once, one thread each (default 1)")
    parser.add_argument("--source", choices=SOURCES, default="first", help="the source checkpoint (default first)")
    args = parser.parse_args(argv)
    global SOURCE, NAME, WORK
    SOURCE, NAME = SOURCES[args.source]
    WORK = evidence.WORK / NAME
    evidence.JOBS = args.jobs
    results: dict[str, Any] = {"ran_on": evidence._commit(), "jobs": evidence.JOBS, "source": str(SOURCE)}
    results["source_eval_128"] = evidence.mlm_eval(f"{args.source}-source", SOURCE, 128, evidence.EVAL_BLOCKS_128)
    # One after the other: a carried conversion starts from the fresh one of its length.
    results["convert"] = {f"{rule}-{n}": convert(rule, n) for n in evidence.LENGTHS for rule in RULES}
    # The dense family from the same source is the yardstick of the continued loss (`--family` converts it).
    continued_models = {rule: ["--model_name_or_path", str(WORK / "converted" / f"{rule}-2048")] for rule in RULES}
    continued_models["dense_transformer"] = [
        "--model_name_or_path", str(SOURCE), "--family", "dense_transformer", "--max_position_embeddings", "2048",
    ]  # fmt: skip
    results["continue"] = evidence.in_parallel(
        {
            name: lambda name=name, model=model: evidence.run_continued(
                f"{NAME}-continue-{name}", model, WORK / "continue" / name
            )
            for name, model in continued_models.items()
        }
    )
    converted = {rule: WORK / "converted" / f"{rule}-512" for rule in RULES}
    for seed in (evidence.SEED, evidence.SECOND_SEED):
        results[f"sst2-seed{seed}"] = finetunes("sst2", evidence.SST2, converted, seed)
    continued = {rule: WORK / "continue" / rule for rule in RULES}
    results["imdb"] = finetunes("imdb", evidence.IMDB, continued, evidence.SEED)
    path = evidence.ROOT / evidence.RESULTS / f"{NAME}.json"
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Long-input evaluation: every family reading long inputs against dense attention, at an equal training budget.

Tasks (all validation splits held out here, none is a test set): IMDB reviews as WordPiece tokens (the 2,500 shipped
reviews split 2,000 / 500 with seed 0), LRA Text (the same split, one token per byte) and LRA ListOps (generated on the
fly; validation from its own seed). Writes `long_eval.json` (every run, with its loss curve), `long_eval.md` and
`long_eval.png` (accuracy against length) into `--output_dir`; re-running the same command resumes after the last
finished run. The logic lives in `attnzoo.evaluation`.

Examples:
    # the long-inputs study's tables (CPU, one thread per process; hours)
    python scripts/run_long_eval.py --tasks imdb listops text --output_dir outputs/long-eval
    # why a family does (not) learn: what the pooled token sees at initialisation, padding share, gradient norms
    python scripts/run_long_eval.py --diagnose --tasks imdb --imdb_lengths 2048 \
        --variant "a2former:num_global_tokens=0,classifier_pooling=cls" --output_dir outputs/long-eval-diagnostics
    # one family against dense on IMDB at 2048, with an ablation row
    python scripts/run_long_eval.py --tasks imdb --families a2former --imdb_lengths 2048 \
        --variant "a2former:num_global_tokens=0" --output_dir outputs/long-eval-a2
    # LRA Text with self-pretraining: 900 masked-LM steps on the training bytes, then the classifier (the
    # long-inputs study; one GPU)
    python scripts/run_long_eval.py --tasks text --families --variant "a2former:position_embedding_type=sinusoidal" \
        --text_lengths 4096 --text_dense_lengths --text_pooling mean --group_by_length --steps 1500 --batch_size 16 \
        --learning_rate 1e-3 --warmup_steps 150 --pretrain_steps 900 --device cuda --output_dir outputs/lra-text-spt
    # LRA ListOps trees (500-2,000 tokens) at a CPU budget: the first 900 steps on trees of 100-500 tokens (the
    # long-inputs study)
    python scripts/run_long_eval.py --tasks listops --listops_lengths 2048 --steps 1200 --warmup_steps 120 \
        --group_by_length --listops_curriculum_steps 900 --output_dir outputs/listops-curriculum
    # LRA ListOps at its published budget and size, on a GPU (the long-inputs study)
    python scripts/run_long_eval.py --tasks listops --listops_lengths 2048 --device cuda --bf16 \
        --hidden_size 512 --num_hidden_layers 6 --num_attention_heads 8 --intermediate_size 2048 \
        --steps 5000 --batch_size 32 --learning_rate 1.58e-3 --warmup_steps 1000 --schedule rsqrt \
        --weight_decay 0.1 --output_dir outputs/lra-listops
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from attnzoo.evaluation import (  # noqa: E402
    SCHEDULES,
    TEXT_POOLINGS,
    Budget,
    ListOpsCurriculum,
    ModelSize,
    Row,
    TaskPlan,
    diagnostics_markdown,
    parse_variant,
    run_diagnostics,
    run_long_eval,
)
from attnzoo.registry import FAMILIES  # noqa: E402
from attnzoo.training.data.listops import ListOpsSettings  # noqa: E402

#: The 2,500 IMDB reviews shipped with a source checkout (another file: `--reviews_file`).
DEFAULT_REVIEWS_FILE = (
    Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "data" / "imdb" / "train_subset_2500.tsv"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--tasks", nargs="+", choices=["imdb", "listops", "text"], default=["imdb", "listops"])
    parser.add_argument(
        "--families",
        nargs="*",
        choices=sorted(FAMILIES),
        help="default: every registered family; the flag with no family runs only the --variant rows",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="FAMILY:FIELD=VALUE[,FIELD=VALUE]",
        help="extra (ablation) row with config overrides, e.g. 'fsat:index_scale=max_length'; repeatable",
    )
    parser.add_argument("--imdb_lengths", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    parser.add_argument("--imdb_dense_lengths", nargs="*", type=int, default=[512, 2048])
    parser.add_argument("--listops_lengths", nargs="+", type=int, default=[2048])
    parser.add_argument(
        "--listops_tree_lengths",
        nargs=2,
        type=int,
        metavar=("MIN", "MAX"),
        default=[ListOpsSettings.min_length, ListOpsSettings.max_length],
        help="token counts of the generated ListOps trees (LRA: 500 2000); shorter trees make a CPU-sized task",
    )
    parser.add_argument(
        "--listops_curriculum_steps",
        type=int,
        default=0,
        help="length curriculum: the first N training steps draw ListOps trees of --listops_curriculum_tree_lengths "
        "(0: none, LRA's protocol; validation trees are --listops_tree_lengths either way)",
    )
    parser.add_argument(
        "--listops_curriculum_tree_lengths",
        nargs=2,
        type=int,
        metavar=("MIN", "MAX"),
        default=[100, 500],
        help="token counts of the curriculum's ListOps trees",
    )
    parser.add_argument("--text_lengths", nargs="+", type=int, default=[4096])
    parser.add_argument("--text_dense_lengths", nargs="*", type=int, default=[1024])
    parser.add_argument(
        "--text_pooling",
        choices=TEXT_POOLINGS,
        default="cls",
        help="Text task: every family pools the first token (LRA's protocol) or the mean of the real tokens",
    )
    parser.add_argument("--reviews_file", default=str(DEFAULT_REVIEWS_FILE), help="text<TAB>label TSV with a header")
    parser.add_argument("--validation_size", type=int, default=500)
    parser.add_argument("--steps", type=int, default=Budget.steps)
    parser.add_argument("--batch_size", type=int, default=Budget.batch_size)
    parser.add_argument("--learning_rate", type=float, default=Budget.learning_rate)
    parser.add_argument("--warmup_steps", type=int, default=Budget.warmup_steps)
    parser.add_argument("--weight_decay", type=float, default=Budget.weight_decay)
    parser.add_argument(
        "--schedule",
        choices=sorted(SCHEDULES),
        default=Budget.schedule,
        help="after the warm-up: linear decay to 0, or LRA's inverse square root",
    )
    parser.add_argument("--seed", type=int, default=Budget.seed)
    parser.add_argument("--eval_batch_size", type=int, default=Budget.eval_batch_size)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (CUDA)")
    parser.add_argument(
        "--group_by_length",
        action="store_true",
        help="cut training batches from examples of similar length (less padding; transformers' group_by_length)",
    )
    parser.add_argument(
        "--pretrain_steps",
        type=int,
        default=Budget.pretrain_steps,
        help="masked-language-model steps on the task's own training inputs before fine-tuning (self-pretraining; "
        "0: from scratch, LRA's protocol)",
    )
    parser.add_argument("--mlm_probability", type=float, default=Budget.mlm_probability)
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda', 'cuda:1' or 'auto' (CUDA when available)")
    parser.add_argument("--hidden_size", type=int, default=ModelSize.hidden_size)
    parser.add_argument("--num_hidden_layers", type=int, default=ModelSize.num_hidden_layers)
    parser.add_argument("--num_attention_heads", type=int, default=ModelSize.num_attention_heads)
    parser.add_argument("--intermediate_size", type=int, default=ModelSize.intermediate_size)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="instead of training: measure every row at initialisation on a few validation examples (what the pooled "
        "token can see, padding share, gradient norms) and write diagnostics.json / diagnostics.md",
    )
    parser.add_argument("--diagnose_examples", type=int, default=4)
    return parser.parse_args(argv)


def table_rows(args: argparse.Namespace) -> list[Row]:
    """The model rows: every family named by `--families` (all when the flag is absent), then the `--variant` rows."""
    families = sorted(FAMILIES) if args.families is None else args.families
    return [Row(model_type) for model_type in families] + [parse_variant(text) for text in args.variant]


def listops_curriculum(args: argparse.Namespace) -> ListOpsCurriculum | None:
    """The ListOps length curriculum of `--listops_curriculum_steps` (None for 0).

    Raises:
        ValueError: A negative step count, or one that leaves no step for the task's own trees.
    """
    steps = args.listops_curriculum_steps
    if steps == 0:
        return None
    if not 0 < steps < args.steps:
        raise ValueError(
            f"--listops_curriculum_steps must be in [0, --steps={args.steps}) so that the training ends on the "
            f"task's own trees, got {steps}."
        )
    low, high = args.listops_curriculum_tree_lengths
    return ListOpsCurriculum(ListOpsSettings(min_length=low, max_length=high), steps * args.batch_size)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    lengths = {
        "imdb": (args.imdb_lengths, args.imdb_dense_lengths),
        "listops": (args.listops_lengths, ()),
        "text": (args.text_lengths, args.text_dense_lengths),
    }
    plans = [TaskPlan(task, tuple(lengths[task][0]), tuple(lengths[task][1])) for task in args.tasks]
    rows = table_rows(args)
    listops_settings = ListOpsSettings(
        min_length=args.listops_tree_lengths[0], max_length=args.listops_tree_lengths[1]
    )
    curriculum = listops_curriculum(args)
    size = ModelSize(args.hidden_size, args.num_hidden_layers, args.num_attention_heads, args.intermediate_size)
    budget = Budget(
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        schedule=args.schedule,
        seed=args.seed,
        eval_batch_size=args.eval_batch_size,
        bf16=args.bf16,
        group_by_length=args.group_by_length,
        pretrain_steps=args.pretrain_steps,
        mlm_probability=args.mlm_probability,
    )

    if args.diagnose:
        records = run_diagnostics(
            args.output_dir,
            plans,
            rows,
            size=size,
            reviews_file=args.reviews_file,
            validation_size=args.validation_size,
            examples=args.diagnose_examples,
            seed=args.seed,
            listops_settings=listops_settings,
            text_pooling=args.text_pooling,
        )
        print(diagnostics_markdown(records))
        return

    def show(record: dict) -> None:
        print(
            f"{record['task']:8s} {record['label']:40s} @{record['length']:5d}: "
            f"accuracy {100 * record['accuracy']:.1f}% ({record['train_seconds']:.0f} s, "
            f"{record['train_tokens_per_second']:.0f} tokens/s)",
            flush=True,
        )

    run_long_eval(
        args.output_dir,
        plans,
        rows,
        size=size,
        budget=budget,
        reviews_file=args.reviews_file,
        validation_size=args.validation_size,
        on_result=show,
        device=args.device,
        listops_settings=listops_settings,
        text_pooling=args.text_pooling,
        listops_curriculum=curriculum,
    )


if __name__ == "__main__":
    main()

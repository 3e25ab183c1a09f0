"""Long-input evaluation: does a family that reads the whole document beat dense attention that reads its start?

`scripts/run_long_eval.py` is the command; the pieces are the tasks ([`tasks`]: IMDB tokens, LRA Text bytes, LRA
ListOps), one training run at an equal budget ([`runner`]), the grid with resume ([`evaluate`]), the reports
([`report`]), the measurements behind the table ([`diagnostics`]) and a seed sweep read together ([`seeds`]).
"""

from __future__ import annotations

from typing import Any

from ..core.config_fields import parse_config_overrides
from .diagnostics import diagnose, diagnostics_markdown
from .evaluate import Row, TaskPlan, planned_runs, planned_tasks, run_diagnostics, run_long_eval
from .runner import SCHEDULES, Budget, ModelSize, RunSpec, collate, evaluate, resolve_device, train_and_evaluate
from .seeds import SeedRow, find_row, load_seed_rows, paired_difference, seeds_markdown
from .tasks import (
    TASK_NAMES,
    TEXT_POOLINGS,
    ListOpsCurriculum,
    TaskData,
    imdb_task,
    listops_task,
    read_reviews,
    split_reviews,
    text_task,
)


def parse_variant(text: str) -> Row:
    """`"fsat:index_scale=max_length,num_global_tokens=0"` -> a [`Row`] with those config overrides."""
    model_type, _, overrides = text.partition(":")
    if not overrides:
        raise ValueError(f"A variant looks like FAMILY:FIELD=VALUE[,FIELD=VALUE], got {text!r}.")
    fields: dict[str, Any] = parse_config_overrides(overrides)
    return Row(model_type.strip(), fields)


__all__ = [
    "SCHEDULES",
    "TASK_NAMES",
    "TEXT_POOLINGS",
    "Budget",
    "ListOpsCurriculum",
    "ModelSize",
    "Row",
    "RunSpec",
    "SeedRow",
    "TaskData",
    "TaskPlan",
    "collate",
    "diagnose",
    "diagnostics_markdown",
    "evaluate",
    "find_row",
    "imdb_task",
    "listops_task",
    "load_seed_rows",
    "paired_difference",
    "parse_variant",
    "planned_runs",
    "planned_tasks",
    "run_diagnostics",
    "read_reviews",
    "resolve_device",
    "run_long_eval",
    "seeds_markdown",
    "split_reviews",
    "text_task",
    "train_and_evaluate",
]

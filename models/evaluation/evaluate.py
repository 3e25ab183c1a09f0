"""The whole evaluation: build every task at every length once, run every row, and keep the results file current.

Runs are appended to `long_eval.json` as they finish and skipped when already there (same task, row label and length,
same budget and size), so a long CPU evaluation can be interrupted and resumed with the same command.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..training.data.listops import ListOpsSettings
from .diagnostics import diagnose, diagnostics_markdown
from .report import load_results, results_lock, save_results, write_reports
from .runner import Budget, ModelSize, RunSpec, stored_budget, train_and_evaluate
from .tasks import (
    TASK_NAMES,
    ListOpsCurriculum,
    TaskData,
    check_listops_fits,
    imdb_task,
    listops_task,
    reviews_digest,
    text_task,
)

logger = logging.getLogger(__name__)

DENSE = "dense_transformer"
#: Subfolder of a results folder that keeps the IMDB tokenizer every run of the folder uses.
TOKENIZER_FOLDER = "imdb-tokenizer"
#: Settings two runs of one results folder must share (when the file records them; older files lack some).
SHARED_SETTINGS = ("size", "budget", "validation_size", "reviews")


@dataclass(frozen=True)
class Row:
    """
    A model row of the table: a family with config overrides, run at the given lengths of every task.

    Args:
        model_type: key of `attnzoo.registry.FAMILIES`.
        overrides: config fields on top of the family defaults.
        label: display name (default: model_type plus overrides).
    """

    model_type: str
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def spec(self, length: int) -> RunSpec:
        return RunSpec(self.model_type, length, dict(self.overrides), self.label)


@dataclass(frozen=True)
class TaskPlan:
    """
    Lengths of one task: every row runs at `lengths`; the plain dense row also at `dense_lengths` (its baselines).

    Args:
        task: one of `TASK_NAMES`.
        lengths: input lengths of every row.
        dense_lengths: extra lengths of the plain dense row (e.g. 512 for the truncated baseline).
    """

    task: str
    lengths: tuple[int, ...]
    dense_lengths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.task not in TASK_NAMES:
            raise ValueError(f"Unknown task {self.task!r}; expected one of {TASK_NAMES}.")
        if not self.lengths and not self.dense_lengths:
            raise ValueError(f"Task {self.task!r} has no lengths to run.")


def build_task(
    name: str,
    length: int,
    reviews_file: str | Path | None,
    validation_size: int,
    listops_settings: ListOpsSettings | None = None,
    text_pooling: str = "cls",
    tokenizer_dir: str | Path | None = None,
    listops_curriculum: ListOpsCurriculum | None = None,
) -> TaskData:
    """The task encoded at `length` (IMDB and Text read `reviews_file`; ListOps trees follow `listops_settings`,
    LRA's by default, after `listops_curriculum`'s when given; Text's classifiers pool `text_pooling`, LRA's first
    token by default; IMDB's tokenizer is kept in `tokenizer_dir` when given)."""
    if name == "listops":
        return listops_task(
            length, validation_size=validation_size, settings=listops_settings, curriculum=listops_curriculum
        )
    if reviews_file is None:
        raise ValueError(f"Task {name!r} needs `reviews_file` (a text<TAB>label TSV of IMDB reviews).")
    if name == "imdb":
        return imdb_task(reviews_file, length, validation_size=validation_size, tokenizer_dir=tokenizer_dir)
    return text_task(reviews_file, length, validation_size=validation_size, pooling=text_pooling)


def planned_runs(plans: Sequence[TaskPlan], rows: Sequence[Row]) -> list[tuple[str, RunSpec]]:
    """`(task, spec)` for every task, row and length, the dense baselines included, without repeats.

    Raises:
        ValueError: The plan holds no run (no task, or no row and no dense baseline length).
    """
    runs: list[tuple[str, RunSpec]] = []
    seen: set[tuple[str, str]] = set()
    plain_dense = Row(DENSE)
    for plan in plans:
        specs = [row.spec(length) for row in rows for length in plan.lengths]
        specs += [plain_dense.spec(length) for length in plan.dense_lengths]
        for spec in specs:
            if (plan.task, spec.key) not in seen:
                seen.add((plan.task, spec.key))
                runs.append((plan.task, spec))
    if not runs:
        # An empty plan would otherwise finish at once and write an empty table.
        raise ValueError("Nothing to run: no model row (--families / --variant) and no dense baseline length.")
    return runs


def planned_tasks(
    plans: Sequence[TaskPlan],
    rows: Sequence[Row],
    reviews_file: str | Path | None,
    validation_size: int,
    skip: Container[tuple[str, str]] = (),
    listops_settings: ListOpsSettings | None = None,
    text_pooling: str = "cls",
    tokenizer_dir: str | Path | None = None,
    listops_curriculum: ListOpsCurriculum | None = None,
) -> Iterator[tuple[TaskData, RunSpec]]:
    """`(task data, spec)` for every planned run whose `(task, spec.key)` is not in `skip`; each task is encoded once,
    when a run first needs it."""
    runs = planned_runs(plans, rows)
    for task_name, spec in runs:  # every length checked before the first task is built
        if task_name == "listops":
            check_listops_fits(spec.length, listops_settings or ListOpsSettings())
            if listops_curriculum is not None:
                check_listops_fits(spec.length, listops_curriculum.settings)
    tasks: dict[tuple[str, int], TaskData] = {}
    for task_name, spec in runs:
        if (task_name, spec.key) in skip:
            continue
        if (task_name, spec.length) not in tasks:
            tasks[(task_name, spec.length)] = build_task(
                task_name,
                spec.length,
                reviews_file,
                validation_size,
                listops_settings,
                text_pooling,
                tokenizer_dir,
                listops_curriculum,
            )
        yield tasks[(task_name, spec.length)], spec


def run_diagnostics(
    output_dir: str | Path,
    plans: Sequence[TaskPlan],
    rows: Sequence[Row],
    *,
    size: ModelSize | None = None,
    reviews_file: str | Path | None = None,
    validation_size: int = 500,
    examples: int = 4,
    seed: int = 0,
    listops_settings: ListOpsSettings | None = None,
    text_pooling: str = "cls",
) -> list[dict[str, Any]]:
    """[`diagnose`] every planned run (the dense baselines included) and write `diagnostics.json` and
    `diagnostics.md` into `output_dir`. Returns the records."""
    size = size or ModelSize()
    records: list[dict[str, Any]] = []
    output_dir = Path(output_dir)
    tasks = planned_tasks(
        plans,
        rows,
        reviews_file,
        validation_size,
        listops_settings=listops_settings,
        text_pooling=text_pooling,
        tokenizer_dir=output_dir / TOKENIZER_FOLDER,
    )
    for task, spec in tasks:
        records += diagnose(task, [spec], size, examples, seed)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "diagnostics.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    (output_dir / "diagnostics.md").write_text(diagnostics_markdown(records), encoding="utf-8")
    return records


def _check_folder(
    path: Path, on_disk: dict[str, Any], settings: dict[str, Any], listops: dict[str, Any], task: TaskData | None
) -> None:
    """Refuse to add runs to a results file made under other settings, ListOps trees (`listops`: the
    `generator` and the `curriculum`, `None` for none, as the task's info records them) or task protocol.

    Raises:
        ValueError: naming the setting that differs (start a new folder).
    """
    previous = on_disk.get("settings")
    if previous:
        previous = {**previous, "budget": stored_budget(previous)}
        for key in SHARED_SETTINGS:
            if key in previous and key in settings and previous[key] != settings[key]:
                raise ValueError(
                    f"{path} holds runs made with another {key} ({previous[key]}, not {settings[key]}); use a new "
                    "output folder."
                )
    task_info = on_disk.get("task_info", {})
    for length, info in task_info.get("listops", {}).items():
        for key, ours in listops.items():
            # (a folder from before curricula holds no "curriculum": it trained without one)
            theirs = info.get(key, ours if key == "generator" else None)
            if theirs != ours:
                raise ValueError(
                    f"{path} holds ListOps runs at length {length} with {key} {theirs}, not {ours}; use a new "
                    "output folder."
                )
    if task is None:
        return
    for length, info in task_info.get(task.name, {}).items():
        # Runs made before a task had a protocol (or under another one) would share a table with these.
        protocol = info.get("model_overrides", {})
        if protocol != task.model_overrides:
            raise ValueError(
                f"{path} holds {task.name} runs at length {length} with task overrides {protocol}, not "
                f"{task.model_overrides}; use a new output folder."
            )


def _merged(
    on_disk: dict[str, Any], settings: dict[str, Any], task: TaskData, record: dict[str, Any]
) -> dict[str, Any]:
    """`on_disk` with our settings, the task's description and the new run (replacing an older run of the same key)."""
    key = (record["task"], record["label"], record["length"])
    runs = [r for r in on_disk.get("runs", []) if (r["task"], r["label"], r["length"]) != key]
    task_info = on_disk.get("task_info", {})
    task_info.setdefault(task.name, {})[str(task.length)] = task.info
    merged_settings = {**on_disk.get("settings", {}), **settings}
    return {**on_disk, "settings": merged_settings, "task_info": task_info, "runs": [*runs, record]}


def run_long_eval(
    output_dir: str | Path,
    plans: Sequence[TaskPlan],
    rows: Sequence[Row],
    *,
    size: ModelSize | None = None,
    budget: Budget | None = None,
    reviews_file: str | Path | None = None,
    validation_size: int = 500,
    settings_note: dict[str, Any] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    device: str | torch.device | None = "cpu",
    listops_settings: ListOpsSettings | None = None,
    text_pooling: str = "cls",
    listops_curriculum: ListOpsCurriculum | None = None,
) -> dict[str, Any]:
    """Run (or resume) the evaluation and write `long_eval.json`, `long_eval.md` and `long_eval.png`.

    `device` is where every run trains (`"auto"`: CUDA when available); each run records it. `listops_settings`
    shapes the ListOps trees (LRA's by default), `listops_curriculum` the trees the training starts with (none by
    default, LRA's protocol); a folder holds ListOps runs of one tree shape and curriculum only. `text_pooling`
    is the Text task's `classifier_pooling` (LRA's `"cls"` by default); a folder holds Text runs of one pooling only.
    Several processes may share `output_dir`: each merges its runs into the file under a lock, and the IMDB tokenizer
    is trained once per folder (`imdb-tokenizer/`).

    Returns:
        The results dictionary (`settings`, `task_info`, `runs`) as the file holds it at the end, with the runs of
        every process that shares the folder.

    Raises:
        ValueError: The results file in `output_dir` was made with a different size, budget, validation size,
            reviews file, ListOps tree shape or task protocol (`TaskData.model_overrides`; start a new folder).
    """
    size, budget = size or ModelSize(), budget or Budget()
    output_dir = Path(output_dir)
    path = output_dir / "long_eval.json"
    settings = {
        "size": dataclasses.asdict(size),
        "budget": dataclasses.asdict(budget),
        "validation_size": validation_size,
        # (only with a reviews file: a ListOps-only run reads none, and must not unset the folder's)
        **({} if reviews_file is None else {"reviews": reviews_digest(reviews_file)}),
        "torch_threads": torch.get_num_threads(),
        **(settings_note or {}),
    }
    listops = {
        "generator": dataclasses.asdict(listops_settings or ListOpsSettings()),
        "curriculum": None if listops_curriculum is None else listops_curriculum.describe(),
    }
    with results_lock(path):
        results = load_results(path)
        _check_folder(path, results, settings, listops, task=None)
    done = {(r["task"], f"{r['label']}@{r['length']}") for r in results["runs"]}
    for task, spec in planned_tasks(
        plans,
        rows,
        reviews_file,
        validation_size,
        skip=done,
        listops_settings=listops_settings,
        text_pooling=text_pooling,
        tokenizer_dir=output_dir / TOKENIZER_FOLDER,
        listops_curriculum=listops_curriculum,
    ):
        with results_lock(path):
            _check_folder(path, load_results(path), settings, listops, task)  # before the device time is spent
        logger.info("running %s on %s", spec.key, task.name)
        record = train_and_evaluate(task, spec, size, budget, device=device)
        # Check and merge against the file as it is now: another process may share the folder (one per core on a
        # CPU), and may have started under other settings since.
        with results_lock(path):
            on_disk = load_results(path)
            _check_folder(path, on_disk, settings, listops, task)
            results = _merged(on_disk, settings, task, record)
            save_results(path, results)
            write_reports(output_dir, results)
        if on_result is not None:
            on_result(record)
    with results_lock(path):
        results = load_results(path)  # every process's runs
        if results["runs"]:
            write_reports(output_dir, results)
    return results

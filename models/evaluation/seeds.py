"""Several training seeds of the same evaluation, read together: per-row mean and spread, and paired differences.

A results folder holds one budget (one seed among its fields), so a seed sweep is a folder per seed. A row here is a
task, a row label and a length under one *protocol*: the settings, the seed left out, that differ between the folders
read (e.g. `pretrain_steps=900` against `pretrain_steps=0`), so that self-pretrained and from-scratch runs of the same
model are two rows. The settings are the size and budget fields, the folder's other settings (`validation_size`, the
reviews file, ...) and, per task, what its `task_info` says was measured: the task's config overrides (`task.*`, e.g.
the Text pooling), the ListOps tree generator (`generator.*`) and the split and validation seeds. A paired difference
compares two rows seed by seed, over the seeds both have: the seed fixes initialisation and batch order, so pairing
removes the part of the spread the rows share.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .report import TASK_TITLES, load_results
from .runner import stored_budget

#: Settings of a results file that say how its runs were executed, not what they measured (like the device, which the
#: table lists per row): they do not set folders apart.
RUNTIME_SETTINGS = frozenset({"torch_threads"})
#: `task_info` entries, besides the task's config overrides and the ListOps generator, that choose the data measured.
TASK_INFO_INPUTS = ("split_seed", "validation_seed")
#: The value of a task override a folder's task did not set (the family's own default), as the protocol names it.
FAMILY_DEFAULT = "default"
#: The value of a setting a folder does not record, as the protocol names it.
NOT_RECORDED = "?"


@dataclass(frozen=True)
class SeedRow:
    """
    One row of a seed sweep: the accuracy of every seed that ran it.

    Args:
        task: task name (`"text"`, `"imdb"`, `"listops"`).
        label: the run's row label (family and overrides).
        length: input length.
        protocol: the settings that set this row's folders apart from the others read (size, budget, other settings,
            the task's; see the module), `"-"` if none.
        accuracies: validation accuracy (a fraction) per seed.
        devices: the devices the runs trained on.
    """

    task: str
    label: str
    length: int
    protocol: str
    accuracies: dict[int, float] = field(default_factory=dict)
    devices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """How the row is named on the command line and in the table: `label@length`, with its protocol if any."""
        base = f"{self.label}@{self.length}"
        return base if self.protocol == "-" else f"{base} ({self.protocol})"

    @property
    def mean(self) -> float:
        return statistics.fmean(self.accuracies.values())

    @property
    def sd(self) -> float:
        """Sample standard deviation over seeds (NaN for one seed)."""
        values = list(self.accuracies.values())
        return statistics.stdev(values) if len(values) > 1 else math.nan


@dataclass(frozen=True)
class PairedDifference:
    """`row - baseline` over the seeds both ran: mean, standard error of the mean, and the seeds where `row` is ahead.

    Args:
        seeds: the shared seeds, ascending.
        differences: `row - baseline` accuracy (fractions) per shared seed.
    """

    seeds: tuple[int, ...]
    differences: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.differences) if self.differences else math.nan

    @property
    def standard_error(self) -> float:
        """SD of the differences over sqrt(n) (NaN below two seeds)."""
        n = len(self.differences)
        return statistics.stdev(self.differences) / math.sqrt(n) if n > 1 else math.nan

    @property
    def ahead(self) -> int:
        return sum(d > 0 for d in self.differences)

    @property
    def behind(self) -> int:
        return sum(d < 0 for d in self.differences)


def _flattened(name: str, value: Any) -> dict[str, Any]:
    """`{"name.key": value}` for every leaf of a nested dictionary (`{"name": value}` for a plain value)."""
    if not isinstance(value, dict):
        return {name: value}
    return {key: leaf for sub, item in value.items() for key, leaf in _flattened(f"{name}.{sub}", item).items()}


def _settings_fields(settings: dict[str, Any]) -> dict[str, Any]:
    """A results file's `settings` as flat protocol fields: `size.*`, every budget field (a field added after the
    file was written at its default, [`stored_budget`]) and every further setting but the runtime ones."""
    fields = {**_flattened("size", settings["size"]), **stored_budget(settings)}
    for name, value in settings.items():
        # `None` is a setting that did not apply (e.g. no reviews file for a ListOps-only folder): not recorded.
        if name not in ("size", "budget") and name not in RUNTIME_SETTINGS and value is not None:
            fields.update(_flattened(name, value))
    return fields


def _task_fields(info: dict[str, Any], override_names: set[str]) -> dict[str, Any]:
    """A `task_info[task][length]` entry as flat protocol fields: the task's config overrides (`task.*`; one of
    `override_names` the entry lacks is the family's default, as it is for a file written before the task had
    overrides), the ListOps generator (`generator.*`) and the seeds that chose the data."""
    overrides = info.get("model_overrides", {})
    fields = {f"task.{name}": overrides.get(name, FAMILY_DEFAULT) for name in override_names}
    if "generator" in info:
        fields.update(_flattened("generator", info["generator"]))
    fields.update({name: info[name] for name in TASK_INFO_INPUTS if name in info})
    return fields


def _varying(entries: Sequence[dict[str, Any]]) -> list[str]:
    """The fields, the seed left out, with more than one value among the entries that record them (a field an older
    file lacks does not by itself set it apart)."""
    names = set().union(*entries)
    return sorted(
        name for name in names if name != "seed" and len({repr(entry[name]) for entry in entries if name in entry}) > 1
    )


def load_seed_rows(folders: Sequence[str | Path]) -> list[SeedRow]:
    """Every row of the `long_eval.json` files in `folders`, one accuracy per seed.

    Raises:
        ValueError: A folder has no results, or two folders hold the same row for the same seed under the same
            protocol (the same folder passed twice, or a copy).
    """
    loaded: list[tuple[Path, dict[str, Any]]] = []
    for folder in folders:
        path = Path(folder) / "long_eval.json"
        results = load_results(path)
        if not results["runs"]:
            raise ValueError(f"{path} holds no runs; pass folders written by scripts/run_long_eval.py.")
        loaded.append((path, results))
    # The protocol is what varies between folders, apart from the seed: the folder's settings (compared over every
    # folder, as a budget is the same for all its tasks), then the task's own (compared per task over the folders'
    # task_info entries of the lengths they ran: a Text pooling says nothing about ListOps rows).
    flat = [_settings_fields(results["settings"]) for _, results in loaded]
    varying = _varying(flat)
    infos: dict[tuple[int, str, int], dict[str, Any] | None] = {}
    for index, (_, results) in enumerate(loaded):
        for run in results["runs"]:
            info = results.get("task_info", {}).get(run["task"], {}).get(str(run["length"]))
            infos[(index, run["task"], int(run["length"]))] = info
    override_names: dict[str, set[str]] = {}
    for (_, task, _), info in infos.items():
        override_names.setdefault(task, set()).update((info or {}).get("model_overrides", {}))
    # A run without a task_info entry (never written so by run_long_eval) records none of the task's fields.
    task_flat = {
        entry: {} if info is None else _task_fields(info, override_names[entry[1]]) for entry, info in infos.items()
    }
    task_varying = {
        task: _varying([fields for (_, other, _), fields in task_flat.items() if other == task])
        for task in override_names
    }
    accuracies: dict[tuple[str, str, int, str], dict[int, float]] = {}
    devices: dict[tuple[str, str, int, str], set[str]] = {}
    for index, ((path, results), settings) in enumerate(zip(loaded, flat, strict=True)):
        seed = int(settings["seed"])
        for run in results["runs"]:
            task_settings = task_flat[(index, run["task"], int(run["length"]))]
            protocol = ",".join(
                [f"{k}={settings.get(k, NOT_RECORDED)}" for k in varying]
                + [f"{k}={task_settings.get(k, NOT_RECORDED)}" for k in task_varying[run["task"]]]
            )
            key = (run["task"], run["label"], int(run["length"]), protocol or "-")
            per_seed = accuracies.setdefault(key, {})
            if seed in per_seed:
                raise ValueError(
                    f"{path}: seed {seed} of {SeedRow(*key).name} on {key[0]} is already in another folder."
                )
            per_seed[seed] = float(run["accuracy"])
            devices.setdefault(key, set()).add(str(run.get("device", "?")))
    rows = [
        SeedRow(*key, dict(sorted(per_seed.items())), tuple(sorted(devices[key])))
        for key, per_seed in accuracies.items()
    ]
    return sorted(rows, key=lambda r: (r.task, r.protocol, r.label, r.length))


def find_row(rows: Sequence[SeedRow], task: str, name: str) -> SeedRow:
    """The row of `task` named `name` ([`SeedRow.name`]).

    Raises:
        ValueError: No such row; the message lists the names there are.
    """
    for row in rows:
        if row.task == task and row.name == name:
            return row
    names = "\n  ".join(row.name for row in rows if row.task == task)
    raise ValueError(f"No {task!r} row named {name!r}. The rows are:\n  {names}")


def paired_difference(row: SeedRow, baseline: SeedRow) -> PairedDifference:
    """`row - baseline` over the seeds both ran."""
    seeds = tuple(sorted(set(row.accuracies) & set(baseline.accuracies)))
    return PairedDifference(seeds, tuple(row.accuracies[s] - baseline.accuracies[s] for s in seeds))


def _points(value: float, sign: bool = False) -> str:
    if math.isnan(value):
        return "–"
    return f"{100 * value:+.1f}" if sign else f"{100 * value:.1f}"


def seeds_markdown(rows: Sequence[SeedRow], baselines: dict[str, SeedRow]) -> str:
    """One table per task: accuracy per seed, mean ± SD and the paired difference to the task's baseline row."""
    lines = ["# attnzoo long-input evaluation: training seeds", ""]
    for task, title in TASK_TITLES.items():
        task_rows = [r for r in rows if r.task == task]
        if not task_rows:
            continue
        seeds = sorted(set().union(*(r.accuracies for r in task_rows)))
        baseline = baselines.get(task)
        lines += [f"## {title}", ""]
        if baseline is not None:
            lines += [f"Paired differences are against {baseline.name} (mean ± standard error over shared seeds).", ""]
        header = ["row", *(f"seed {s}" for s in seeds), "mean ± SD", "Δ vs baseline", "seeds ahead", "devices"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in task_rows:
            cells = [row.name, *(_points(row.accuracies.get(s, math.nan)) for s in seeds)]
            cells.append(f"{_points(row.mean)} ± {_points(row.sd)}")
            if baseline is None or row is baseline:
                cells += ["–", "–"]
            else:
                diff = paired_difference(row, baseline)
                cells += [
                    f"{_points(diff.mean, sign=True)} ± {_points(diff.standard_error)}",
                    f"{diff.ahead} of {len(diff.seeds)}",
                ]
            cells.append(", ".join(row.devices))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value  # NaN (one seed's SD) is not JSON


def seeds_records(rows: Sequence[SeedRow], baselines: dict[str, SeedRow]) -> list[dict[str, Any]]:
    """The numbers of [`seeds_markdown`] as JSON-ready records (accuracies as fractions; `None` where undefined)."""
    records = []
    for row in rows:
        record: dict[str, Any] = {
            "task": row.task,
            "row": row.name,
            "accuracy": row.accuracies,
            "mean": row.mean,
            "sd": _finite(row.sd),
            "devices": list(row.devices),
        }
        baseline = baselines.get(row.task)
        if baseline is not None and row is not baseline:
            diff = paired_difference(row, baseline)
            record["paired_difference"] = {
                "baseline": baseline.name,
                "seeds": list(diff.seeds),
                "mean": _finite(diff.mean),
                "standard_error": _finite(diff.standard_error),
                "ahead": diff.ahead,
            }
        records.append(record)
    return records

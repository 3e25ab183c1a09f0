"""The conversion report: every source tensor and where it went, every new tensor and how it was initialised.

Saved beside the converted weights as `conversion_report.json` (read back by `publish.py` for the card's
`base_model`, and copied along by the training scripts) and `conversion_report.md` (the same, for people).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_FILE = "conversion_report.json"
REPORT_TEXT_FILE = "conversion_report.md"


@dataclass
class ConversionReport:
    """
    What a conversion did.

    Args:
        source (`str`): the source as given (folder or Hub id).
        base_model (`str`, *optional*): the source's Hub id when it was given as one (the card's `base_model`).
        source_model_type / source_architecture (`str`): e.g. `"roberta"` / `"RobertaForMaskedLM"`.
        source_positions (`int`): longest input of the source.
        family (`str`): the target `model_type`.
        target_class (`str`): the saved class, e.g. `"SmartBirdForMaskedLM"`.
        max_position_embeddings (`int`): the new length.
        seq2seq (`bool`): a BERT2BERT encoder-decoder warm start.
        config_from_source (`dict`): config fields taken from the source (sizes, activation, special ids).
        method_defaults (`dict`): the family's own fields, at their defaults unless overridden.
        config_overrides (`dict`): the overrides given.
        positions (`str`): how positions map.
        mapped (`list[dict]`): `{"source", "destination", "shape", "note"}` per source tensor that was carried.
        not_carried (`list[dict]`): `{"source", "shape", "reason"}` per stored tensor the target has no place for.
        new (`list[dict]`): `{"name", "shape", "init"}` per target tensor with no source.
        tied (`list[dict]`): `{"name", "tied_to"}` per target tensor that shares another's storage.
        versions (`dict`): attnzoo and transformers versions.
    """

    source: str
    base_model: str | None
    source_model_type: str
    source_architecture: str
    source_positions: int
    family: str
    target_class: str
    max_position_embeddings: int
    seq2seq: bool = False
    config_from_source: dict[str, Any] = field(default_factory=dict)
    method_defaults: dict[str, Any] = field(default_factory=dict)
    config_overrides: dict[str, Any] = field(default_factory=dict)
    positions: str = ""
    mapped: list[dict[str, Any]] = field(default_factory=list)
    not_carried: list[dict[str, Any]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    tied: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def render(self) -> str:
        """The report as Markdown."""
        lines = [
            f"# Conversion of {self.source} into {self.target_class}",
            "",
            f"- source: `{self.source}` ({self.source_model_type}, {self.source_architecture}, "
            f"{self.source_positions} positions)" + (f", Hub id `{self.base_model}`" if self.base_model else ""),
            f"- target: `{self.target_class}` (model_type `{self.family}`), max_position_embeddings "
            f"{self.max_position_embeddings}" + (", BERT2BERT encoder-decoder" if self.seq2seq else ""),
            f"- positions: {self.positions}",
            f"- config from the source: {_fields(self.config_from_source)}",
            f"- method settings (family defaults unless overridden): {_fields(self.method_defaults) or 'none'}",
            f"- config overrides: {_fields(self.config_overrides) or 'none'}",
            "",
            f"## Source tensors carried over ({len(self.mapped)})",
            "",
            "| source | destination | shape | note |",
            "|---|---|---|---|",
            *(f"| `{m['source']}` | `{m['destination']}` | {m['shape']} | {m['note']} |" for m in self.mapped),
            "",
            f"## Source tensors not carried over ({len(self.not_carried)})",
            "",
        ]
        if self.not_carried:
            lines += ["| source | shape | reason |", "|---|---|---|"]
            lines += [f"| `{m['source']}` | {m['shape']} | {m['reason']} |" for m in self.not_carried]
        else:
            lines.append("None.")
        lines += ["", f"## New tensors ({len(self.new)})", ""]
        if self.new:
            lines += ["| tensor | shape | initialisation |", "|---|---|---|"]
            lines += [f"| `{m['name']}` | {m['shape']} | {m['init']} |" for m in self.new]
        else:
            lines.append("None: every parameter of the target comes from the source.")
        if self.tied:
            lines += ["", "## Tied tensors", ""]
            lines += [f"- `{m['name']}` is `{m['tied_to']}`" for m in self.tied]
        return "\n".join(lines) + "\n"

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        (folder / REPORT_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        (folder / REPORT_TEXT_FILE).write_text(self.render(), encoding="utf-8")


def _fields(values: dict[str, Any]) -> str:
    return ", ".join(f"`{key}={value!r}`" for key, value in values.items())


def read_report(folder: str | Path) -> ConversionReport | None:
    """The conversion report saved in `folder`, or `None` when the folder holds none."""
    path = Path(folder) / REPORT_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    known = {f.name for f in dataclasses.fields(ConversionReport)}
    return ConversionReport(**{key: value for key, value in data.items() if key in known})


def copy_report(source_folder: str | Path, destination: str | Path) -> bool:
    """Copy the conversion report of `source_folder` (if it has one) into `destination`; returns whether it did."""
    source_folder, destination = Path(source_folder), Path(destination)
    if not (source_folder / REPORT_FILE).is_file() or source_folder.resolve() == destination.resolve():
        return False
    for name in (REPORT_FILE, REPORT_TEXT_FILE):
        if (source_folder / name).is_file():
            shutil.copy2(source_folder / name, destination / name)
    return True

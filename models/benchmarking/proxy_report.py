"""The CPU proxies of a row against the dense family's and the issue's targets, and a static check for host copies.

[`summarize_proxies`] turns two [`~attnzoo.benchmarking.proxies.LayerProxies`] (a row's and the dense family's at the
same length) into a [`ProxySummary`]: what the row adds per layer, and which of the targets it is over, with the
numbers. [`host_copy_sites`] reads a family's attention code for `torch.tensor(..., device=...)` and `.to(device)`:
on a CPU they copy nothing, on CUDA each one copies host data to the device and waits for it.
"""

from __future__ import annotations

import ast
import importlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .proxies import (
    PROXY_LENGTH,
    PROXY_ROWS,
    PROXY_SIZE,
    SAVED_RATIO_TARGETS,
    TARGETS,
    LayerProxies,
    measure_layer_proxies,
    proxy_rows,
)
from .rows import family_package, resolve_families
from .settings import REFERENCE_MODEL, ModelSize

_PACKAGE = Path(__file__).resolve().parents[1]
#: Shared code every family's attention runs through (read for host copies with each family's own package).
SHARED_ATTENTION_CODE = (
    "kernels",
    "core/attention.py",
    "core/attention_interface.py",
    "core/global_tokens.py",
    "core/masking.py",
    "core/positions.py",
)
#: Builders of a tensor from host data: with a `device=` argument they copy it to the device.
_FROM_HOST = frozenset({"tensor", "as_tensor", "asarray"})


@dataclass
class ProxySummary:
    """A row's proxies relative to the dense family (per encoder layer, at one length).

    Args:
        row / family / length: what was measured.
        extra_ops_fwd / extra_ops_fwd_bwd: aten ops over dense's.
        syncs: device syncs over dense's, by `"<kind> at <line>"`, both modes together.
        host_copies: static sites of host-to-device copies in the family's attention code.
        saved_ratio: the layer's saved-for-backward bytes over dense's.
        largest_ratio / largest_op: the largest intermediate over the FFN activation, and what wrote it.
        sdpa_math_bytes: `N x N` fp32 scores SDPA's math kernel writes on CUDA (a head dim not a multiple of 8).
        written_ratio: bytes written by the ops of a forward+backward over dense's.
        launches_fwd / launches_fwd_bwd: Triton launches (stubbed runs).
        apart_extra_ops: per layer of a module counted apart, `(fwd, fwd_bwd)` ops over a dense layer's.
        over_budget: target -> what is over it (empty when every target is met).
    """

    row: str
    family: str | None
    length: int
    extra_ops_fwd: int
    extra_ops_fwd_bwd: int
    syncs: dict[str, int]
    host_copies: list[str]
    saved_ratio: float
    largest_ratio: float
    largest_op: str
    sdpa_math_bytes: int
    written_ratio: float
    launches_fwd: int
    launches_fwd_bwd: int
    apart_extra_ops: dict[str, tuple[int, int]] = field(default_factory=dict)
    over_budget: dict[str, str] = field(default_factory=dict)

    @property
    def num_syncs(self) -> int:
        return sum(self.syncs.values())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize_proxies(proxies: LayerProxies, dense: LayerProxies) -> ProxySummary:
    """`proxies` against `dense` (the dense family's, same length and size) and the issue's targets ([`TARGETS`]).

    The targets checked: `ops` (+15 forward, +30 forward+backward), `syncs` (none added, no static host copy),
    `saved` (1.1x dense, FSAT 1.5x), `largest` (no intermediate above the FFN activation) and `apart_layers` (a layer
    of a network counted apart has no more ops than a dense layer).
    """
    if (proxies.length, proxies.dtype) != (dense.length, dense.dtype):
        raise ValueError(
            f"Compare proxies at the same length and dtype: {proxies.row} at {proxies.length} {proxies.dtype}, "
            f"{dense.row} at {dense.length} {dense.dtype}."
        )
    # Per step: a sync of the forward shows in both modes, once.
    syncs = Counter()
    for mode in ("fwd", "fwd_bwd"):
        syncs |= Counter(getattr(proxies, mode).syncs) - Counter(getattr(dense, mode).syncs)
    largest = max(proxies.fwd.largest_bytes, proxies.fwd_bwd.largest_bytes)
    largest_op = proxies.fwd_bwd.largest_op if largest == proxies.fwd_bwd.largest_bytes else proxies.fwd.largest_op
    apart_extra = {}
    if dense.layer_module is not None:
        for layer in proxies.apart_layers:
            apart_extra[layer.name] = (layer.fwd - dense.layer_module.fwd, layer.fwd_bwd - dense.layer_module.fwd_bwd)
    summary = ProxySummary(
        row=proxies.row,
        family=proxies.family,
        length=proxies.length,
        extra_ops_fwd=proxies.fwd.ops - dense.fwd.ops,
        extra_ops_fwd_bwd=proxies.fwd_bwd.ops - dense.fwd_bwd.ops,
        syncs=dict(sorted(syncs.items())),
        host_copies=host_copy_sites(proxies.family) if proxies.family else [],
        saved_ratio=proxies.saved_bytes / dense.saved_bytes,
        largest_ratio=largest / proxies.ffn_bytes,
        largest_op=largest_op,
        sdpa_math_bytes=max(proxies.fwd.sdpa_math_bytes, proxies.fwd_bwd.sdpa_math_bytes),
        written_ratio=proxies.fwd_bwd.bytes_written / dense.fwd_bwd.bytes_written,
        launches_fwd=sum(proxies.fwd.launches.values()),
        launches_fwd_bwd=sum(proxies.fwd_bwd.launches.values()),
        apart_extra_ops=apart_extra,
    )
    summary.over_budget = over_budget(summary)
    return summary


def over_budget(summary: ProxySummary) -> dict[str, str]:
    """Target -> what `summary` has over it (the measured numbers), for each target it misses."""
    over = {}
    if summary.extra_ops_fwd > TARGETS["extra_ops_fwd"] or summary.extra_ops_fwd_bwd > TARGETS["extra_ops_fwd_bwd"]:
        over["ops"] = (
            f"+{summary.extra_ops_fwd} ops forward / +{summary.extra_ops_fwd_bwd} forward+backward over dense "
            f"(target +{TARGETS['extra_ops_fwd']} / +{TARGETS['extra_ops_fwd_bwd']})"
        )
    if summary.num_syncs > TARGETS["syncs"] or summary.host_copies:
        parts = [f"{count} x {site}" for site, count in summary.syncs.items()]
        parts += [f"host copy in the code at {site}" for site in summary.host_copies]
        over["syncs"] = f"{summary.num_syncs} device syncs added: " + "; ".join(parts)
    saved_target = SAVED_RATIO_TARGETS.get(summary.family or "", TARGETS["saved_ratio"])
    if summary.saved_ratio > saved_target:
        over["saved"] = f"saves {summary.saved_ratio:.2f}x dense's bytes for backward (target {saved_target}x)"
    largest = []
    if summary.largest_ratio > TARGETS["largest_ratio"]:
        largest.append(f"{summary.largest_op} is {summary.largest_ratio:.2f}x the FFN activation")
    if summary.sdpa_math_bytes:
        # Quadratic in N: below the FFN activation at short lengths, far above it at 16K.
        largest.append(
            "an SDPA call with a head dim that is not a multiple of 8 runs SDPA's math kernel on CUDA, which "
            f"writes N x N fp32 scores ({summary.sdpa_math_bytes / 2**20:.0f} MiB here)"
        )
    if largest:
        over["largest"] = "; ".join(largest)
    heavy = {name: extra for name, extra in summary.apart_extra_ops.items() if max(extra) > 0}
    if heavy:
        over["apart_layers"] = "; ".join(
            f"{name}: +{fwd} ops forward / +{fwd_bwd} forward+backward over a dense layer"
            for name, (fwd, fwd_bwd) in heavy.items()
        )
    return over


# ----- static check: host-to-device copies in the attention code -----


def family_source_files(family: str) -> list[Path]:
    """The attention code of `family`: its package's modules (configuration and modeling bindings excluded) and the
    shared code every attention runs through ([`SHARED_ATTENTION_CODE`])."""
    (resolved,) = resolve_families([family])
    package = Path(importlib.import_module(family_package(resolved)).__file__).resolve().parent
    files = [
        path
        for path in sorted(package.glob("*.py"))
        if not path.name.startswith(("configuration_", "modeling_", "__init__"))
    ]
    for shared in SHARED_ATTENTION_CODE:
        target = _PACKAGE / shared
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return files


def host_copy_sites(family: str) -> list[str]:
    """`"path:line: code"` of every host-to-device copy in `family`'s attention code ([`find_host_copies`])."""
    sites = []
    for path in family_source_files(family):
        source = path.read_text()
        for line, code in find_host_copies(source):
            sites.append(f"{path.relative_to(_PACKAGE).as_posix()}:{line}: {code}")
    return sites


def find_host_copies(source: str) -> list[tuple[int, str]]:
    """`(line, code)` of each call in `source` that copies host data to a device on CUDA: `torch.tensor(...)`,
    `torch.as_tensor(...)` or `torch.asarray(...)` with a `device=` argument, and `.to(...)` / `.cuda()` whose target
    is a device (an argument named `device` or ending in `.device`). Moving a tensor that is already on the device is
    free, but hot code has no reason to move anything: it builds on the device."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attribute, owner = node.func.attr, node.func.value
        keywords = {keyword.arg: keyword.value for keyword in node.keywords}
        from_host = attribute in _FROM_HOST and isinstance(owner, ast.Name) and owner.id == "torch"
        copies_host_data = from_host and "device" in keywords and not _is_cpu(keywords["device"])
        moves = attribute == "cuda" or (
            attribute == "to" and any(_names_a_device(arg) for arg in [*node.args, keywords.get("device")])
        )
        if copies_host_data or moves:
            found.append(node)
    return sorted((node.lineno, ast.get_source_segment(source, node) or "") for node in found)


def _names_a_device(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "device"
    return isinstance(node, ast.Attribute) and node.attr == "device"


def _is_cpu(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == "cpu"


def markdown_table(summaries: list[ProxySummary]) -> str:
    """One Markdown table of the summaries: a row per benchmark row, the targets in the header."""
    lines = [
        f"| row | extra ops fwd / fwd+bwd (≤ +{TARGETS['extra_ops_fwd']} / +{TARGETS['extra_ops_fwd_bwd']}) "
        "| syncs added (0) | host copies in code (0) | saved × dense (≤ 1.1, FSAT 1.5) "
        "| largest × FFN activation (≤ 1) | written × dense | Triton launches fwd / fwd+bwd | over budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.row} | +{s.extra_ops_fwd} / +{s.extra_ops_fwd_bwd} | {s.num_syncs} | {len(s.host_copies)} "
            f"| {s.saved_ratio:.2f} | {s.largest_ratio:.2f} ({s.largest_op}) | {s.written_ratio:.2f} "
            f"| {s.launches_fwd} / {s.launches_fwd_bwd} | {', '.join(s.over_budget) or 'none'} |"
        )
    return "\n".join(lines)


def run_proxies(
    rows: list[str] | tuple[str, ...] = PROXY_ROWS,
    length: int = PROXY_LENGTH,
    *,
    size: ModelSize = PROXY_SIZE,
    device: str = "cpu",
    log: Callable[[str], None] = print,
    attention_dropout: float = 0.0,
) -> dict[str, Any]:
    """Measure the proxies of `rows` (the dense family is added) and summarise each against dense.

    `attention_dropout`: the rows' attention dropout in training (what the configs default to; the benchmark's rows
    have none). The dense reference keeps none: on CUDA its SDPA drops inside the same kernel, so its ops are those of
    the dropout-free layer, while on the CPU its dropout would take SDPA's math path.

    Returns `{"length", "device", "size", "proxies": {row: LayerProxies as dict}, "summaries": {row: ...},
    "errors": {row: message}}`; a row that raises is recorded in `errors` and the others still run.
    """
    names = [REFERENCE_MODEL, *[name for name in rows if name != REFERENCE_MODEL]]
    measured: dict[str, LayerProxies] = {}
    errors: dict[str, str] = {}
    for row in proxy_rows(names):
        try:
            dropout = 0.0 if row.name == REFERENCE_MODEL else attention_dropout
            measured[row.name] = measure_layer_proxies(
                row, length, size=size, device=device, attention_dropout=dropout
            )
        except Exception as err:  # noqa: BLE001 - one family's failure is a finding; the others still count
            errors[row.name] = f"{type(err).__name__}: {err}"
        log(f"proxies {row.name}: {errors.get(row.name, 'measured')}")
    dense = measured.get(REFERENCE_MODEL)
    summaries = {name: summarize_proxies(p, dense) for name, p in measured.items()} if dense else {}
    return {
        "length": length,
        "device": device,
        "dtype": "bfloat16",
        "attention_dropout": attention_dropout,
        "size": asdict(size),
        "torch": torch.__version__,
        "proxies": {name: p.to_json() for name, p in measured.items()},
        "summaries": {name: s.to_json() for name, s in summaries.items()},
        "errors": errors,
    }


def proxies_markdown(report: dict[str, Any]) -> str:
    """The proxies report as Markdown: the summary table and each row's over-budget details."""
    summaries = [ProxySummary(**data) for data in report["summaries"].values()]
    lines = [
        f"Per encoder layer at N = {report['length']}, width {report['size']['hidden_size']}, "
        f"{report['size']['num_attention_heads']} heads, {report['dtype']}, on {report['device']} (torch "
        f"{report['torch']}); extra = over `{REFERENCE_MODEL}`"
        + (
            f"; the rows train with attention dropout {report['attention_dropout']} (dense without: its SDPA drops "
            "in the same kernel on CUDA)."
            if report.get("attention_dropout")
            else "."
        ),
        "",
        markdown_table(summaries),
        "",
    ]
    for summary in summaries:
        for target, reason in summary.over_budget.items():
            lines.append(f"- {summary.row}, {target}: {reason}")
    lines += [f"- {name}: not measured ({error})" for name, error in report["errors"].items()]
    return "\n".join(lines) + "\n"


def write_proxies(report: dict[str, Any], output_dir: str | Path) -> dict[str, Path]:
    """Write `proxies.json` and `proxies.md` into `output_dir`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": output_dir / "proxies.json", "markdown": output_dir / "proxies.md"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    paths["markdown"].write_text(proxies_markdown(report))
    return paths

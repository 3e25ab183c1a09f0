"""Model cards: evaluation results from a training run's metrics JSON, rendered through `model_cards/TEMPLATE.md`.

Accepted metrics files (documented in `scripts/README.md`, "Publishing"):

* the `metrics.json` the attnzoo training scripts write: `{"metrics": {"eval_accuracy": 0.81, ...}, "global_step":
  ..., "data": {...}, ...}` (the run information around `"metrics"` feeds the card's training section);
* a flat dict as Trainer writes it (`all_results.json`, `eval_results.json`): `{"eval_accuracy": 0.81,
  "eval_loss": 0.43, "train_loss": ...}`.

Every number under an `eval_` (validation split), `test_` or `predict_` (test split) key is a result, except the
bookkeeping values (runtime, samples or steps per second, epoch, memory); `train_*` keys are training statistics.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

#: Metric key prefix -> dataset split of the result.
SPLIT_PREFIXES: dict[str, str] = {"eval_": "validation", "test_": "test", "predict_": "test"}
_BOOKKEEPING = re.compile(r"(runtime|_per_second|^epoch$|^mem_|flos|compilation_time|preparation_time)")
#: Pretty metric names for the results table; other names are shown as they are.
METRIC_NAMES: dict[str, str] = {
    "accuracy": "Accuracy",
    "f1": "F1",
    "macro_f1": "Macro F1",
    "matthews_correlation": "Matthews correlation",
    "pearson": "Pearson r",
    "spearmanr": "Spearman rho",
    "loss": "Loss",
    "perplexity": "Perplexity",
    "rouge1": "ROUGE-1",
    "rouge2": "ROUGE-2",
    "rougeL": "ROUGE-L",
    "rougeLsum": "ROUGE-Lsum",
    "gen_len": "Generated length",
}


class CardError(ValueError):
    """The card cannot be written as asked (the message names the missing or malformed input)."""


@dataclass(frozen=True)
class Result:
    """One evaluation result: `metric` (e.g. `"accuracy"`) on `split` with `value`."""

    metric: str
    value: float
    split: str


@dataclass
class RunMetrics:
    """The results of a metrics file plus the run information the attnzoo training scripts store around them."""

    results: list[Result]
    train: dict[str, float] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_metrics(data: dict[str, Any]) -> RunMetrics:
    """
    Split a metrics dict (either accepted layout, see the module docstring) into results and training statistics.

    Raises:
        [`CardError`]: when the dict is not a mapping of metric names or a result value is not a number.
    """
    if not isinstance(data, dict):
        raise CardError(f"The metrics JSON must be an object, got {type(data).__name__}.")
    nested = isinstance(data.get("metrics"), dict)
    flat = data["metrics"] if nested else data
    run = {key: value for key, value in data.items() if key != "metrics"} if nested else {}
    results, train = [], {}
    for key, value in flat.items():
        prefix = next((p for p in SPLIT_PREFIXES if key.startswith(p)), None)
        name = key[len(prefix) :] if prefix else key
        if _BOOKKEEPING.search(name):
            continue
        if prefix is None:
            if key.startswith("train_") and _is_number(value):
                train[key[len("train_") :]] = float(value)
            continue
        if not _is_number(value):
            raise CardError(f"Metric {key!r} must be a number, got {value!r}.")
        results.append(Result(metric=name, value=float(value), split=SPLIT_PREFIXES[prefix]))
    return RunMetrics(results=results, train=train, run=run)


def load_metrics(path: str | Path) -> RunMetrics:
    """Read a metrics JSON file (see [`parse_metrics`])."""
    path = Path(path)
    if not path.is_file():
        raise CardError(f"Metrics file {path} does not exist.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CardError(f"Metrics file {path} is not valid JSON: {err}.") from None
    return parse_metrics(data)


@dataclass
class CardInfo:
    """
    What the card says beyond the method text: identity, data, results and licence.

    Args:
        repo_id (`str`): Hub repository (`"org/name"`), used in the loading examples.
        family_name (`str`): the family's name (`"dense_transformer"`), picks `model_cards/<family_name>.md`.
        model_type (`str`): the config's `model_type`.
        architecture (`str`): the saved model class (`"DenseTransformerForSequenceClassification"`).
        auto_class (`str`): the Auto class that loads it (`"AutoModelForSequenceClassification"`).
        task_type (`str`): Hub task id of the results and the pipeline tag (`"text-classification"`).
        dataset_name (`str`): pretty name of the evaluation data set (`"GLUE SST-2"`).
        metrics ([`RunMetrics`]): results and run information.
        dataset_id (`str`, *optional*): Hub data set id (`"nyu-mll/glue"`); also listed under `datasets`. The
            results enter the YAML `model-index` only with it (the Hub reads the index's data set as an id).
        dataset_config (`str`, *optional*): data set configuration (`"sst2"`).
        license (`str`, defaults to `"apache-2.0"`): licence of the weights.
        language (`str`, *optional*): language code of the training data.
        base_model (`str`, *optional*): Hub id of the checkpoint this one was fine-tuned from.
        training_summary (`str`, *optional*): how the model was trained (data, recipe), in Markdown.
        model_summary (`dict[str, Any]`): architecture facts shown in the overview table.
        requirements (`list[str]`): extra packages the remote code imports.
        model_name (`str`, *optional*): title and model-index name; defaults to the repository name.
    """

    repo_id: str
    family_name: str
    model_type: str
    architecture: str
    auto_class: str
    task_type: str
    dataset_name: str
    metrics: RunMetrics
    dataset_id: str | None = None
    dataset_config: str | None = None
    license: str = "apache-2.0"
    language: str | None = None
    base_model: str | None = None
    training_summary: str | None = None
    model_summary: dict[str, Any] = field(default_factory=dict)
    requirements: list[str] = field(default_factory=list)
    model_name: str | None = None

    @property
    def name(self) -> str:
        return self.model_name or self.repo_id.rsplit("/", 1)[-1]


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """`(metadata, body)` of a Markdown file that may start with a `---` YAML block."""
    match = re.match(r"\A---\s*\n(.*?)\n---\s*\n", text, flags=re.DOTALL)
    if not match:
        return {}, text
    meta = yaml.safe_load(match.group(1)) or {}
    if not isinstance(meta, dict):
        raise CardError("The YAML block at the top of the method card must be a mapping.")
    return meta, text[match.end() :]


def nest_headings(markdown: str, levels: int = 1) -> str:
    """Push every Markdown heading `levels` deeper (outside code fences), so a method text fits under the card."""
    out, fence = [], None
    for line in markdown.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            marker = stripped[:3]
            fence = None if fence == marker else (fence or marker)
        elif fence is None and re.match(r"#{1,5} ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out).strip() + "\n"


def _method_section(text: str) -> str:
    """The method text as a section of the card: its title becomes a `##` heading (or one is added)."""
    text = nest_headings(text)
    return text if text.startswith("## ") else f"## The method\n\n{text}"


def card_data(info: CardInfo, method_meta: dict[str, Any] | None = None) -> ModelCardData:
    """The YAML metadata of the card: licence, library, pipeline tag, tags, data sets, metrics and model-index."""
    if not info.metrics.results:
        raise CardError(
            "The card has no results: the metrics JSON holds no `eval_*`/`test_*` number. Evaluate the model "
            "(the training scripts write metrics.json with the eval_* values) and pass that file."
        )
    method_meta = dict(method_meta or {})
    tags = ["attnzoo", "sparse-attention", info.family_name, info.model_type]
    tags += [tag for tag in method_meta.pop("tags", []) or [] if tag not in tags]
    # The Hub reads a model-index data set as a data set id: without one the results stay in the card's table only
    # (a display name there would point to a data set that does not exist).
    eval_results = [
        EvalResult(
            task_type=info.task_type,
            dataset_type=info.dataset_id,
            dataset_name=info.dataset_name,
            dataset_config=info.dataset_config,
            dataset_split=result.split,
            metric_type=result.metric,
            metric_name=METRIC_NAMES.get(result.metric, result.metric),
            metric_value=result.value,
        )
        for result in info.metrics.results
        if info.dataset_id
    ]
    fields = {
        "license": info.license,
        "language": info.language,
        "library_name": "transformers",
        "pipeline_tag": info.task_type,
        "tags": list(dict.fromkeys(tags)),
        "datasets": [info.dataset_id] if info.dataset_id else None,
        "metrics": list(dict.fromkeys(result.metric for result in info.metrics.results)),
        "base_model": info.base_model,
        "model_name": info.name,
        "eval_results": eval_results or None,
    }
    # The method text may add metadata (e.g. `arxiv`), never override what the run determines.
    extras = {key: value for key, value in method_meta.items() if key not in fields and key != "model-index"}
    return ModelCardData(**fields, **extras)


def _format_value(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def render_model_card(info: CardInfo, card_dir: str | Path) -> ModelCard:
    """
    Render `card_dir/TEMPLATE.md` with the family's text `card_dir/<family_name>.md` and `info`.

    The method text may start with a YAML block; its `tags` are added to the card's tags and its other keys are
    merged into the metadata. Its headings are nested one level under the card's title (its own title becomes the
    section heading; a text without one gets "The method").

    Raises:
        [`CardError`]: when a file is missing or the metrics hold no result.
    """
    from .. import __version__

    card_dir = Path(card_dir)
    template = card_dir / "TEMPLATE.md"
    method_file = card_dir / f"{info.family_name}.md"
    for path in (template, method_file):
        if not path.is_file():
            raise CardError(f"Model card file {path} does not exist.")
    method_meta, method_text = split_front_matter(method_file.read_text(encoding="utf-8"))
    data = card_data(info, method_meta)
    run = info.metrics.run
    results = [
        {
            "split": result.split,
            "metric": METRIC_NAMES.get(result.metric, result.metric),
            "value": _format_value(result.value),
        }
        for result in info.metrics.results
    ]
    training_facts = {
        "steps": run.get("global_step"),
        "processes": run.get("num_processes"),
        "transformers": (run.get("environment") or {}).get("transformers"),
        **{f"train_{key}": _format_value(value) for key, value in info.metrics.train.items()},
    }
    return ModelCard.from_template(
        data,
        template_path=str(template),
        model_name=info.name,
        repo_id=info.repo_id,
        family_name=info.family_name,
        model_type=info.model_type,
        architecture=info.architecture,
        auto_class=info.auto_class,
        task_type=info.task_type,
        dataset_name=info.dataset_name,
        dataset_id=info.dataset_id,
        dataset_config=info.dataset_config,
        results=results,
        training_summary=(info.training_summary or "").strip(),
        training_facts={key: value for key, value in training_facts.items() if value is not None},
        data_counts=run.get("data") or {},
        model_summary=info.model_summary,
        requirements=" ".join(["torch", "transformers", *info.requirements]),
        method_text=_method_section(method_text),
        attnzoo_version=__version__,
    )

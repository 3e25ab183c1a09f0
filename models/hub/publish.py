"""Assemble the folder a trained checkpoint is published as, and upload it with `huggingface_hub`.

The folder holds exactly what goes to the Hub: `config.json` (with an `auto_map` for all five Auto classes),
safetensors weights, tokenizer files, `generation_config.json` for encoder-decoders, `README.md` (the model card)
and the family's flat remote code, so the repository loads both with `import attnzoo` and with
`trust_remote_code=True` alone.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..core.configuration import ZooConfig
from ..registry import FAMILIES, Family
from .card import CardError, CardInfo, load_metrics, render_model_card
from .remote_code import AUTO_CLASSES, RemoteCodeError, generate_remote_code

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
GENERATION_CONFIG_FILE = "generation_config.json"
#: Tokenizer files copied when present (v5 fast tokenizers write the first two; the others are older layouts).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
#: Architecture suffix -> (Auto class, Hub task of the pipeline tag and of the results).
HEAD_TASKS: dict[str, tuple[str, str]] = {
    "ForConditionalGeneration": ("AutoModelForSeq2SeqLM", "summarization"),
    "ForSequenceClassification": ("AutoModelForSequenceClassification", "text-classification"),
    "ForMaskedLM": ("AutoModelForMaskedLM", "fill-mask"),
    "Model": ("AutoModel", "feature-extraction"),
}


class PublishError(ValueError):
    """A checkpoint or an option that cannot be published; the message names the problem."""


def _help(text: str, default: Any = None, required: bool = False) -> Any:
    return field(metadata={"help": text}) if required else field(default=default, metadata={"help": text})


@dataclass
class PublishOptions:
    """What to publish and how to describe it: the options of `scripts/publish.py` (each field's `help` says more)."""

    checkpoint: str = _help("Trained checkpoint folder (config.json, model.safetensors, tokenizer).", required=True)
    output_dir: str = _help("Folder to assemble; must be new or empty unless --overwrite.", required=True)
    repo_id: str = _help("Hub repository, 'org/name' (also used in the card's loading examples).", required=True)
    metrics: str = _help(
        "Metrics JSON of the run: the training scripts' metrics.json or Trainer's all_results.json.", required=True
    )
    dataset_name: str = _help("Pretty name of the evaluation data set, e.g. 'GLUE SST-2'.", required=True)
    dataset_id: str | None = _help("Hub id of the evaluation data set, e.g. 'nyu-mll/glue'.")
    dataset_config: str | None = _help("Configuration of the data set, e.g. 'sst2'.")
    task_type: str | None = _help("Hub task of the results and pipeline tag (default: from the model head).")
    license: str = _help("Licence of the weights.", "apache-2.0")
    language: str | None = _help("Language code of the data, e.g. 'en'.")
    base_model: str | None = _help(
        "Hub id of the checkpoint this model was fine-tuned from (default: the Hub source of the checkpoint's "
        "conversion_report.json, when it was converted from BERT / RoBERTa)."
    )
    training_summary: str | None = _help("How the model was trained, Markdown text or '@file.md'.")
    model_name: str | None = _help("Title of the card and name in model-index (default: the repository name).")
    card_dir: str | None = _help("Folder of the model cards' TEMPLATE.md and <family>.md (a checkout's model_cards/).")
    allow_missing_tokenizer: bool = _help("Publish a checkpoint without tokenizer files.", False)
    overwrite: bool = _help("Empty a non-empty output_dir first.", False)


@dataclass
class Assembled:
    """The assembled folder: its path, the files in it (relative, sorted) and the checkpoint's family."""

    folder: Path
    files: list[str]
    family: Family
    auto_map: dict[str, str] = field(default_factory=dict)


def _card_dir(options: PublishOptions) -> Path:
    # The card texts belong to a source checkout, not to the installed package: the caller names the folder.
    if options.card_dir is None:
        raise PublishError("`card_dir` is required: the folder holding the model cards' TEMPLATE.md and <family>.md.")
    return Path(options.card_dir)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise PublishError(f"{path} is not valid JSON: {err}.") from None


def family_of(config: dict[str, Any]) -> Family:
    """The registered family of a `config.json` dict."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise PublishError(
            f"Unknown model type {model_type!r} in config.json: not an attnzoo family (registered: "
            f"{', '.join(sorted(FAMILIES))})."
        )
    return FAMILIES[model_type]


def _architecture(config: dict[str, Any], family: Family) -> tuple[str, str, str]:
    """`(class name, Auto class, task)` of the saved head."""
    names = {getattr(family, attribute).__name__ for attribute in AUTO_CLASSES.values()}
    architectures = config.get("architectures") or [family.model_class.__name__]
    name = architectures[0]
    if name not in names:
        raise PublishError(
            f"config.json names the architecture {name!r}, which is not a class of the {family.name!r} family "
            f"({', '.join(sorted(names - {family.config_class.__name__}))})."
        )
    for suffix, (auto_class, task) in HEAD_TASKS.items():
        if name.endswith(suffix):
            return name, auto_class, task
    raise PublishError(f"No Hub task is known for the architecture {name!r}.")


def _weight_files(checkpoint: Path) -> list[str]:
    if (checkpoint / WEIGHTS_FILE).is_file():
        return [WEIGHTS_FILE]
    if (checkpoint / WEIGHTS_INDEX_FILE).is_file():
        shards = sorted(set(_read_json(checkpoint / WEIGHTS_INDEX_FILE).get("weight_map", {}).values()))
        missing = [shard for shard in shards if not (checkpoint / shard).is_file()]
        if missing or not shards:
            raise PublishError(f"Missing weights: {WEIGHTS_INDEX_FILE} in {checkpoint} lists absent shards {missing}.")
        return [WEIGHTS_INDEX_FILE, *shards]
    hint = (
        " (only PyTorch .bin weights: load and re-save the model with save_pretrained)"
        if any(checkpoint.glob("*.bin"))
        else ""
    )
    raise PublishError(f"Missing weights: no {WEIGHTS_FILE} in {checkpoint}{hint}.")


def _model_summary(config: Any, weights: list[str], checkpoint: Path, is_seq2seq: bool) -> dict[str, Any]:
    from safetensors import safe_open

    parameters = 0
    for name in weights:
        if name.endswith(".safetensors"):
            with safe_open(str(checkpoint / name), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                    parameters += _numel(handle, key)
    summary = {
        "parameters": f"{parameters / 1e6:.2f} M (stored; tied weights once)",
        "encoder": f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, FFN {config.intermediate_size}",
        "max positions": config.max_position_embeddings,
        "vocabulary": config.vocab_size,
        "attention backend": f"`{config.attention_backend}`",
    }
    if is_seq2seq:
        summary["decoder"] = f"{config.decoder_layers} layers, max positions {config.decoder_max_position_embeddings}"
        if config.copy_from_source:
            summary["decoder"] += ", copy head (pointer-generator: copies tokens of the input)"
    # The method's own fields (those ZooConfig does not declare) are what distinguishes the family's checkpoints.
    shared = {item.name for item in dataclasses.fields(ZooConfig)}
    own = [item.name for item in dataclasses.fields(config) if item.name not in shared]
    if own:
        summary["method settings"] = ", ".join(f"`{name}={getattr(config, name)!r}`" for name in own)
    return summary


def _numel(handle: Any, key: str) -> int:
    count = 1
    for size in handle.get_slice(key).get_shape():
        count *= size
    return count


def _converted_from(checkpoint: Path) -> str | None:
    """The Hub id a checkpoint was converted from (its conversion report's `base_model`), if any."""
    from ..conversion import read_report

    report = read_report(checkpoint)
    return report.base_model if report is not None else None


def _prepare_output(checkpoint: Path, output: Path, overwrite: bool) -> None:
    if output.resolve() == checkpoint.resolve():
        raise PublishError("`output_dir` must differ from the checkpoint folder.")
    if output.exists() and any(output.iterdir()):
        if not overwrite:
            raise PublishError(f"Output folder {output} is not empty (pass --overwrite to replace its content).")
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)


def assemble(options: PublishOptions) -> Assembled:
    """
    Build the upload folder of a checkpoint: copy weights, tokenizer and generation config, write `config.json`
    with `auto_map`, the flat remote code and the rendered model card.

    Raises:
        [`PublishError`]: missing weights or tokenizer, an unknown model type, a card without results, ...
    """
    checkpoint, output = Path(options.checkpoint), Path(options.output_dir)
    try:
        validate_repo_id(options.repo_id)  # it is written into the card's loading examples
    except HFValidationError as err:
        raise PublishError(f"`repo_id` {options.repo_id!r} is not a Hub repository id: {err}") from err
    if not (checkpoint / "config.json").is_file():
        raise PublishError(f"{checkpoint} is not a checkpoint folder: it has no config.json.")
    config_dict = _read_json(checkpoint / "config.json")
    family = family_of(config_dict)
    try:
        config = family.config_class.from_pretrained(checkpoint)
    except (ValueError, TypeError) as err:
        message = f"config.json of {checkpoint} is not a valid {family.config_class.__name__}: {err}"
        raise PublishError(message) from err
    architecture, auto_class, default_task = _architecture(config_dict, family)
    weights = _weight_files(checkpoint)
    tokenizer_files = [name for name in TOKENIZER_FILES if (checkpoint / name).is_file()]
    if "tokenizer_config.json" not in tokenizer_files and not options.allow_missing_tokenizer:
        raise PublishError(
            f"Missing tokenizer: no tokenizer_config.json in {checkpoint} (save the tokenizer next to the model, or "
            "pass --allow_missing_tokenizer)."
        )
    try:
        metrics = load_metrics(options.metrics)
        code = generate_remote_code(family)
    except (CardError, RemoteCodeError) as err:
        raise PublishError(str(err)) from err
    info = CardInfo(
        repo_id=options.repo_id,
        family_name=family.name,
        model_type=family.model_type,
        architecture=architecture,
        auto_class=auto_class,
        task_type=options.task_type or default_task,
        dataset_name=options.dataset_name,
        metrics=metrics,
        dataset_id=options.dataset_id,
        dataset_config=options.dataset_config,
        license=options.license,
        language=options.language,
        base_model=options.base_model or _converted_from(checkpoint),
        training_summary=_text_or_file(options.training_summary),
        model_summary=_model_summary(config, weights, checkpoint, auto_class == "AutoModelForSeq2SeqLM"),
        requirements=code.requirements,
        model_name=options.model_name,
    )
    try:
        card = render_model_card(info, _card_dir(options))
    except CardError as err:
        raise PublishError(str(err)) from err

    _prepare_output(checkpoint, output, options.overwrite)
    for name in [*weights, *tokenizer_files]:
        shutil.copy2(checkpoint / name, output / name)
    if (checkpoint / GENERATION_CONFIG_FILE).is_file():
        shutil.copy2(checkpoint / GENERATION_CONFIG_FILE, output / GENERATION_CONFIG_FILE)
    elif auto_class == "AutoModelForSeq2SeqLM":
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(config).save_pretrained(output)
    config_dict["auto_map"] = code.auto_map
    (output / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    code.write(output)
    card.save(output / "README.md")
    files = sorted(path.relative_to(output).as_posix() for path in output.rglob("*") if path.is_file())
    return Assembled(folder=output, files=files, family=family, auto_map=code.auto_map)


def _text_or_file(value: str | None) -> str | None:
    if value and value.startswith("@"):
        path = Path(value[1:])
        if not path.is_file():
            raise PublishError(f"Training summary file {path} does not exist.")
        return path.read_text(encoding="utf-8")
    return value


def upload(
    assembled: Assembled,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    api: Any = None,
) -> str:
    """
    Create `repo_id` (if needed) and upload exactly `assembled.files` in one commit.

    Args:
        assembled ([`Assembled`]): result of [`assemble`].
        repo_id (`str`): Hub repository, `"org/name"`.
        token (`str`, *optional*): Hub token; defaults to `HF_TOKEN` or the stored login.
        private (`bool`, *optional*): visibility of a newly created repository.
        commit_message (`str`, *optional*): defaults to "Upload <family> model with attnzoo".
        api (*optional*): an `HfApi`-like object (tests pass a recorder); defaults to `HfApi(token=token)`.

    Returns:
        `str`: the URL of the commit (or whatever `upload_folder` returns, as a string).
    """
    from huggingface_hub import HfApi, get_token

    if api is None:
        if token is None and get_token() is None:
            raise PublishError("--push needs a Hub token: pass --token, set HF_TOKEN, or run `hf auth login`.")
        api = HfApi(token=token)
    repo = api.create_repo(repo_id=repo_id, token=token, private=private, repo_type="model", exist_ok=True)
    commit = api.upload_folder(
        repo_id=getattr(repo, "repo_id", repo_id),
        folder_path=str(assembled.folder),
        repo_type="model",
        token=token,
        allow_patterns=list(assembled.files),
        commit_message=commit_message or f"Upload {assembled.family.name} model with attnzoo",
    )
    return str(commit)

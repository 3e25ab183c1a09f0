"""Model and tokenizer construction of the training scripts: fresh, from a checkpoint, or warm-started across
families, plus checkpoint discovery for resuming."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer, PreTrainedModel
from transformers.trainer_utils import get_last_checkpoint

from ..core.config_fields import check_override_fields, parse_config_overrides, tokenizer_special_ids

logger = logging.getLogger(__name__)


def load_tokenizer(name_or_path: str, cache_dir: str | None = None) -> Any:
    """Load a tokenizer folder (from `scripts/train_tokenizer.py`) or a Hub tokenizer."""
    if Path(name_or_path).exists() and not (Path(name_or_path) / "tokenizer_config.json").is_file():
        raise ValueError(f"'{name_or_path}' holds no tokenizer (no tokenizer_config.json); train one first.")
    return AutoTokenizer.from_pretrained(name_or_path, cache_dir=cache_dir)


def build_model(
    auto_class: Any, model_args: Any, tokenizer: Any, **task_fields: Any
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """
    Build the model named by `ModelArguments`.

    - `config_path` only: a fresh model of that architecture, with the tokenizer's vocabulary and special ids.
    - `model_name_or_path` only: the checkpoint, with `config_overrides` and `task_fields` applied.
    - both: a warm start. The architecture (and family) of `config_path` is loaded from the checkpoint name for name
      (the shared layout of the zoo), the parameters the checkpoint lacks (a sparse method's own, a new head) are
      initialised fresh; missing, unexpected and mismatched keys are logged and returned.

    Args:
        auto_class: e.g. `AutoModelForMaskedLM`.
        model_args: a `ModelArguments`.
        tokenizer: the run's tokenizer (its size must fit the model's vocabulary); its `model_max_length` is set to
            the model's `max_position_embeddings`.
        task_fields: config fields of the task (`num_labels`, `id2label`, `problem_type`, ...).

    Returns:
        `(model, info)` with `info` holding `"init"` (`"scratch"`, `"checkpoint"` or `"warm_start"`) and, for loads,
        the loading report.
    """
    overrides = parse_config_overrides(model_args.config_overrides)
    info: dict[str, Any] = {}
    if model_args.config_path is not None:
        config = AutoConfig.from_pretrained(model_args.config_path)
        check_override_fields(type(config), overrides)
        fields = {**tokenizer_special_ids(tokenizer), **overrides, **task_fields}
        if model_args.model_name_or_path is not None:
            source = AutoConfig.from_pretrained(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
            # The embeddings come from the checkpoint: keep its vocabulary and special ids.
            for name in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
                fields[name] = getattr(source, name)
        config = AutoConfig.from_pretrained(model_args.config_path, **fields)
        if model_args.model_name_or_path is None:
            model = auto_class.from_config(config)
            info["init"] = "scratch"
        else:
            check_positions_kept(source, config.position_embedding_type)
            check_shapes_kept(source, config)
            model, loading = auto_class.from_pretrained(
                model_args.model_name_or_path, config=config, cache_dir=model_args.cache_dir, output_loading_info=True
            )
            info.update(init="warm_start", source=model_args.model_name_or_path, **_loading_report(loading))
    else:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
        check_override_fields(type(config), overrides)
        check_positions_kept(config, overrides.get("position_embedding_type", trained_positions(config)))
        model, loading = auto_class.from_pretrained(
            model_args.model_name_or_path,
            cache_dir=model_args.cache_dir,
            output_loading_info=True,
            **overrides,
            **task_fields,
        )
        info.update(init="checkpoint", source=model_args.model_name_or_path, **_loading_report(loading))
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocabulary has {model.config.vocab_size}; "
            "use the tokenizer the checkpoint was trained with."
        )
    # Saved beside the checkpoint: `truncation=True` (pipelines included) then cuts at what the model reads, not at
    # the tokenizer's default 512 (a 1,024-token classifier read 512 tokens through its pipeline).
    tokenizer.model_max_length = model.config.max_position_embeddings
    n_params = sum(p.numel() for p in model.parameters())
    info["parameters"] = n_params
    logger.info("Model %s (%s, %.2fM parameters)", type(model).__name__, info["init"], n_params / 1e6)
    return model, info


def check_shapes_kept(source: Any, config: Any) -> None:
    """Refuse a warm start whose shared weights differ in shape (transformers would stop with a traceback).

    The checkpoint loads name for name into `config`'s architecture: its width, feed-forward size, token types and a
    learned position table must be the ones `config_path` asks for; depth may differ (missing layers start fresh).
    """
    fields = ["hidden_size", "intermediate_size", "type_vocab_size"]
    if config.position_embedding_type == "absolute":
        fields.append("max_position_embeddings")  # the learned table's rows
    differ = [
        f"{name} {getattr(source, name, None)} (checkpoint) vs {getattr(config, name)} (config_path)"
        for name in fields
        if getattr(source, name, None) != getattr(config, name)
    ]
    if differ:
        raise ValueError(
            "A warm start loads the checkpoint's weights name for name, so their shapes must match: "
            f"{'; '.join(differ)}. Use a config_path of the checkpoint's sizes (or convert_checkpoint.py to change "
            "the length)."
        )


def trained_positions(config: Any) -> str:
    """The `position_embedding_type` a checkpoint was trained with. BERT's and RoBERTa's configs in transformers 5.x
    have no such field: their positions are the learned absolute table."""
    return getattr(config, "position_embedding_type", "absolute")


def check_positions_kept(source: Any, position_embedding_type: str) -> None:
    """Refuse to load a checkpoint under another `position_embedding_type`.

    The load would only log it: a learned table is dropped as an unexpected key, or a learned table the checkpoint
    lacks starts random, and the model no longer knows the positions it was trained with.
    """
    trained = trained_positions(source)
    if position_embedding_type != trained:
        raise ValueError(
            f"`position_embedding_type={position_embedding_type!r}` differs from the checkpoint's {trained!r}: its "
            "trained positions would be lost. Keep the checkpoint's, or train a fresh model (`config_path` alone)."
        )


def _loading_report(loading: dict[str, Any]) -> dict[str, list[str]]:
    report = {key: sorted(str(k) for k in loading.get(key, ())) for key in ("missing_keys", "unexpected_keys")}
    report["mismatched_keys"] = sorted(str(k) for k in loading.get("mismatched_keys", ()))
    for key, names in report.items():
        if names:
            logger.info("%s (%d): %s", key, len(names), ", ".join(names))
    return report


CONVERTED_FOLDER = "converted"


def convert_source_checkpoint(model_args: Any, training_args: Any, seq2seq: bool = False) -> Path:
    """
    Convert the BERT / RoBERTa `model_args.model_name_or_path` into `model_args.family` at
    `model_args.max_position_embeddings` positions, into `<output_dir>/converted`, and point `model_args` (and its
    tokenizer, unless another was named) at the converted folder. A resumed run reuses the folder.

    Returns:
        The converted folder.
    """
    from ..conversion import ConversionArguments, convert_for_training

    folder = Path(training_args.output_dir) / CONVERTED_FOLDER
    source = model_args.model_name_or_path
    request = ConversionArguments(
        model_name_or_path=source,
        family=model_args.family,
        max_position_embeddings=model_args.max_position_embeddings,
        output_dir=str(folder),
        config_overrides=model_args.config_overrides,
        seq2seq=seq2seq,
    )
    with training_args.main_process_first(desc="checkpoint conversion"):
        convert_for_training(request, cache_dir=model_args.cache_dir)
    logger.info(
        "Converted %s into %s at %d positions: %s",
        source,
        model_args.family,
        model_args.max_position_embeddings,
        folder,
    )
    model_args.model_name_or_path = str(folder)
    # The conversion applied the overrides; the checkpoint already holds them.
    model_args.config_overrides = None
    if model_args.tokenizer_name_or_path == source:
        model_args.tokenizer_name_or_path = str(folder)
    return folder


def resolve_checkpoint(training_args: Any) -> str | None:
    """
    The checkpoint to resume from, checking the output folder.

    `resume_from_checkpoint` may be a checkpoint folder, or `"last"`/`"true"` for the newest `checkpoint-*` in
    `output_dir`. An output folder that already holds checkpoints without a resume request is an error, so a run
    never silently trains over another one.
    """
    output_dir = training_args.output_dir
    requested = training_args.resume_from_checkpoint
    last = get_last_checkpoint(output_dir) if output_dir and os.path.isdir(output_dir) else None
    if requested is None or str(requested).lower() in ("false", "none", ""):
        if last is not None:
            raise ValueError(
                f"'{output_dir}' already holds checkpoints ({Path(last).name}); pass `--resume_from_checkpoint last` "
                "to continue that run, or choose another `output_dir`."
            )
        return None
    if str(requested).lower() in ("last", "true"):
        if last is None:
            raise ValueError(f"`resume_from_checkpoint` asks for the last checkpoint, but '{output_dir}' has none.")
        return last
    if not os.path.isdir(requested):
        raise ValueError(f"Checkpoint folder not found: '{requested}'.")
    return requested

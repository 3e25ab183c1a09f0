"""Convert a BERT / RoBERTa checkpoint into any attnzoo family at a new length, or into a BERT2BERT encoder-decoder:
the mapped weights, the fresh method parameters, the tokenizer and the report, saved together."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import transformers

from ..core.config_fields import parse_config_overrides
from ..registry import FAMILIES
from .arguments import ConversionArguments
from .conversion_report import ConversionReport
from .errors import ConversionError
from .fresh import describe_init
from .mapping import Mapping, map_weights, shape_of
from .masked_lm_head import init_masked_lm_head
from .source import SourceCheckpoint, load_source
from .target_config import build_config

#: Seed of the fresh parameters, so that a conversion is reproducible.
INIT_SEED = 0


def _target_class(family: str, seq2seq: bool) -> type:
    entry = FAMILIES[family]
    return entry.conditional_generation_class if seq2seq else entry.masked_lm_class


def _check_destinations(mapping: Mapping, target_state: dict[str, torch.Tensor], target_class: type) -> None:
    for destination, tensor in mapping.tensors.items():
        if destination.startswith("classifier.") and destination not in target_state:
            continue
        if destination not in target_state:
            raise ConversionError(f"{target_class.__name__} has no parameter {destination!r} (from the mapping).")
        if target_state[destination].shape != tensor.shape:
            raise ConversionError(
                f"{destination}: the source gives shape {tuple(tensor.shape)}, {target_class.__name__} expects "
                f"{tuple(target_state[destination].shape)}."
            )


def _tied_names(model: torch.nn.Module) -> dict[str, str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return dict(tied) if isinstance(tied, dict) else {}


def convert_checkpoint(
    model_name_or_path: str,
    family: str,
    max_position_embeddings: int,
    output_dir: str | Path,
    config_overrides: dict | str | None = None,
    seq2seq: bool = False,
    cache_dir: str | None = None,
) -> ConversionReport:
    """
    Convert a BERT / RoBERTa checkpoint into `family` at `max_position_embeddings` positions and save it, with the
    tokenizer (its `model_max_length` set to the new length) and the report, in `output_dir`.

    The saved class is `<Prefix>ForMaskedLM` (`<Prefix>ForConditionalGeneration` with `seq2seq`); every head of the
    family loads it with `from_pretrained`. A source without a masked-LM head (`BertModel`, `RobertaModel`) gets a
    fresh one tied to the embeddings, its dense layer the identity ([`init_masked_lm_head`]), so that continued
    pretraining starts from a head that reads the encoder. A source pooler is saved as `classifier.dense` for the
    classification head (`scripts/run_mlm.py` carries it through continued pretraining).

    Args:
        model_name_or_path (`str`): BERT or RoBERTa folder, or Hub id (downloaded only if the network allows).
        family (`str`): target `model_type` (`dense_transformer`, `smart_bird`, `a2former`, `sparse_transformer`,
            `fsat`, `sbm`).
        max_position_embeddings (`int`): the new length; rows beyond the source's repeat its table.
        output_dir (`str` or `Path`): new or empty folder.
        config_overrides (`dict` or `str`, *optional*): method fields to set, as in the training scripts
            (`"num_samples=32,sampling_seed=1"`).
        seq2seq (`bool`, *optional*, defaults to `False`): build the BERT2BERT encoder-decoder (Rothe et al.,
            2020): encoder and decoder from the source, cross-attention fresh.
        cache_dir (`str`, *optional*): cache folder for a Hub download.

    Returns:
        [`ConversionReport`] (also saved as `conversion_report.json` and `.md` in `output_dir`).

    Raises:
        [`ConversionError`]: a source that is not BERT-layout, a tensor that maps nowhere, a bad option.
    """
    if max_position_embeddings < 1:
        raise ConversionError(f"`max_position_embeddings` must be a positive integer, got {max_position_embeddings}.")
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConversionError(f"Output folder {output} is not empty; choose a new one.")
    source = load_source(model_name_or_path, cache_dir)
    overrides = parse_config_overrides(config_overrides)
    config, from_source, own = build_config(source, family, max_position_embeddings, overrides, seq2seq)
    target_class = _target_class(family, seq2seq)
    base_prefix = "model."  # every saved class (a head) holds the encoder under `model.`
    attention_class = FAMILIES[family].attention_class
    mapping = map_weights(source, config, base_prefix, seq2seq, attention_class)

    torch.manual_seed(INIT_SEED)
    model = target_class(config).eval()
    target_state = model.state_dict()
    _check_destinations(mapping, target_state, target_class)
    loadable = {name: tensor for name, tensor in mapping.tensors.items() if name in target_state}
    model.load_state_dict(loadable, strict=False)
    for module in model.get_submodule(f"{base_prefix}encoder").modules():
        if isinstance(module, attention_class):
            module.init_for_warm_start()
    head_rules: dict[str, str] = {}
    if not seq2seq and not source.has_masked_lm_head:
        head_rules = {f"lm_head.{name}": rule for name, rule in init_masked_lm_head(model.lm_head).items()}
    tied = _tied_names(model)
    new = [
        {
            "name": name,
            "shape": shape_of(tensor),
            "init": head_rules.get(name) or describe_init(model, name, config.initializer_range),
        }
        for name, tensor in target_state.items()
        if name not in loadable and name not in tied
    ]
    report = ConversionReport(
        source=model_name_or_path,
        base_model=source.hub_id,
        source_model_type=source.model_type,
        source_architecture=source.architecture,
        source_positions=source.num_positions,
        family=family,
        target_class=target_class.__name__,
        max_position_embeddings=max_position_embeddings,
        seq2seq=seq2seq,
        config_from_source=from_source,
        method_defaults=own,
        config_overrides=overrides,
        positions=_positions_summary(source, max_position_embeddings),
        mapped=mapping.mapped,
        not_carried=mapping.not_carried,
        new=new,
        tied=[{"name": name, "tied_to": target} for name, target in tied.items()],
        versions={"attnzoo": _attnzoo_version(), "transformers": transformers.__version__},
    )

    output.mkdir(parents=True, exist_ok=True)
    extra = {name: tensor for name, tensor in mapping.tensors.items() if name not in target_state}
    state_dict = {**model.state_dict(), **extra} if extra else None
    model.save_pretrained(output, state_dict=state_dict)
    source.tokenizer.model_max_length = max_position_embeddings
    source.tokenizer.save_pretrained(output)
    report.save(output)
    return report


def _positions_summary(source: SourceCheckpoint, rows: int) -> str:
    if source.position_offset:
        start = f"zoo row p = {source.model_type} row p + {source.position_offset} (its first real position)"
    else:
        start = f"zoo row p = {source.model_type} row p"
    extension = (
        f"; rows {source.num_positions}..{rows - 1} repeat the learned table" if rows > source.num_positions else ""
    )
    return f"{start} for p < {min(rows, source.num_positions)}{extension}"


def _attnzoo_version() -> str:
    from .. import __version__

    return __version__


def convert_for_training(request: ConversionArguments, cache_dir: str | None = None) -> Path:
    """Convert as `request` asks, once: a later call (a resumed run, another process) reuses `request.output_dir` if
    it was converted from the same source, family, length, overrides and head, and refuses it otherwise."""
    from .conversion_report import read_report

    output = Path(request.output_dir)
    report = read_report(output)
    if report is None:
        convert_checkpoint(**dataclasses.asdict(request), cache_dir=cache_dir)
        return output
    # field: (what this run asks for, what the folder holds)
    fields = {
        "model_name_or_path": (request.model_name_or_path, report.source),
        "family": (request.family, report.family),
        "max_position_embeddings": (request.max_position_embeddings, report.max_position_embeddings),
        "config_overrides": (parse_config_overrides(request.config_overrides), report.config_overrides),
        "seq2seq": (request.seq2seq, report.seq2seq),
    }
    differing = [
        f"{name} {wanted!r} (it holds {found!r})" for name, (wanted, found) in fields.items() if wanted != found
    ]
    if differing:
        raise ConversionError(
            f"{output} already holds a conversion made with other settings; this run asks for "
            f"{'; '.join(differing)}. Use another output_dir."
        )
    return output

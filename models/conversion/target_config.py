"""The config of a converted model: the source's sizes, the family's method defaults, then the user's overrides."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.config_fields import check_override_fields
from ..core.configuration import ZooConfig
from ..registry import FAMILIES
from .errors import ConversionError
from .source import SourceCheckpoint

SOURCE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "classifier_dropout",
)
#: Fields the source's weights fix: an override would not fit them (or, for `pre_norm`, not compute BERT's function).
FIXED_BY_SOURCE = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "type_vocab_size",
    "pre_norm",
    "decoder_layers",
    "max_position_embeddings",
    "position_embedding_type",
)


def _special_ids(source: SourceCheckpoint) -> dict[str, int | None]:
    """Pad / begin / end ids from the source config, filled from its tokenizer where the config has none (BERT's
    config names no bos/eos: its `[CLS]` and `[SEP]` play those parts)."""
    tokenizer = source.tokenizer
    bos = source.config.get("bos_token_id")
    eos = source.config.get("eos_token_id")
    if bos is None:
        bos = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    if eos is None:
        eos = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return {
        "pad_token_id": source.config.get("pad_token_id", tokenizer.pad_token_id),
        "bos_token_id": bos,
        "eos_token_id": eos,
        "decoder_start_token_id": bos,
    }


def build_config(
    source: SourceCheckpoint, family: str, max_position_embeddings: int, overrides: dict[str, Any], seq2seq: bool
) -> tuple[ZooConfig, dict[str, Any], dict[str, Any]]:
    """The target config: the source's sizes, the family's method defaults, then `overrides`.

    Returns:
        `(config, fields taken from the source, the family's own fields as set)`.
    """
    if family not in FAMILIES:
        raise ConversionError(f"Unknown family {family!r}; choose one of {', '.join(sorted(FAMILIES))}.")
    config_class = FAMILIES[family].config_class
    check_override_fields(config_class, overrides)
    fixed = sorted(set(overrides) & set(FIXED_BY_SOURCE))
    if fixed:
        raise ConversionError(
            f"`config_overrides` cannot set {', '.join(fixed)}: the source checkpoint fixes them "
            "(use --max_position_embeddings for the length)."
        )
    if source.model_type == "roberta" and source.has_masked_lm_head and source.config.get("hidden_act") != "gelu":
        raise ConversionError(
            f"{source.name_or_path}: RoBERTa's LM head applies GELU whatever `hidden_act` says "
            f"({source.config.get('hidden_act')!r}), the zoo's head applies `hidden_act`; they would differ."
        )
    from_source = {name: source.config[name] for name in SOURCE_FIELDS if name in source.config}
    from_source.update(_special_ids(source))
    from_source["type_vocab_size"] = source.config.get("type_vocab_size", 2)
    fields: dict[str, Any] = {**from_source, "max_position_embeddings": max_position_embeddings}
    if seq2seq:
        # Decoder layer i starts from encoder layer i, and decoder positions from the source's (an override may
        # lengthen them: the rows then repeat, as in the encoder).
        # The source's masked-LM head, when it has one, stays the decoder's head (Rothe et al.'s BERT2BERT).
        fields.update(
            decoder_layers=source.config["num_hidden_layers"],
            decoder_max_position_embeddings=source.num_positions,
            lm_head_transform=source.has_masked_lm_head,
        )
    try:
        config = config_class(**{**fields, **overrides})
    except (ValueError, TypeError) as err:
        raise ConversionError(f"The {family} config cannot be built from {source.name_or_path}: {err}") from err
    shared = {item.name for item in dataclasses.fields(ZooConfig)}
    own = {item.name: getattr(config, item.name) for item in dataclasses.fields(config) if item.name not in shared}
    # Shared fields the family (or an override) sets apart from the zoo's defaults change the model too, e.g. the
    # sparse families' global token and mean pooling: compared with the same source fields under those defaults.
    generic = ZooConfig(**fields)
    own.update(
        {name: getattr(config, name) for name in sorted(shared) if getattr(config, name) != getattr(generic, name)}
    )
    return config, from_source, own

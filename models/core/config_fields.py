"""Config fields that come from outside a config file: `config_overrides` strings and a tokenizer's special ids.

Shared by the training scripts (fresh models, warm starts) and the checkpoint converter.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

#: Fields every `PreTrainedConfig` accepts for a task head, besides its declared dataclass fields.
TASK_FIELDS = ("num_labels", "id2label", "label2id", "problem_type")


def parse_config_overrides(overrides: dict | str | None) -> dict[str, Any]:
    """`{"a": 1}` or `"a=1,b=0.1,c=true"` -> a dict with JSON-typed values (numbers, booleans, null, strings)."""
    if overrides is None or overrides == "":
        return {}
    if isinstance(overrides, dict):
        return dict(overrides)
    result = {}
    for item in overrides.split(","):
        if "=" not in item:
            raise ValueError(f"`config_overrides` items must look like field=value, got {item!r}.")
        key, value = (part.strip() for part in item.split("=", 1))
        try:
            result[key] = json.loads(value)
        except json.JSONDecodeError:
            result[key] = value
    return result


def check_override_fields(config_class: type, overrides: dict[str, Any]) -> None:
    """Raise `ValueError` naming every override that is not a field of `config_class`."""
    known = {f.name for f in dataclasses.fields(config_class)} | set(TASK_FIELDS)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"Unknown config field(s) {', '.join(unknown)} for {config_class.__name__}; check `config_overrides`."
        )


def tokenizer_special_ids(tokenizer: Any) -> dict[str, Any]:
    """Vocabulary size and special-token ids of a tokenizer, as config fields (a Hub tokenizer may not use the
    zoo's 0/2/3): `[CLS]`/`<s>` is the beginning and decoder start, `[SEP]`/`</s>` the end."""
    bos = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    eos = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    fields = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    if bos is not None:
        fields.update(bos_token_id=bos, decoder_start_token_id=bos)
    if eos is not None:
        fields["eos_token_id"] = eos
    return fields

"""Shared pieces of the inspection scripts (`scripts/tools/plot_*.py`): arguments, model and inputs.

Every script inspects one encoder run: it builds a model from a config file (random weights) or a checkpoint, encodes
a text or random tokens, and writes a figure. The scripts subclass :class:`InspectionArguments` to add their own
fields (and to change a default, e.g. `output_file`) and call :func:`build_model` and :func:`make_inputs`.
"""

from __future__ import annotations

import importlib
import json
import logging
import pkgutil
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import attnzoo

logger = logging.getLogger(__name__)

__all__ = ["InspectionArguments", "build_model", "import_families", "load_tokenizer", "make_inputs"]


@dataclass
class InspectionArguments:
    """What to inspect. Give exactly one of `config_path` (random weights) and `model_name_or_path` (a checkpoint)."""

    config_path: str | None = field(
        default=None, metadata={"help": "config.json of the family, e.g. configs/models/<method>/tiny.json"}
    )
    model_name_or_path: str | None = field(default=None, metadata={"help": "checkpoint folder (weights and config)"})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "JSON object of config fields to override, e.g. '{\"num_hidden_layers\": 2}'"},
    )
    output_file: str = field(default="inspection.png", metadata={"help": "image to write (png, pdf, svg)"})
    length: int = field(default=128, metadata={"help": "number of random tokens when no --text is given"})
    text: str | None = field(default=None, metadata={"help": "text to encode instead of random tokens"})
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "tokenizer for --text (defaults to --model_name_or_path)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the random weights and tokens"})


def import_families() -> None:
    """Import every method package of attnzoo so families not yet wired into `attnzoo/__init__` register too."""
    for module in pkgutil.iter_modules(attnzoo.__path__):
        if module.ispkg and module.name not in ("core", "kernels"):
            try:
                importlib.import_module(f"attnzoo.{module.name}")
            except ImportError as err:  # a package under development must not stop the others
                logger.warning("skipping attnzoo.%s: %s", module.name, err)


def _ensure_registered(source: str) -> None:
    """Import the family packages when the `model_type` of `source` is not registered with `AutoConfig` yet."""
    model_type = PretrainedConfig.get_config_dict(source)[0].get("model_type")
    if model_type is not None and model_type not in CONFIG_MAPPING:
        import_families()


def build_model(args: InspectionArguments, **overrides: Any) -> PreTrainedModel:
    """The model of `args`, in eval mode: random weights (seeded by `--seed`) from `--config_path`, or a checkpoint.

    `--config_overrides` (a JSON object) and then the keyword `overrides` (a script's fixed settings, e.g.
    `attention_probs_dropout_prob=0.0`) are applied to the config of either source and checked.

    Raises:
        `ValueError`: when both or neither of `--config_path` and `--model_name_or_path` are given.
    """
    if (args.config_path is None) == (args.model_name_or_path is None):
        raise ValueError("Give exactly one of --config_path and --model_name_or_path.")
    source = args.config_path if args.config_path is not None else args.model_name_or_path
    _ensure_registered(source)
    config = AutoConfig.from_pretrained(source)
    overrides = {**(json.loads(args.config_overrides) if args.config_overrides else {}), **overrides}
    if overrides:
        config.update(overrides)
        config.check_zoo_fields()
    torch.manual_seed(args.seed)
    if args.config_path is not None:
        model = AutoModel.from_config(config)
    else:
        model = AutoModel.from_pretrained(args.model_name_or_path, config=config)
    return model.eval()


def load_tokenizer(args: InspectionArguments):
    """The tokenizer for `--text`: `--tokenizer_name_or_path`, else the checkpoint's."""
    return AutoTokenizer.from_pretrained(args.tokenizer_name_or_path or args.model_name_or_path)


def make_inputs(args: InspectionArguments, config: PretrainedConfig, tokenizer=None) -> dict[str, torch.Tensor]:
    """`input_ids` and `attention_mask`, both `(1, N)`: `--text` tokenized, else `--length` random tokens.

    The random tokens are drawn from a generator seeded by `--seed`, with ids from 5 upwards (which avoids the special
    tokens of the zoo's WordPiece vocabularies). `tokenizer` defaults to :func:`load_tokenizer`.
    """
    if args.text is not None:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(args)
        input_ids = tokenizer(args.text, return_tensors="pt")["input_ids"]
    else:
        generator = torch.Generator().manual_seed(args.seed)
        input_ids = torch.randint(5, config.vocab_size, (1, args.length), generator=generator)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}

"""Reading a BERT / RoBERTa checkpoint to convert: its config, every stored tensor and its tokenizer.

The weights are read from the files as stored (safetensors, sharded safetensors or PyTorch `.bin`), not through a
transformers model class, so that nothing a class would drop on load (a pooler, a next-sentence head) goes unseen:
every stored tensor must be accounted for by the conversion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .bert_names import strip_model_prefix
from .errors import ConversionError

#: Source `model_type`s with BERT's parameter layout.
SUPPORTED_MODEL_TYPES = ("bert", "roberta")
SUPPORTED_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "RobertaModel", "RobertaForMaskedLM")
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.model"]
#: Files that hold a tokenizer's vocabulary (transformers builds an empty tokenizer for a folder without one).
_VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


@dataclass
class SourceCheckpoint:
    """
    A checkpoint to convert.

    Args:
        name_or_path (`str`): as given (a folder or a Hub id).
        folder (`Path`): the local folder holding its files.
        hub_id (`str`, *optional*): the Hub repository when the source was given as one.
        config (`dict`): its `config.json`.
        tensors (`dict[str, torch.Tensor]`): every stored tensor, under its stored name.
        tokenizer: the tokenizer stored with it.
    """

    name_or_path: str
    folder: Path
    hub_id: str | None
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer: Any

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def position_offset(self) -> int:
        """Rows of the source position table before the row of a sequence's first token: RoBERTa numbers positions
        from `padding_idx + 1` (fairseq), so its first `pad_token_id + 1` rows are never used by a real token."""
        return self.config["pad_token_id"] + 1 if self.model_type == "roberta" else 0

    @property
    def num_positions(self) -> int:
        """Longest input of the source model (RoBERTa's 514 rows hold 512 positions)."""
        return self.config["max_position_embeddings"] - self.position_offset

    @property
    def architecture(self) -> str:
        architectures = self.config.get("architectures") or []
        return architectures[0] if architectures else "unknown"

    @property
    def has_masked_lm_head(self) -> bool:
        return any(strip_model_prefix(name).startswith(("cls.predictions.", "lm_head.")) for name in self.tensors)

    def tensor(self, stripped_name: str) -> torch.Tensor:
        """A stored tensor by its name without the `bert.` / `roberta.` prefix."""
        for name, value in self.tensors.items():
            if strip_model_prefix(name) == stripped_name:
                return value
        raise ConversionError(f"{self.name_or_path} has no weight {stripped_name!r}.")


def _local_folder(name_or_path: str, cache_dir: str | None) -> tuple[Path, str | None]:
    path = Path(name_or_path)
    if path.is_dir():
        return path, None
    if path.exists() or name_or_path.startswith((".", "/")) or name_or_path.count("/") > 1:
        raise ConversionError(f"{name_or_path} is not a checkpoint folder (and not a Hub repository id).")
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(name_or_path, allow_patterns=_DOWNLOAD_PATTERNS, cache_dir=cache_dir)
    except Exception as err:  # offline, unknown repository, gated model: all end the same way for the user
        raise ConversionError(
            f"{name_or_path} is not a local folder and could not be downloaded from the Hub ({type(err).__name__}: "
            f"{err}). Give a local checkpoint folder."
        ) from err
    return Path(folder), name_or_path


def _read_config(folder: Path, name_or_path: str) -> dict[str, Any]:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConversionError(f"{name_or_path} has no config.json: not a transformers checkpoint folder.")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    architectures = ", ".join(config.get("architectures") or []) or "no architectures listed"
    if model_type not in SUPPORTED_MODEL_TYPES:
        hint = (
            " It is already an attnzoo checkpoint: warm-start it across families with `run_mlm.py --config_path`."
            if "attention_backend" in config
            else ""
        )
        raise ConversionError(
            f"{name_or_path} is a {model_type!r} checkpoint ({architectures}), not a BERT-layout encoder. Only "
            f"model types {', '.join(map(repr, SUPPORTED_MODEL_TYPES))} can be converted "
            f"({', '.join(SUPPORTED_ARCHITECTURES)}).{hint}"
        )
    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ConversionError(
            f"{name_or_path} uses position_embedding_type={position_type!r}; only learned absolute positions map onto "
            "the zoo's embeddings."
        )
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ConversionError(f"{name_or_path} is a decoder (is_decoder / add_cross_attention); give an encoder.")
    return config


def _read_tensors(folder: Path, name_or_path: str) -> dict[str, torch.Tensor]:
    present = [name for name in _WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        raise ConversionError(f"{name_or_path} holds no weights (none of {', '.join(_WEIGHT_FILES)}).")
    name = present[0]
    if name.endswith(".index.json"):
        shards = sorted(set(json.loads((folder / name).read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        shards = [name]
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        if shard.endswith(".safetensors"):
            from safetensors.torch import load_file

            tensors.update(load_file(str(folder / shard)))
        else:
            tensors.update(torch.load(folder / shard, map_location="cpu", weights_only=True))
    return tensors


def read_checkpoint_tensors(name_or_path: str, cache_dir: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint (a local folder, or a Hub id when the network allows it) stores, under its stored
    name, whatever model class it was saved from."""
    folder, _ = _local_folder(name_or_path, cache_dir)
    return _read_tensors(folder, name_or_path)


def load_source(name_or_path: str, cache_dir: str | None = None) -> SourceCheckpoint:
    """
    Read a BERT or RoBERTa checkpoint (a local folder, or a Hub id when the network allows it).

    Raises:
        [`ConversionError`]: the source is missing, not BERT-layout (GPT-2, T5, ...), or has no tokenizer.
    """
    from transformers import AutoTokenizer

    folder, hub_id = _local_folder(name_or_path, cache_dir)
    config = _read_config(folder, name_or_path)
    tensors = _read_tensors(folder, name_or_path)
    problem = None
    if not any((folder / name).is_file() for name in _VOCABULARY_FILES):
        problem = f"none of {', '.join(_VOCABULARY_FILES)}"
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as err:
            problem = str(err)
    if problem is not None:
        raise ConversionError(
            f"{name_or_path} has no loadable tokenizer ({problem}); the converted model needs the source's tokenizer."
        )
    return SourceCheckpoint(name_or_path, folder, hub_id, config, tensors, tokenizer)

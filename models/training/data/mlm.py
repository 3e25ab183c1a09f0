"""Masked-language modelling: the texts of an MLM corpus, the deterministic masking collator, fixed eval masks."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...tokenization import iter_texts_from_dataset, iter_texts_from_files
from .records import _column


def _split_files(value: str | None) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()] if value else []


def load_mlm_texts(args: Any, split: str) -> list[str]:
    """
    Texts of an MLM split: local files (`.txt`, `.jsonl`/`.json`, `.csv`/`.tsv`, `.story`, `.parquet`) or a Hub
    dataset. Blank lines of text files separate paragraphs and are not examples.
    """
    if args.dataset_name is not None:
        hub_split = "train" if split == "train" else "validation"
        try:
            return list(
                iter_texts_from_dataset(
                    args.dataset_name,
                    split=hub_split,
                    text_column=args.text_column or "text",
                    config_name=args.dataset_config_name,
                )
            )
        except ValueError:
            if split == "train":
                raise
            return []
    files = _split_files(args.train_file if split == "train" else args.validation_file)
    texts: list[str] = []
    for path in files:
        if path.lower().endswith(".parquet"):
            texts.extend(iter_texts_from_dataset("parquet", data_files=path, text_column=args.text_column or "text"))
        else:
            texts.extend(iter_texts_from_files(path, text_column=_column(args.text_column)))
    return texts


def bert_masking(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    probability: float,
    mask_token_id: int,
    random_id_range: tuple[int, int],
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    BERT's masking rule on a tensor of token ids of any shape: each `maskable` token is chosen with `probability`;
    a chosen token becomes `mask_token_id` (80%), a random id in `[low, high)` of `random_id_range` (10%) or stays
    (10%), and is the only kind of position with a label.

    Returns:
        `(masked_ids, labels)`, both shaped like `input_ids`; labels are the original ids where chosen, else -100.
    """
    shape = input_ids.shape
    selected = (torch.rand(shape, generator=generator) < probability) & maskable
    action = torch.rand(shape, generator=generator)
    random_ids = torch.randint(*random_id_range, shape, generator=generator)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    masked = torch.where(selected & (action < 0.8), torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, masked)
    return masked, labels


@dataclass
class MLMCollator:
    """
    Pads a batch and masks it for masked-language modelling (BERT's 80/10/10 rule) deterministically.

    The mask of an example is a pure function of `(seed, epoch, token ids)`: a batch gets the same masks however the
    data is sharded across processes, and a run resumed from a checkpoint masks exactly as the uninterrupted run
    would (the global RNG, which Trainer restores, is left to dropout and the sampling attentions). `epoch` is set by
    [`~attnzoo.training.EpochSetterCallback`] so each epoch draws new masks. Examples that already carry `labels`
    (a pre-masked evaluation set, see [`mask_dataset`]) are only padded.

    Args:
        tokenizer: the tokenizer (needs `mask_token`, `pad_token`).
        mlm_probability (`float`): fraction of (non-special) tokens to predict.
        seed (`int`): base seed of the masks.
        pad_to_multiple_of (`int`, *optional*): pad the batch length to a multiple of this.
    """

    tokenizer: Any
    mlm_probability: float = 0.15
    seed: int = 0
    pad_to_multiple_of: int | None = None
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.tokenizer.mask_token_id is None:
            raise ValueError("The tokenizer has no mask token; masked-language modelling needs one.")
        self._special = torch.tensor(sorted(set(self.tokenizer.all_special_ids)))

    def mask(self, input_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Masked input ids and labels (-100 where nothing is predicted) of one example."""
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        digest = hashlib.blake2b(ids.numpy().tobytes(), digest_size=8)
        digest.update(f"{self.seed}:{self.epoch}".encode())
        generator = torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF)
        masked, labels = bert_masking(
            ids,
            ~torch.isin(ids, self._special),
            self.mlm_probability,
            self.tokenizer.mask_token_id,
            (0, len(self.tokenizer)),
            generator,
        )
        return masked.tolist(), labels.tolist()

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        inputs, labels = [], []
        for feature in features:
            feature = {k: v for k, v in feature.items() if k != "special_tokens_mask"}
            label = feature.pop("labels", None)
            if label is None:
                feature["input_ids"], label = self.mask(feature["input_ids"])
            inputs.append(feature)
            labels.append(list(label))
        batch = dict(self.tokenizer.pad(inputs, return_tensors="pt", pad_to_multiple_of=self.pad_to_multiple_of))
        width = batch["input_ids"].shape[1]
        batch["labels"] = torch.tensor([row + [-100] * (width - len(row)) for row in labels], dtype=torch.long)
        return batch


def mask_dataset(dataset: Any, collator: MLMCollator) -> Any:
    """Fix the masks of an evaluation set once (epoch -1), so every evaluation scores the same predictions."""
    fixed = MLMCollator(collator.tokenizer, collator.mlm_probability, collator.seed, collator.pad_to_multiple_of, -1)

    def apply(batch: dict[str, list]) -> dict[str, list]:
        masked = [fixed.mask(ids) for ids in batch["input_ids"]]
        return {"input_ids": [m for m, _ in masked], "labels": [lab for _, lab in masked]}

    return dataset.map(apply, batched=True, desc="Masking the evaluation set")

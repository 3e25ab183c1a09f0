"""Where each stored tensor of a BERT / RoBERTa checkpoint goes in an attnzoo model, or why it goes nowhere.

Positions. attnzoo gives the token at index `p` of the input the position row `p` (`0, 1, 2, ...`, pads included).
BERT does the same, so BERT's table is used as it is. RoBERTa gives the token at index `p` the row
`padding_idx + 1 + p`, counting only non-pad tokens, so its first `padding_idx + 1` rows (two for the released
models) are dropped and the zoo's row `p` is RoBERTa's row `p + padding_idx + 1`. On inputs without padding, or
padded on the right (how the zoo's collators and tokenizers pad), both number every real token the same way, so the
converted dense model computes the source's function there; on left-padded input RoBERTa skips the pads and the zoo
does not (pass `position_ids` to reproduce RoBERTa there). Rows beyond the source's length repeat its learned table
([`repeat_rows`]).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..core.attention import ZooAttention
from ..core.configuration import ZooConfig
from .bert_names import TIED_OR_BUFFER, decoder_name, strip_model_prefix, zoo_name
from .errors import ConversionError
from .source import SourceCheckpoint

_POSITIONS = "encoder.embeddings.position_embeddings.weight"
_NSP_HEAD = re.compile(r"^cls\.seq_relationship\.")
_ENCODER_ATTENTION = re.compile(r"^encoder\.layers\.\d+\.attention\.(.+)$")


def shape_of(tensor: torch.Tensor) -> list[int]:
    return list(tensor.shape)


class Mapping:
    """Collects the converted tensors and the report rows of one conversion."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.mapped: list[dict[str, Any]] = []
        self.not_carried: list[dict[str, Any]] = []
        self.unknown: list[str] = []

    def carry(self, source_name: str, destination: str, tensor: torch.Tensor, note: str = "") -> None:
        if destination in self.tensors:  # e.g. a LayerNorm stored under its legacy name and today's
            earlier = next(row["source"] for row in self.mapped if row["destination"] == destination)
            raise ConversionError(
                f"{source_name} and {earlier} both map to {destination}; the checkpoint holds one twice."
            )
        self.tensors[destination] = tensor
        self.tie(source_name, destination, tensor, note)

    def tie(self, source_name: str, destination: str, tensor: torch.Tensor, note: str) -> None:
        """Record a source tensor whose destination shares another carried tensor (nothing more to load)."""
        self.mapped.append(
            {"source": source_name, "destination": destination, "shape": shape_of(tensor), "note": note}
        )

    def drop(self, source_name: str, tensor: torch.Tensor, reason: str) -> None:
        self.not_carried.append({"source": source_name, "shape": shape_of(tensor), "reason": reason})


def _tied_or_buffer(
    source: SourceCheckpoint, name: str, tensor: torch.Tensor, mapping: Mapping, plain_head: bool
) -> None:
    """Account for a tied copy (the LM decoder) or a buffer; stop when a "tied" copy differs from what it ties.

    `plain_head`: the target is a seq2seq model whose LM head is the tied matrix alone (`lm_head_transform=False`).
    """
    stripped = strip_model_prefix(name)
    if stripped.endswith(("position_ids", "token_type_ids")):
        mapping.drop(name, tensor, "buffer, recomputed by the zoo at every forward")
        return
    head = "lm_head.weight" if plain_head else "lm_head.decoder.weight"
    if stripped.endswith("decoder.weight"):
        embeddings = source.tensor("embeddings.word_embeddings.weight")
        if tensor.shape != embeddings.shape or not torch.equal(tensor, embeddings):
            raise ConversionError(
                f"{source.name_or_path}: {name} differs from the word embeddings (untied output embeddings); the zoo "
                "ties its LM head to the input embeddings, so this checkpoint cannot be converted exactly."
            )
        mapping.tie(name, head, tensor, "tied to the word embeddings")
        return
    bias_name = "cls.predictions.bias" if stripped.startswith("cls.") else "lm_head.bias"
    if not torch.equal(tensor, source.tensor(bias_name)):
        raise ConversionError(
            f"{source.name_or_path}: {name} differs from {bias_name}, which the zoo's head ties it to."
        )
    if plain_head:
        mapping.drop(name, tensor, "masked-LM bias: the seq2seq LM head is the tied embedding matrix, without bias")
    else:
        mapping.tie(name, "lm_head.bias", tensor, f"same as {bias_name}")


def _pooled(config: ZooConfig) -> str:
    """What the converted classification head applies BERT's pooler to."""
    if config.classifier_pooling == "cls":
        return "over the first token, as BERT"
    return f"over the {config.classifier_pooling} of the real tokens (classifier_pooling), not BERT's first token"


def map_weights(
    source: SourceCheckpoint,
    config: ZooConfig,
    base_prefix: str,
    seq2seq: bool,
    attention_class: type[ZooAttention] = ZooAttention,
) -> Mapping:
    """Every stored tensor of `source` to its destination(s), or to the not-carried list with a reason.

    `attention_class` is the target's encoder self-attention: the source tensors of its `not_from_source` parameters
    are not carried into the encoder (a BERT2BERT decoder, whose attention is dense, still gets them).

    Raises:
        [`ConversionError`]: naming every stored tensor no rule accounts for.
    """
    mapping = Mapping()
    plain_head = seq2seq and not config.lm_head_transform
    offset, length, rows = source.position_offset, source.num_positions, config.max_position_embeddings
    for name, tensor in source.tensors.items():
        stripped = strip_model_prefix(name)
        if TIED_OR_BUFFER.search(stripped):
            _tied_or_buffer(source, name, tensor, mapping, plain_head)
            continue
        if _NSP_HEAD.match(stripped):
            mapping.drop(name, tensor, "next-sentence-prediction head: no zoo head predicts sentence pairs")
            continue
        destination = zoo_name(stripped)
        if destination is None:
            mapping.unknown.append(name)
            continue
        if plain_head and destination.startswith("lm_head."):
            mapping.drop(name, tensor, "masked-LM head transform: the seq2seq LM head is the tied embedding matrix")
            continue
        if seq2seq and destination.startswith("classifier."):
            mapping.drop(name, tensor, "pooler: the seq2seq model has no classification head")
            continue
        note = ""
        if seq2seq and destination.startswith("lm_head."):
            note = "BERT2BERT: the source's masked-LM head is the decoder's LM head"
        if destination.startswith("classifier."):
            pooled = _pooled(config)
            note = f"BERT's pooler; loaded by the classification head, {pooled}; reported unexpected by the others"
        if destination == _POSITIONS:
            learned = tensor[offset : offset + length]
            tensor = repeat_rows(learned, rows)
            note = _positions_note(offset, length, rows)
        if destination.startswith("encoder."):
            encoder_destination = destination
            destination = base_prefix + destination
        else:
            encoder_destination = None
        fresh = _not_from_source(encoder_destination, attention_class)
        if fresh is None:
            mapping.carry(name, destination, tensor, note)
        else:
            mapping.drop(name, tensor, f"{attention_class.__name__}: {fresh}")
        target = decoder_name(encoder_destination) if seq2seq and encoder_destination else None
        if target is not None:
            _carry_to_decoder(source, config, mapping, name, base_prefix + target, tensor, offset, length)
    if mapping.unknown:
        raise ConversionError(
            f"{source.name_or_path} holds tensor(s) that map nowhere in the zoo: "
            f"{', '.join(sorted(mapping.unknown))}. "
            "Only BertModel / BertForMaskedLM / RobertaModel / RobertaForMaskedLM weights (plus BERT's "
            "next-sentence head) can be converted."
        )
    return mapping


def _not_from_source(encoder_destination: str | None, attention_class: type[ZooAttention]) -> str | None:
    """Why the encoder attention parameter `encoder_destination` starts fresh, or `None` when it is carried."""
    match = _ENCODER_ATTENTION.match(encoder_destination or "")
    return attention_class.not_from_source.get(match.group(1)) if match else None


def _positions_note(offset: int, length: int, rows: int) -> str:
    source_rows = f"rows {offset}..{offset + length - 1}" if offset else f"rows 0..{length - 1}"
    if rows <= length:
        kept = f"rows 0..{rows - 1} kept" + (
            f", rows {rows}..{length - 1} not needed at this length" if rows < length else ""
        )
        return f"{source_rows} -> {kept}"
    return f"{source_rows} -> rows 0..{length - 1}, then repeated to fill {rows} rows (row p = row p mod {length})"


def _carry_to_decoder(
    source: SourceCheckpoint,
    config: ZooConfig,
    mapping: Mapping,
    name: str,
    destination: str,
    tensor: torch.Tensor,
    offset: int,
    length: int,
) -> None:
    if destination.endswith("embed_positions.weight"):
        rows = config.decoder_max_position_embeddings
        # The decoder embeds no token types; BERT adds type 0 to every token, so that row joins every position row.
        type_zero = source.tensor("embeddings.token_type_embeddings.weight")[0]
        learned = source.tensors[name][offset : offset + length]
        tensor = repeat_rows(learned, rows) + type_zero
        note = _positions_note(offset, length, rows) + ", plus token type 0 (the decoder has no token types)"
        mapping.carry(name, destination, tensor, note)
        return
    mapping.carry(name, destination, tensor, "BERT2BERT: the decoder starts from the same encoder layer")


# Position tables of another length: rows beyond the source's learned ones repeat its table (Longformer's copy
# initialisation, Beltagy et al. 2020, §5).
def repeat_rows(table: torch.Tensor, num_rows: int) -> torch.Tensor:
    """
    A table of `num_rows` rows whose row `p` is `table[p % len(table)]`.

    Rows below the source length are the source's own, so a model keeps its function on inputs the source could
    read; each further block of rows restarts the learned table, which keeps the local position differences the
    attention learned (row `p + 1` minus row `p` is the learned step everywhere except at block boundaries).

    Args:
        table (`torch.Tensor` of shape `(length, hidden)`): the learned position embeddings.
        num_rows (`int`): rows wanted; fewer than `length` keeps the first `num_rows`.
    """
    if num_rows < 1:
        raise ValueError(f"`num_rows` must be a positive integer, got {num_rows}.")
    index = torch.arange(num_rows, device=table.device) % table.shape[0]
    return table[index].clone()

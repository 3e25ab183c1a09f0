"""Warm starts from BERT / RoBERTa encoder checkpoints: a documented name mapping onto the zoo's encoder layout.

| BERT (`bert.` / `roberta.` prefix stripped)      | attnzoo (`<Prefix>Model`)                          |
|--------------------------------------------------|----------------------------------------------------|
| `embeddings.{word,position,token_type}_embeddings`| `encoder.embeddings.{same}`                        |
| `embeddings.LayerNorm`                            | `encoder.embeddings.LayerNorm`                     |
| `encoder.layer.{i}.attention.self.{query,key,value}` | `encoder.layers.{i}.attention.{q,k,v}_proj`     |
| `encoder.layer.{i}.attention.output.dense`        | `encoder.layers.{i}.attention.o_proj`              |
| `encoder.layer.{i}.attention.output.LayerNorm`    | `encoder.layers.{i}.attention_residual.LayerNorm`  |
| `encoder.layer.{i}.intermediate.dense`            | `encoder.layers.{i}.ffn.intermediate`              |
| `encoder.layer.{i}.output.dense`                  | `encoder.layers.{i}.ffn.output`                    |
| `encoder.layer.{i}.output.LayerNorm`              | `encoder.layers.{i}.ffn_residual.LayerNorm`        |
| `pooler.dense`                                    | `classifier.dense` (classification head)           |
| `cls.predictions.transform.{dense,LayerNorm}` / RoBERTa `lm_head.{dense,layer_norm}` | `lm_head.{dense,LayerNorm}` |
| `cls.predictions.bias` / RoBERTa `lm_head.bias`   | `lm_head.bias`                                     |

RoBERTa numbers positions from `padding_idx + 1`; its first `padding_idx + 1` position rows are dropped so that
position 0 of the zoo is RoBERTa's first real position. The decoder weights are tied to the embeddings and need no
entry. A sparse method's own parameters are absent from the checkpoint and keep their fresh initialisation.

A BERT2BERT warm start (Rothe et al., 2020) also fills the seq2seq decoder from the same encoder layers
([`decoder_name`]): self-attention, its LayerNorm and the FFN of layer `i` go to decoder layer `i`; cross-attention
has no source and starts fresh.
"""

from __future__ import annotations

import re

import torch

_RULES: list[tuple[str, str]] = [
    (r"^embeddings\.", "encoder.embeddings."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.query\.", r"encoder.layers.\1.attention.q_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.key\.", r"encoder.layers.\1.attention.k_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.value\.", r"encoder.layers.\1.attention.v_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"encoder.layers.\1.attention.o_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"encoder.layers.\1.attention_residual.LayerNorm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"encoder.layers.\1.ffn.intermediate."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"encoder.layers.\1.ffn.output."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"encoder.layers.\1.ffn_residual.LayerNorm."),
    (r"^pooler\.dense\.", "classifier.dense."),
    (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.LayerNorm."),
    (r"^cls\.predictions\.bias$", "lm_head.bias"),
    (r"^lm_head\.dense\.", "lm_head.dense."),
    (r"^lm_head\.layer_norm\.", "lm_head.LayerNorm."),
    (r"^lm_head\.bias$", "lm_head.bias"),
]
#: Tied copies of the embeddings / LM bias and buffers that the zoo computes on the fly.
TIED_OR_BUFFER = re.compile(r"(decoder\.weight|decoder\.bias|position_ids|token_type_ids)$")
_PREFIX = re.compile(r"^(bert|roberta)\.")

# Zoo encoder name -> zoo decoder name of the BERT2BERT warm start (same layer index).
_DECODER_RULES: list[tuple[str, str]] = [
    (r"^encoder\.layers\.(\d+)\.attention\.", r"decoder.layers.\1.self_attn."),
    (r"^encoder\.layers\.(\d+)\.attention_residual\.", r"decoder.layers.\1.self_attn_residual."),
    (r"^encoder\.layers\.(\d+)\.ffn\.", r"decoder.layers.\1.ffn."),
    (r"^encoder\.layers\.(\d+)\.ffn_residual\.", r"decoder.layers.\1.ffn_residual."),
    (r"^encoder\.embeddings\.LayerNorm\.", "decoder.embed_norm."),
    (r"^encoder\.embeddings\.position_embeddings\.", "decoder.embed_positions."),
]


def strip_model_prefix(name: str) -> str:
    """A checkpoint weight name without the `bert.` / `roberta.` base-model prefix."""
    return _PREFIX.sub("", name)


#: LayerNorm names of checkpoints saved by early BERT code (TensorFlow's), which transformers still loads (its legacy
#: renaming): `LayerNorm.gamma` is the weight, `LayerNorm.beta` the bias.
_LEGACY_LAYER_NORM = re.compile(r"LayerNorm\.(gamma|beta)$")


def zoo_name(name: str) -> str | None:
    """The zoo name of a BERT/RoBERTa weight (prefix stripped or not, legacy LayerNorm names read as today's), or
    `None` when no rule maps it."""
    stripped = _LEGACY_LAYER_NORM.sub(
        lambda match: "LayerNorm." + ("weight" if match[1] == "gamma" else "bias"), strip_model_prefix(name)
    )
    for pattern, replacement in _RULES:
        if re.search(pattern, stripped):
            return re.sub(pattern, replacement, stripped)
    return None


def decoder_name(encoder_name: str) -> str | None:
    """The decoder weight that a zoo encoder weight also initialises in a BERT2BERT warm start, or `None`."""
    for pattern, replacement in _DECODER_RULES:
        if re.search(pattern, encoder_name):
            return re.sub(pattern, replacement, encoder_name)
    return None


def convert_bert_state_dict(
    state_dict: dict[str, torch.Tensor], *, roberta_position_offset: int = 0, head_prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Rename a BERT/RoBERTa state dict to the zoo's layout.

    Only renames: every attention projection gets its zoo name, including those a method does not take from BERT
    (`ZooAttention.not_from_source`, e.g. FSAT's keys and values); [`~attnzoo.conversion.convert_checkpoint`]
    applies those rules, positions beyond the source's and the report.

    Args:
        state_dict (`dict`): weights of `BertModel`/`BertFor*`/`RobertaModel`/`RobertaFor*` (with or without the
            `bert.`/`roberta.` prefix).
        roberta_position_offset (`int`, *optional*, defaults to 0): rows to drop from the position table
            (`padding_idx + 1`, i.e. 2, for RoBERTa checkpoints).
        head_prefix (`str`, *optional*): prefix of the zoo's base model inside the target class (`"model."` for
            the heads, `""` for `<Prefix>Model`); classifier and LM-head names are never prefixed.

    Returns:
        `dict[str, torch.Tensor]` ready for `load_state_dict(..., strict=False)`.

    Raises:
        `ValueError` naming the first weight that has no mapping (nothing is dropped silently).
    """
    converted = {}
    for name, tensor in state_dict.items():
        if TIED_OR_BUFFER.search(strip_model_prefix(name)):
            continue
        new = zoo_name(name)
        if new is None:
            raise ValueError(f"No attnzoo name for checkpoint weight {name!r}.")
        if new.endswith("position_embeddings.weight") and roberta_position_offset:
            tensor = tensor[roberta_position_offset:]
        if new.startswith("encoder."):
            new = head_prefix + new
        if new in converted:  # e.g. a LayerNorm stored under its legacy name and today's
            raise ValueError(f"Two checkpoint weights map to {new!r}, the last {name!r}.")
        converted[new] = tensor
    return converted

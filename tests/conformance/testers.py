"""Model-tester adapters: what transformers' `ModelTesterMixin` needs to know about each attnzoo family.

A tester builds a tiny config of the family (2 layers, width 32, 99 tokens, as transformers' own testers do, with
each method's structure small enough to be really sparse at 16 tokens) and a random batch with an attention mask
that has holes (transformers' `random_attention_mask`). Labels come from the mixin's own `_prepare_for_class` once
the zoo's classes are listed in transformers' name tables (see `listed_in_auto_name_tables`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any
from unittest import mock

import torch
from transformers.models.auto import modeling_auto

from attnzoo.core.configuration import ZooConfig
from attnzoo.registry import Family

#: Fields of every tester config (transformers' testers use about these sizes).
COMMON_FIELDS: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "decoder_layers": 2,
    "decoder_max_position_embeddings": 64,
    "type_vocab_size": 2,
    "num_labels": 3,
}

#: Per family: method fields that make the structure sparse at `seq_length` 16.
FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    "dense_transformer": {},
    "smart_bird": {"num_samples": 6, "sketch_hidden_size": 4, "sketch_intermediate_size": 8},
    "a2former": {"num_sample_points": 4},
    "sparse_transformer": {"sparse_pattern": "strided", "sparse_stride": 4, "sparse_summary_size": 1},
    "fsat": {"num_dominant_indices": 2, "num_random_indices": 2, "index_scale": "sequence_length"},
    "sbm": {"num_clusters": 4, "sampling_backend": "bernoulli"},
}


class ZooModelTester:
    """The `model_tester` of a conformance test class for one family.

    Args:
        parent (`unittest.TestCase`): the test case (transformers' testers keep it for assertions).
        family ([`~attnzoo.registry.Family`]): the family under test.
        upstream (`ModuleType`): transformers' `test_modeling_common`, whose random-input helpers are used.
        is_encoder_decoder (`bool`): inputs for `<Prefix>ForConditionalGeneration` (decoder ids and mask too).
    """

    batch_size = 3
    seq_length = 16
    # transformers' common tests reuse the encoder's attention mask and label length for the decoder.
    decoder_seq_length = 16
    is_training = True

    def __init__(self, parent, family: Family, upstream: ModuleType, is_encoder_decoder: bool = False):
        self.parent = parent
        self.family = family
        self.upstream = upstream
        self.is_encoder_decoder = is_encoder_decoder
        for name, value in COMMON_FIELDS.items():
            setattr(self, name, value)

    def get_config(self) -> ZooConfig:
        # The encoder-decoder class sets `is_encoder_decoder` on its config; the tests read it from the tester's.
        fields = {**COMMON_FIELDS, **FAMILY_FIELDS[self.family.name], "is_encoder_decoder": self.is_encoder_decoder}
        return self.family.config_class(**fields)

    def prepare_config_and_inputs_for_common(self) -> tuple[ZooConfig, dict[str, torch.Tensor]]:
        ids, mask = self.upstream.ids_tensor, self.upstream.random_attention_mask
        # Ids from 4 on: 0-3 are the special tokens (padding, start, end), as in a trained tokenizer's vocabulary.
        inputs = {
            "input_ids": ids([self.batch_size, self.seq_length], self.vocab_size - 4) + 4,
            "attention_mask": mask([self.batch_size, self.seq_length]),
            "token_type_ids": ids([self.batch_size, self.seq_length], self.type_vocab_size),
        }
        if self.is_encoder_decoder:
            inputs["decoder_input_ids"] = ids([self.batch_size, self.decoder_seq_length], self.vocab_size - 4) + 4
            inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
        return self.get_config(), inputs


#: Which of transformers' auto name tables lists each head (the mixin picks labels and skips by these tables).
_HEAD_TABLES = {
    "base": "MODEL_MAPPING_NAMES",
    "masked_lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "sequence_classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "conditional_generation": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
}


@contextlib.contextmanager
def listed_in_auto_name_tables(families: list[Family]) -> Iterator[None]:
    """List the families' classes in transformers' auto name tables, as every built-in model is listed.

    `ModelTesterMixin` decides by these tables which class is a bare model (no loss: skipped by the training tests)
    and which labels a head gets (`_prepare_for_class`). `Auto*.register` does not add to them, so without this a
    registered model is treated as an unknown one. Restored on exit.
    """
    with contextlib.ExitStack() as stack:
        for head, table in _HEAD_TABLES.items():
            entries = {family.model_type: family.heads[head].__name__ for family in families}
            stack.enter_context(mock.patch.dict(getattr(modeling_auto, table), entries))
        yield

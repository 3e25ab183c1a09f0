"""A BERT / RoBERTa encoder checkpoint maps onto the zoo's layout name for name and computes the same function."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertModel, RobertaConfig, RobertaModel

from attnzoo import DenseTransformerConfig, DenseTransformerForMaskedLM, DenseTransformerModel
from attnzoo.conversion.bert_names import convert_bert_state_dict

SIZES = {
    "vocab_size": 120,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 120, (2, 17), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    return ids, mask


def test_bert_encoder_weights_give_identical_hidden_states():
    torch.manual_seed(0)
    bert = BertModel(BertConfig(**SIZES, max_position_embeddings=64), add_pooling_layer=False).eval()
    zoo = DenseTransformerModel(DenseTransformerConfig(**SIZES, max_position_embeddings=64)).eval()
    missing, unexpected = zoo.load_state_dict(convert_bert_state_dict(bert.state_dict()), strict=False)
    assert not missing and not unexpected
    ids, mask = _inputs()
    with torch.no_grad():
        expected = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        actual = zoo(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(actual[1, :11], expected[1, :11], rtol=1e-5, atol=1e-5)


def test_bert_masked_lm_head_maps_onto_the_zoo_head():
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(**SIZES, max_position_embeddings=64)).eval()
    zoo = DenseTransformerForMaskedLM(DenseTransformerConfig(**SIZES, max_position_embeddings=64)).eval()
    converted = convert_bert_state_dict(bert.state_dict(), head_prefix="model.")
    missing, unexpected = zoo.load_state_dict(converted, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.decoder.weight"}  # tied to the embeddings
    ids, mask = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(zoo(input_ids=ids).logits, bert(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_roberta_positions_are_shifted_past_the_padding_offset():
    torch.manual_seed(0)
    config = RobertaConfig(**SIZES, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1)
    roberta = RobertaModel(config, add_pooling_layer=False).eval()
    zoo = DenseTransformerModel(
        DenseTransformerConfig(**SIZES, max_position_embeddings=64, type_vocab_size=1, pad_token_id=1)
    ).eval()
    converted = convert_bert_state_dict(roberta.state_dict(), roberta_position_offset=config.pad_token_id + 1)
    missing, unexpected = zoo.load_state_dict(converted, strict=False)
    assert not missing and not unexpected
    ids = torch.randint(5, 120, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(
            zoo(input_ids=ids).last_hidden_state, roberta(input_ids=ids).last_hidden_state, rtol=1e-5, atol=1e-5
        )


def test_unknown_checkpoint_weights_are_reported_not_dropped():
    with pytest.raises(ValueError, match="rotary"):
        convert_bert_state_dict({"bert.encoder.layer.0.rotary.inv_freq": torch.zeros(2)})

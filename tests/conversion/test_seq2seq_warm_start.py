"""`--seq2seq`: the BERT2BERT warm start (encoder and decoder from the source, cross-attention fresh)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from attnzoo.conversion import convert_checkpoint
from attnzoo.conversion.bert_names import strip_model_prefix

from .conftest import SOURCE_POSITIONS

NEW_LENGTH = 128


@pytest.mark.parametrize(
    ("architecture", "family"), [("BertForMaskedLM", "dense_transformer"), ("RobertaModel", "sbm")]
)
def test_seq2seq_warm_start_copies_the_encoder_layers_into_the_decoder(
    tmp_path, source_checkpoint, architecture, family
):
    folder, source = source_checkpoint(architecture)
    report = convert_checkpoint(str(folder), family, NEW_LENGTH, tmp_path / "out", seq2seq=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    assert model.config.decoder_layers == source.config.num_hidden_layers
    assert model.config.decoder_max_position_embeddings == SOURCE_POSITIONS
    base = source.base_model
    for i, layer in enumerate(model.model.decoder.layers):
        source_layer = base.encoder.layer[i]
        torch.testing.assert_close(layer.self_attn.q_proj.weight, source_layer.attention.self.query.weight)
        torch.testing.assert_close(layer.self_attn.o_proj.bias, source_layer.attention.output.dense.bias)
        torch.testing.assert_close(layer.ffn.output.weight, source_layer.output.dense.weight)
        torch.testing.assert_close(layer.ffn_residual.LayerNorm.weight, source_layer.output.LayerNorm.weight)
        # The encoder layer is the same one.
        encoder_layer = model.model.encoder.layers[i]
        torch.testing.assert_close(encoder_layer.attention.k_proj.weight, source_layer.attention.self.key.weight)
    # Decoder embeddings: BERT's sum of token, position and token-type-0 embeddings, then its LayerNorm.
    offset = base.config.pad_token_id + 1 if architecture.startswith("Roberta") else 0
    ids = torch.randint(5, source.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        decoder = model.model.decoder
        positions = torch.arange(12)
        actual = decoder.embed_norm(decoder.embed_tokens(ids) + decoder.embed_positions(positions))
        embeddings = base.embeddings
        expected = embeddings.LayerNorm(
            embeddings.word_embeddings(ids)
            + embeddings.position_embeddings(positions + offset)
            + embeddings.token_type_embeddings.weight[0]
        )
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    new = {row["name"] for row in report.new}
    assert any(".cross_attn.q_proj." in name for name in new)
    assert not any(".self_attn.q_proj." in name or ".ffn." in name for name in new)
    dropped = {strip_model_prefix(row["source"]) for row in report.not_carried}
    if architecture == "BertForMaskedLM":
        # BERT2BERT keeps the source's masked-LM head as the decoder's: same function on any hidden state.
        assert model.config.lm_head_transform and not dropped
        hidden = torch.randn(2, 5, source.config.hidden_size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            torch.testing.assert_close(model.lm_head(hidden), source.cls(hidden))
        assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    else:
        # A source without a masked-LM head has no transform to give: the plain tied projection.
        assert not model.config.lm_head_transform
        assert dropped == {"pooler.dense.weight", "pooler.dense.bias"}


def test_seq2seq_fsat_warm_start_gives_the_source_attention_to_the_dense_decoder(tmp_path, source_checkpoint):
    """FSAT's encoder starts its keys and values fresh; its decoder's attention is dense, so it takes them all."""
    folder, source = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(str(folder), "fsat", NEW_LENGTH, tmp_path / "out", seq2seq=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    for i, source_layer in enumerate(source.bert.encoder.layer):
        decoder_attention = model.model.decoder.layers[i].self_attn
        torch.testing.assert_close(decoder_attention.k_proj.weight, source_layer.attention.self.key.weight)
        torch.testing.assert_close(decoder_attention.o_proj.weight, source_layer.attention.output.dense.weight)
        assert not model.model.encoder.layers[i].attention.o_proj.weight.any()
    key = "bert.encoder.layer.0.attention.self.key.weight"
    assert key in {row["source"] for row in report.not_carried}
    assert [row["destination"] for row in report.mapped if row["source"] == key] == [
        "model.decoder.layers.0.self_attn.k_proj.weight"
    ]


def test_seq2seq_warm_start_can_drop_the_masked_lm_transform(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(
        str(folder), "dense_transformer", NEW_LENGTH, tmp_path / "out", "lm_head_transform=false", seq2seq=True
    )
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    assert isinstance(model.lm_head, torch.nn.Linear)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    dropped = {strip_model_prefix(row["source"]) for row in report.not_carried}
    assert {"cls.predictions.transform.dense.weight", "cls.predictions.bias"} <= dropped


def test_seq2seq_warm_start_generates(tmp_path, source_checkpoint):
    folder, _ = source_checkpoint("BertForMaskedLM")
    convert_checkpoint(str(folder), "dense_transformer", NEW_LENGTH, tmp_path / "out", seq2seq=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    inputs = tokenizer(["the first document is here", "and a second one"], return_tensors="pt", padding=True)
    generated = model.generate(**inputs, max_new_tokens=6, num_beams=2, do_sample=False)
    assert generated.shape[0] == 2 and 2 <= generated.shape[1] <= 7
    assert (generated[:, 0] == tokenizer.cls_token_id).all()
    # The model trains: one step of the seq2seq loss lowers it on the same batch.
    labels = tokenizer(["a summary", "another"], return_tensors="pt", padding=True).input_ids
    labels[labels == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        before = model(**inputs, labels=labels).loss
    model.train()
    torch.manual_seed(0)
    model(**inputs, labels=labels).loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    model.eval()
    with torch.no_grad():
        after = model(**inputs, labels=labels).loss
    assert torch.isfinite(before) and after < before


def test_seq2seq_warm_start_with_a_copy_head(tmp_path, source_checkpoint):
    """`copy_from_source=true` in the overrides: the pointer-generator head is the only new tensor beside the
    cross-attention, and the converted model generates."""
    folder, _ = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(
        str(folder), "sparse_transformer", NEW_LENGTH, tmp_path / "out", "copy_from_source=true", seq2seq=True
    )
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    assert model.config.copy_from_source and model.copy_head is not None
    new = {row["name"] for row in report.new}
    assert {f"copy_head.{name}" for name in model.copy_head.state_dict()} <= new
    assert all(name.startswith("copy_head.") or ".cross_attn" in name for name in new)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    inputs = tokenizer(["the first document is here", "and a second one"], return_tensors="pt", padding=True)
    generated = model.generate(**inputs, max_new_tokens=6, num_beams=2, do_sample=False)
    assert generated.shape[0] == 2 and (generated[:, 0] == tokenizer.cls_token_id).all()

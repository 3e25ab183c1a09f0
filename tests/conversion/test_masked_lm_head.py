"""A source without a masked-LM head (`BertModel`, `RobertaModel`, e.g. all-MiniLM-L6-v2) converts into
`<Prefix>ForMaskedLM` with a fresh head tied to the embeddings whose dense layer starts as the identity."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM

from attnzoo.conversion import convert_checkpoint
from attnzoo.conversion.masked_lm_head import HEAD_RULES

from .conftest import right_padded_batch

NEW_LENGTH = 128


@pytest.mark.parametrize(("architecture", "family"), [("BertModel", "dense_transformer"), ("RobertaModel", "fsat")])
def test_a_headless_source_gets_a_tied_head_that_reads_its_hidden_state(
    tmp_path, source_checkpoint, architecture, family
):
    folder, source = source_checkpoint(architecture)
    report = convert_checkpoint(str(folder), family, NEW_LENGTH, tmp_path / "out")
    assert report.target_class.endswith("ForMaskedLM")
    model, loading = AutoModelForMaskedLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    model.eval()
    assert not loading["missing_keys"] and not loading["mismatched_keys"]  # the head was saved, nothing is redrawn
    head = model.lm_head
    assert head.decoder.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(head.dense.weight, torch.eye(source.config.hidden_size), rtol=0, atol=0)
    for tensor in (head.dense.bias, head.LayerNorm.bias, head.bias):
        assert not tensor.any()
    assert bool((head.LayerNorm.weight == 1).all())
    # The logits score LayerNorm(act(h)) of the encoder's last hidden state against the word embeddings.
    ids, mask = right_padded_batch(source.config.vocab_size, source.config.pad_token_id)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = torch.nn.functional.layer_norm(head.act(hidden), hidden.shape[-1:], eps=model.config.layer_norm_eps)
        expected = expected @ model.get_input_embeddings().weight.T
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, expected, rtol=1e-5, atol=1e-5)
    # The report says how each head tensor started.
    rows = {row["name"]: row["init"] for row in report.new if row["name"].startswith("lm_head.")}
    assert rows == {f"lm_head.{name}": rule for name, rule in HEAD_RULES.items()}
    assert {"name": "lm_head.decoder.weight", "tied_to": "model.encoder.embeddings.word_embeddings.weight"} in (
        report.tied
    )


def test_the_head_does_not_change_the_encoder_and_starts_nearer_uniform_than_a_random_one(tmp_path, source_checkpoint):
    """The dense conversion still computes the source's hidden states; with the identity head the masked-LM loss on
    random tokens starts below the one of transformers' random head (normal(0, 0.02) dense), as it does on MiniLM (the
    study's README)."""
    folder, source = source_checkpoint("BertModel")
    convert_checkpoint(str(folder), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    encoder = AutoModel.from_pretrained(tmp_path / "out").eval()
    ids, mask = right_padded_batch(source.config.vocab_size, source.config.pad_token_id)
    with torch.no_grad():
        torch.testing.assert_close(
            encoder(input_ids=ids, attention_mask=mask).last_hidden_state[0],
            source(input_ids=ids, attention_mask=mask).last_hidden_state[0],
            rtol=1e-5,
            atol=1e-5,
        )
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    with torch.no_grad():
        identity_loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
        torch.manual_seed(0)
        torch.nn.init.normal_(model.lm_head.dense.weight, std=model.config.initializer_range)
        random_loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    assert identity_loss < random_loss
    assert identity_loss < math.log(source.config.vocab_size) + 1.0


def test_a_source_with_a_head_keeps_its_own(tmp_path, source_checkpoint):
    folder, source = source_checkpoint("BertForMaskedLM")
    report = convert_checkpoint(str(folder), "dense_transformer", NEW_LENGTH, tmp_path / "out")
    assert not [row for row in report.new if row["name"].startswith("lm_head.")]
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "out")
    torch.testing.assert_close(model.lm_head.dense.weight, source.cls.predictions.transform.dense.weight)

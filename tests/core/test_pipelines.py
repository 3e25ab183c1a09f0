"""Pipelines with a locally trained tokenizer: fill-mask, text-classification and the zoo's summarization task."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, pipeline

import attnzoo
from attnzoo.registry import FAMILIES
from attnzoo.tokenization import iter_texts_from_files, train_wordpiece_tokenizer
from source_checkout import REPO_ROOT, load_config

FAMILY_IDS = sorted(FAMILIES)


@pytest.fixture(scope="module")
def tokenizer():
    texts = list(iter_texts_from_files([REPO_ROOT / "tests/fixtures/data/text/wikitext_train.txt"]))[:800]
    return train_wordpiece_tokenizer(texts, vocab_size=600, model_max_length=128)


def _model(model_type, head, tokenizer, **overrides):
    torch.manual_seed(0)
    config = load_config(FAMILIES[model_type], "tiny", vocab_size=len(tokenizer), **overrides)
    return FAMILIES[model_type].heads[head](config).eval()


@pytest.mark.parametrize("model_type", FAMILY_IDS)
def test_fill_mask_pipeline_from_a_saved_checkpoint(model_type, tokenizer, tmp_path):
    _model(model_type, "masked_lm", tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    fill = pipeline("fill-mask", model=str(tmp_path))
    predictions = fill(f"the city is the {tokenizer.mask_token} of the region .", top_k=3)
    assert len(predictions) == 3
    assert all(p["token"] < len(tokenizer) and p["token_str"] for p in predictions)
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1


@pytest.mark.parametrize("model_type", FAMILY_IDS)
def test_text_classification_pipeline_uses_id2label(model_type, tokenizer, tmp_path):
    labels = {0: "negative", 1: "positive"}
    model = _model(
        model_type, "sequence_classification", tokenizer, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    classify = pipeline("text-classification", model=str(tmp_path))
    result = classify(["a fine film .", "a dull , lifeless story ."])
    assert [r["label"] in labels.values() for r in result] == [True, True]
    with torch.no_grad():
        enc = tokenizer("a fine film .", return_tensors="pt")
        expected = labels[int(model(**enc).logits.argmax(-1))]
    assert result[0]["label"] == expected


@pytest.mark.parametrize("model_type", FAMILY_IDS)
def test_sparse_summarization_pipeline_and_summarize_agree(model_type, tokenizer, tmp_path):
    model = _model(model_type, "conditional_generation", tokenizer, initializer_range=0.5)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    text = "the storm closed roads across the north . officials said repairs would take a week ."
    summarizer = pipeline("sparse-summarization", model=str(tmp_path))
    settings = {"max_new_tokens": 6, "num_beams": 2, "no_repeat_ngram_size": 1}
    from_pipeline = summarizer(text, **settings)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    direct = attnzoo.summarize([text, text], loaded, tokenizer, **settings)
    assert direct[0] and direct[0] == direct[1]
    # transformers 4's `summarization` pipeline: a list per text, flattened for a list of texts.
    assert from_pipeline == [{"summary_text": direct[0]}]
    assert summarizer([text, text], **settings) == [{"summary_text": direct[0]}] * 2
    two = summarizer(text, num_return_sequences=2, **settings)
    assert len(two) == 2 and two[0] == {"summary_text": direct[0]}
    # Batched, each text keeps its own sequences (a batch's were all given to its first text).
    other = "he was born in the city of york in 1990 and played football ."
    unbatched = summarizer([text, other], num_return_sequences=2, **settings)
    assert summarizer([text, other], batch_size=2, num_return_sequences=2, **settings) == unbatched
    assert unbatched[0] == two and len(unbatched[1]) == 2


def test_summarize_refuses_silent_truncation(tokenizer):
    model = _model("dense_transformer", "conditional_generation", tokenizer, max_position_embeddings=16)
    long_text = " ".join(["word"] * 40)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        attnzoo.summarize(long_text, model, tokenizer, max_new_tokens=2)
    assert len(attnzoo.summarize(long_text, model, tokenizer, truncation=True, max_new_tokens=2)) == 1

"""The common model suite: every check runs for every registered family and head (a new family inherits it all)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

from attnzoo.core.compat import enable_activation_checkpointing, get_cache
from attnzoo.core.heads import MaskedLMHead
from attnzoo.registry import FAMILIES
from source_checkout import load_config

AUTO_CLASSES = {
    "base": AutoModel,
    "masked_lm": AutoModelForMaskedLM,
    "sequence_classification": AutoModelForSequenceClassification,
    "conditional_generation": AutoModelForSeq2SeqLM,
}
HEADS = list(AUTO_CLASSES)
CASES = [pytest.param(f, h, id=f"{FAMILIES[f].name}-{h}") for f in sorted(FAMILIES) for h in HEADS]
SEQ_LEN, PAD_FROM = 40, 28


def tiny_model(model_type: str, head: str, **overrides):
    torch.manual_seed(0)
    config = load_config(FAMILIES[model_type], "tiny", **overrides)
    return FAMILIES[model_type].heads[head](config)


def make_inputs(config, head: str, seed: int = 0, pad: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, config.vocab_size, (2, SEQ_LEN), generator=g)
    attention_mask = torch.ones_like(input_ids)
    if pad:
        attention_mask[1, PAD_FROM:] = 0
        input_ids[1, PAD_FROM:] = config.pad_token_id
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if head == "conditional_generation":
        inputs["decoder_input_ids"] = torch.randint(5, config.vocab_size, (2, 12), generator=g)
    return inputs


def main_output(out) -> torch.Tensor:
    hidden = getattr(out, "last_hidden_state", None)
    return hidden if hidden is not None else out.logits


def labels_for(config, head: str, inputs: dict) -> torch.Tensor | None:
    if head == "masked_lm":
        labels = inputs["input_ids"].clone()
        labels[inputs["attention_mask"] == 0] = -100
        return labels
    if head == "sequence_classification":
        return torch.tensor([0, 1])
    if head == "conditional_generation":
        return inputs["decoder_input_ids"].clone()
    return None


def loss_of(model, head: str, inputs: dict) -> torch.Tensor:
    labels = labels_for(model.config, head, inputs)
    out = model(**inputs, labels=labels) if labels is not None else model(**inputs)
    return out.loss if labels is not None else main_output(out).pow(2).mean()


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_auto_classes_build_the_family_class_from_config(model_type, head):
    config = load_config(FAMILIES[model_type], "tiny")
    fields = {k: v for k, v in config.to_diff_dict().items() if k != "model_type"}
    rebuilt = AutoConfig.for_model(model_type, **fields)
    assert type(rebuilt) is FAMILIES[model_type].config_class
    model = AUTO_CLASSES[head].from_config(rebuilt)
    assert type(model) is FAMILIES[model_type].heads[head]


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_save_and_reload_gives_identical_outputs(model_type, head, tmp_path):
    model = tiny_model(model_type, head).eval()
    inputs = make_inputs(model.config, head)
    with torch.no_grad():
        expected = main_output(model(**inputs))
    model.save_pretrained(tmp_path / "a")
    assert (tmp_path / "a" / "model.safetensors").is_file()
    assert (tmp_path / "a" / "generation_config.json").is_file() == (head == "conditional_generation")
    reloaded = AUTO_CLASSES[head].from_pretrained(tmp_path / "a").eval()
    # A second round trip catches fields that from_pretrained adds to the config.
    reloaded.save_pretrained(tmp_path / "b")
    reloaded = AUTO_CLASSES[head].from_pretrained(tmp_path / "b").eval()
    with torch.no_grad():
        torch.testing.assert_close(main_output(reloaded(**inputs)), expected, rtol=0, atol=0)


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_loss_backward_reaches_every_trainable_parameter(model_type, head):
    model = tiny_model(model_type, head).train()
    loss = loss_of(model, head, make_inputs(model.config, head))
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing, f"parameters without gradient: {missing}"


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_gradient_checkpointing_equals_plain_forward(model_type, head):
    model = tiny_model(model_type, head).train()
    inputs = make_inputs(model.config, head)
    torch.manual_seed(123)
    loss = loss_of(model, head, inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    enable_activation_checkpointing(model, {"use_reentrant": False})
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    torch.manual_seed(123)
    loss_ckpt = loss_of(model, head, inputs)
    loss_ckpt.backward()
    torch.testing.assert_close(loss_ckpt, loss)
    for name, grad in grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, msg=name)


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_padding_tokens_never_change_outputs_at_real_positions(model_type, head):
    model = tiny_model(model_type, head).eval()
    inputs = make_inputs(model.config, head)
    changed = {k: v.clone() for k, v in inputs.items()}
    changed["input_ids"][1, PAD_FROM:] = torch.randint(5, model.config.vocab_size, (SEQ_LEN - PAD_FROM,))
    with torch.no_grad():
        a, b = main_output(model(**inputs)), main_output(model(**changed))
    if head in ("base", "masked_lm"):
        a, b = a[1, :PAD_FROM], b[1, :PAD_FROM]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_an_example_gives_the_same_outputs_alone_and_padded_in_a_batch(model_type, head):
    # Batched inference must not change an example's prediction: Smart Bird draws an example's eval keys from its
    # own tokens, not from the batch or its padded length (SBM's fastRG backend: tests/sbm).
    model = tiny_model(model_type, head).eval()
    inputs = make_inputs(model.config, head)  # the second example is padded from PAD_FROM
    alone = {key: value[1:] if key == "decoder_input_ids" else value[1:, :PAD_FROM] for key, value in inputs.items()}
    with torch.no_grad():
        batched, single = main_output(model(**inputs))[1], main_output(model(**alone))[0]
    if head in ("base", "masked_lm"):
        batched = batched[:PAD_FROM]
    torch.testing.assert_close(single, batched, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_eval_is_deterministic(model_type, head):
    model = tiny_model(model_type, head).eval()
    inputs = make_inputs(model.config, head)
    with torch.no_grad():
        first = main_output(model(**inputs))
        torch.manual_seed(999)  # a different global RNG state must not matter in eval
        second = main_output(model(**inputs))
    torch.testing.assert_close(first, second, rtol=0, atol=0)


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_attention_and_hidden_state_outputs(model_type, head):
    model = tiny_model(model_type, head).eval()
    inputs = make_inputs(model.config, head)
    with torch.no_grad():
        out = model(**inputs, output_attentions=True, output_hidden_states=True)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    attentions = out.encoder_attentions if head == "conditional_generation" else out.attentions
    hidden = out.encoder_hidden_states if head == "conditional_generation" else out.hidden_states
    assert len(attentions) == layers and len(hidden) == layers + 1
    for weights in attentions:
        assert weights.shape == (2, heads, SEQ_LEN, SEQ_LEN)
        # A padded key never receives attention weight, and real query rows are distributions (or empty).
        assert weights[1, :, :, PAD_FROM:].abs().max() == 0
        row_sums = weights[0].sum(-1)
        if FAMILIES[model_type].attention_class.weights_are_normalized:
            assert torch.all(((row_sums - 1).abs() < 1e-4) | (row_sums.abs() < 1e-6))
        else:
            bound = model.base_model.encoder.layers[0].attention.max_row_weight
            assert weights.min() >= 0 and torch.all(row_sums <= bound + 1e-4)
    if head == "conditional_generation":
        assert len(out.decoder_attentions) == model.config.decoder_layers
        assert out.cross_attentions[0].shape == (2, heads, 12, SEQ_LEN)
        assert out.cross_attentions[0][1, :, :, PAD_FROM:].abs().max() == 0


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_tuple_outputs_match_dict_outputs(model_type, head):
    model = tiny_model(model_type, head).eval()
    inputs = make_inputs(model.config, head)
    with torch.no_grad():
        as_dict = model(**inputs)
        as_tuple = model(**inputs, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], as_dict.to_tuple()[0])


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_inputs_embeds_match_input_ids(model_type, head):
    model = tiny_model(model_type, head).eval()
    inputs = make_inputs(model.config, head)
    embeds = model.get_input_embeddings()(inputs["input_ids"])
    with torch.no_grad():
        by_ids = main_output(model(**inputs))
        by_embeds = main_output(model(**{**inputs, "input_ids": None, "inputs_embeds": embeds}))
    torch.testing.assert_close(by_embeds, by_ids)


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_resize_token_embeddings_keeps_model_usable_and_tied(model_type, head):
    model = tiny_model(model_type, head)
    old = model.config.vocab_size
    model.resize_token_embeddings(old + 13)
    assert model.config.vocab_size == old + 13
    assert model.get_input_embeddings().weight.shape[0] == old + 13
    if head in ("masked_lm", "conditional_generation"):
        assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    inputs = make_inputs(model.config, head)
    inputs["input_ids"][0, 0] = old + 12  # a new token id must be accepted
    model.eval()
    with torch.no_grad():
        out = model(**inputs)
    if head in ("masked_lm", "conditional_generation"):
        assert out.logits.shape[-1] == old + 13


@pytest.mark.parametrize(
    ("model_type", "head"), [c for c in CASES if c.values[1] in ("masked_lm", "conditional_generation")]
)
def test_tied_weights_survive_save_and_load(model_type, head, tmp_path):
    model = tiny_model(model_type, head)
    model.save_pretrained(tmp_path)
    reloaded = AUTO_CLASSES[head].from_pretrained(tmp_path)
    embeddings = reloaded.get_input_embeddings().weight
    assert reloaded.get_output_embeddings().weight.data_ptr() == embeddings.data_ptr()
    torch.testing.assert_close(embeddings, model.get_input_embeddings().weight)
    if head == "conditional_generation":
        assert reloaded.get_decoder().embed_tokens.weight.data_ptr() == embeddings.data_ptr()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_head_loaded_from_masked_lm_checkpoint_keeps_the_encoder(model_type, tmp_path):
    """Warm starts: the encoder moves between heads name for name and is never re-initialised on load."""
    mlm = tiny_model(model_type, "masked_lm")
    mlm.save_pretrained(tmp_path)
    for head in ("sequence_classification", "conditional_generation", "base"):
        loaded = AUTO_CLASSES[head].from_pretrained(tmp_path)
        encoder = (
            loaded.get_encoder()
            if head == "conditional_generation"
            else (loaded.encoder if head == "base" else loaded.model.encoder)
        )
        for name, tensor in mlm.model.encoder.state_dict().items():
            torch.testing.assert_close(encoder.state_dict()[name], tensor, rtol=0, atol=0, msg=f"{head}: {name}")


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_generate_with_cache_equals_without_cache(model_type):
    model = tiny_model(model_type, "conditional_generation", initializer_range=0.5).eval()
    inputs = make_inputs(model.config, "conditional_generation")
    inputs.pop("decoder_input_ids")
    # An untrained model repeats one token; forbidding repeats makes every step depend on the full logit ranking.
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": None, "no_repeat_ngram_size": 1}
    with_cache = model.generate(**inputs, use_cache=True, **kwargs)
    without_cache = model.generate(**inputs, use_cache=False, **kwargs)
    assert with_cache.shape == (2, 11)
    torch.testing.assert_close(with_cache, without_cache, rtol=0, atol=0)
    beams = model.generate(**inputs, num_beams=3, num_return_sequences=2, **kwargs)
    assert beams.shape == (4, 11)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_cached_decoder_logits_equal_full_recomputation(model_type):
    model = tiny_model(model_type, "conditional_generation", initializer_range=0.2).eval()
    inputs = make_inputs(model.config, "conditional_generation")
    dec = inputs.pop("decoder_input_ids")
    with torch.no_grad():
        full = model(**inputs, decoder_input_ids=dec, use_cache=False).logits
        out = model(**inputs, decoder_input_ids=dec[:, :5], use_cache=True)
        steps = [out.logits]
        encoder_outputs = (out.encoder_last_hidden_state,)
        past = get_cache(out)
        for t in range(5, dec.shape[1]):
            out = model(
                attention_mask=inputs["attention_mask"],
                encoder_outputs=encoder_outputs,
                decoder_input_ids=dec[:, t : t + 1],
                cache=past,
                use_cache=True,
            )
            past = get_cache(out)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


DECODERS = [pytest.param(f, {}, id=FAMILIES[f].name) for f in sorted(FAMILIES)] + [
    pytest.param("sbm", {"sbm_in_decoder": False}, id="SBM-dense-decoder")
]


@pytest.mark.parametrize(("model_type", "overrides"), DECODERS)
@pytest.mark.parametrize("path", ["output_attentions", "reference_backend"])
def test_decoder_never_sees_later_tokens_on_the_reference_path(model_type, overrides, path):
    # Without decoder padding, causality came only from the fast kernel's causal flag, which the reference kernel
    # (taken for `output_attentions` and `attention_backend="reference"`) does not have: it attended to later tokens.
    model = tiny_model(model_type, "conditional_generation", **overrides).eval()
    reference = tiny_model(model_type, "conditional_generation", attention_backend="reference", **overrides).eval()
    reference.load_state_dict(model.state_dict())
    inputs = make_inputs(model.config, "conditional_generation")
    later_changed = inputs["decoder_input_ids"].clone()
    later_changed[:, -1] = (later_changed[:, -1] + 1) % model.config.vocab_size
    kwargs = {"output_attentions": True} if path == "output_attentions" else {}
    run = model if path == "output_attentions" else reference
    with torch.no_grad():
        fast = model(**inputs).logits
        out = run(**inputs, **kwargs)
        changed = run(**{**inputs, "decoder_input_ids": later_changed}, **kwargs).logits
    torch.testing.assert_close(out.logits, fast, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(changed[:, :-1], out.logits[:, :-1], rtol=0, atol=1e-6)
    for weights in out.decoder_attentions or ():
        assert weights.triu(diagonal=1).abs().max() == 0


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_seq2seq_labels_are_shifted_exactly_once(model_type):
    model = tiny_model(model_type, "conditional_generation").eval()
    inputs = make_inputs(model.config, "conditional_generation")
    labels = inputs.pop("decoder_input_ids")
    labels[0, -3:] = -100
    with torch.no_grad():
        out = model(**inputs, labels=labels)
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
        assert decoder_input_ids[0, 0] == model.config.decoder_start_token_id
        assert torch.equal(decoder_input_ids[1, 1:], labels[1, :-1])
        logits = model(**inputs, decoder_input_ids=decoder_input_ids).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    aux = out.aux_loss * model.config.aux_loss_coef if out.aux_loss is not None else 0.0
    torch.testing.assert_close(out.loss, expected + aux)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_loss_uses_num_items_in_batch_for_gradient_accumulation(model_type):
    model = tiny_model(model_type, "masked_lm", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    inputs = make_inputs(model.config, "masked_lm")
    labels = labels_for(model.config, "masked_lm", inputs)
    n = int((labels != -100).sum())
    with torch.no_grad():
        mean_loss = model(**inputs, labels=labels).loss
        summed = model(**inputs, labels=labels, num_items_in_batch=2 * n).loss
    # Half of the accumulated batch's tokens are here: the micro-batch contributes half of its mean loss.
    torch.testing.assert_close(summed, mean_loss / 2)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_bad_configs_raise_value_error_naming_the_field(model_type):
    family = FAMILIES[model_type]
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_config(family, "tiny", hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="classifier_pooling"):
        load_config(family, "tiny", classifier_pooling="max")
    with pytest.raises(ValueError, match="attention_backend"):
        load_config(family, "tiny", attention_backend="fastest")
    with pytest.raises(ValueError, match="hidden_dropout_prob"):
        load_config(family, "tiny", hidden_dropout_prob=1.5)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_config_fields_are_type_checked(model_type):
    # @strict checks types only when the annotations are real types (no `from __future__ import annotations` in the
    # configuration modules): a string "False" for a bool would otherwise be accepted and read as True.
    family = FAMILIES[model_type]
    own_bool = next(f.name for f in dataclasses.fields(family.config_class) if f.type is bool)
    for name, value in (("num_global_tokens", "1"), ("tie_word_embeddings", "False"), (own_bool, "False")):
        with pytest.raises(StrictDataclassFieldValidationError, match=name):
            load_config(family, "tiny", **{name: value})


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_bad_inputs_raise_clear_value_errors(model_type):
    model = tiny_model(model_type, "sequence_classification").eval()
    config = model.config
    too_long = torch.randint(5, config.vocab_size, (1, config.max_position_embeddings + 1))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=too_long)
    ids = torch.randint(5, config.vocab_size, (2, 8))
    with pytest.raises(ValueError, match="num_labels"):
        model(input_ids=ids, labels=torch.tensor([0, config.num_labels]))
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=ids, attention_mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match="vocab_size"):
        model(input_ids=torch.full((1, 4), config.vocab_size))
    with pytest.raises(ValueError, match="input_ids"):
        model()
    # Checked before anything reads them (Smart Bird's sketch read the positions first: an IndexError).
    for position_ids in (torch.full((2, 8), config.max_position_embeddings), torch.full((2, 8), -1)):
        with pytest.raises(ValueError, match="position_ids"):
            model(input_ids=ids, position_ids=position_ids)
    for token_type_ids in (torch.full((2, 8), config.type_vocab_size), torch.full((2, 8), -1)):
        with pytest.raises(ValueError, match="token_type_ids"):
            model(input_ids=ids, token_type_ids=token_type_ids)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_generating_past_the_decoder_positions_says_how_far_it_got(model_type):
    model = tiny_model(model_type, "conditional_generation").eval()
    limit = model.config.decoder_max_position_embeddings
    message = f"Sequence length 1 after {limit} cached positions exceeds `decoder_max_position_embeddings` ({limit})"
    with torch.no_grad(), pytest.raises(ValueError, match=re.escape(message)):
        model.generate(input_ids=torch.randint(5, model.config.vocab_size, (1, 8)), max_new_tokens=limit + 1)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_classification_ignores_labels_of_minus_100_as_bert_does(model_type):
    model = tiny_model(model_type, "sequence_classification").eval()
    ids = torch.randint(5, model.config.vocab_size, (3, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, labels=torch.tensor([1, -100, 0]))
    expected = torch.nn.functional.cross_entropy(out.logits[[0, 2]], torch.tensor([1, 0]))
    aux = out.aux_loss * model.config.aux_loss_coef if out.aux_loss is not None else 0.0
    torch.testing.assert_close(out.loss, expected + aux)


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_empty_batches_raise_a_value_error_that_says_so(model_type, head):
    model = tiny_model(model_type, head).eval()
    for shape in ((0, 8), (2, 0)):
        with pytest.raises(ValueError, match="at least one example of at least one token"):
            model(input_ids=torch.zeros(shape, dtype=torch.long))
        with pytest.raises(ValueError, match="at least one example of at least one token"):
            model(inputs_embeds=torch.zeros(*shape, model.config.hidden_size))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_seq2seq_lm_head_transform_is_tied_saved_and_resized(model_type, tmp_path):
    """`lm_head_transform=True` (BERT2BERT's decoder head): logits are BERT's masked-LM head on the decoder's last
    state, the matrix stays tied through save, load and resizing, and resizing keeps the learnt bias entries."""
    model = tiny_model(model_type, "conditional_generation", lm_head_transform=True).eval()
    plain_keys = dict(type(model)._tied_weights_keys)
    assert isinstance(model.lm_head, MaskedLMHead) and "lm_head.weight" in plain_keys  # the class keeps its own
    with torch.no_grad():
        model.lm_head.bias.normal_()
    inputs = make_inputs(model.config, "conditional_generation")
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
        torch.testing.assert_close(out.logits, model.lm_head(out.decoder_hidden_states[-1]))
    model.save_pretrained(tmp_path)
    reloaded = AUTO_CLASSES["conditional_generation"].from_pretrained(tmp_path).eval()
    assert reloaded.get_output_embeddings().weight.data_ptr() == reloaded.get_input_embeddings().weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, out.logits)
    old_bias = model.lm_head.bias.detach().clone()
    model.resize_token_embeddings(model.config.vocab_size + 5)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(model.lm_head.bias[: old_bias.numel()], old_bias)
    assert model.lm_head.bias[old_bias.numel() :].abs().sum() == 0
    assert type(model)._tied_weights_keys == plain_keys

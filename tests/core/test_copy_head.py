"""`copy_from_source`: the pointer-generator output of the seq2seq head."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM

import attnzoo  # noqa: F401  (registers the families)
from attnzoo.core.copy_head import SourceCopyHead

VOCAB = 60


def tiny_seq2seq(family: str = "dense_transformer", **fields) -> torch.nn.Module:
    fields = {"copy_from_source": True, **fields}
    config = AutoConfig.for_model(
        family,
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        num_hidden_layers=1,
        decoder_layers=1,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **fields,
    )
    torch.manual_seed(0)
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def reference_mixture(head, vocab_logits, decoder_states, encoder_states, source_ids, valid, decoder_input_ids):
    """The mixture written out one target position and one source token at a time."""
    batch, target_len, vocab = vocab_logits.shape
    out = torch.empty(batch, target_len, vocab, dtype=torch.float64)
    for b in range(batch):
        keys = head.key(encoder_states[b]).double()
        real = valid[b].nonzero().flatten().tolist()
        for t in range(target_len):
            query = head.query(decoder_states[b, t]).double()
            follow = head.follow(decoder_states[b, t]).double()[0]
            scores = torch.stack(
                [
                    query @ keys[i] * head.scale
                    + (follow if i > 0 and source_ids[b, i - 1] == decoder_input_ids[b, t] else 0)
                    for i in real
                ]
            )
            weights = scores.softmax(0)
            context = sum(w * encoder_states[b, i].double() for w, i in zip(weights, real, strict=True))
            gate = torch.sigmoid(
                head.gate.weight.double() @ torch.cat([decoder_states[b, t].double(), context])
                + head.gate.bias.double()
            )
            probs = gate * vocab_logits[b, t].double().softmax(0)
            for w, i in zip(weights, real, strict=True):
                probs[source_ids[b, i]] += (1 - gate[0]) * w
            out[b, t] = probs.log()
    return out


def test_copy_head_is_the_pointer_generator_mixture():
    torch.manual_seed(0)
    config = tiny_seq2seq().config
    head = SourceCopyHead(config)
    torch.nn.init.normal_(head.gate.bias, std=1.0)
    batch, target_len, source_len = 2, 3, 7
    vocab_logits = torch.randn(batch, target_len, VOCAB)
    decoder_states = torch.randn(batch, target_len, 32)
    encoder_states = torch.randn(batch, source_len, 32)
    # Repeated ids (their weights add up) and a token that only padding holds (it gets no copy mass).
    source_ids = torch.tensor([[5, 6, 5, 7, 8, 9, 5], [10, 11, 12, 10, 13, 59, 59]])
    valid = torch.ones(batch, source_len, dtype=torch.bool)
    valid[1, 5:] = False
    # Steps that read a token of the source (5 occurs three times, 12 once) and one that reads none.
    inputs = torch.tensor([[5, 7, 40], [12, 10, 59]])
    torch.nn.init.normal_(head.follow.weight, std=0.5)
    with torch.no_grad():
        actual = head(vocab_logits, decoder_states, encoder_states, source_ids, valid, inputs)
        expected = reference_mixture(head, vocab_logits, decoder_states, encoder_states, source_ids, valid, inputs)
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(actual.exp().sum(-1), torch.ones(batch, target_len))
    # Token 59 is padding only in row 1: its probability there is the vocabulary's share alone.
    assert (actual[1, :, 59].exp() <= vocab_logits[1].softmax(-1)[:, 59] + 1e-7).all()


def test_copy_head_gradients_stay_finite_where_the_vocabulary_underflows():
    config = tiny_seq2seq().config
    head = SourceCopyHead(config)
    vocab_logits = (torch.randn(1, 4, VOCAB) * 1e4).requires_grad_()  # softmax exactly 0 almost everywhere
    states = torch.randn(1, 4, 32, requires_grad=True)
    encoder_states = torch.randn(1, 6, 32, requires_grad=True)
    source_ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    log_probs = head(vocab_logits, states, encoder_states, source_ids, None, torch.tensor([[2, 1, 2, 3]]))
    loss = torch.nn.functional.cross_entropy(log_probs.flatten(0, 1), torch.tensor([7, 2, 30, 4]))
    loss.backward()
    weights = (head.query.weight, head.key.weight, head.gate.weight, head.follow.weight)
    for tensor in (vocab_logits, states, encoder_states, *weights):
        assert torch.isfinite(tensor.grad).all()
    assert all(weight.grad.abs().sum() > 0 for weight in weights)


def test_model_loss_is_the_mixture_negative_log_likelihood():
    model = tiny_seq2seq()
    source = torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(source)
    mask[1, 9:] = 0
    labels = torch.randint(4, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    labels[0, 4] = -100
    out = model(input_ids=source, attention_mask=mask, labels=labels)
    kept = labels != -100
    expected = -out.logits.gather(-1, labels.clamp_min(0)[..., None])[..., 0][kept].mean()
    torch.testing.assert_close(out.loss, expected)
    # Without the head the same weights give other log-probabilities: the head is what is tested.
    plain = tiny_seq2seq(copy_from_source=False)
    assert plain.copy_head is None
    assert not torch.allclose(plain(input_ids=source, attention_mask=mask, labels=labels).logits, out.logits)


@pytest.mark.parametrize("family", ["dense_transformer", "sparse_transformer", "smart_bird"])
def test_generate_copies_through_the_encoder_outputs(family):
    model = tiny_seq2seq(family)
    source = torch.randint(4, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(source)
    mask[1, 15:] = 0
    encoder_outputs = model.get_encoder()(input_ids=source, attention_mask=mask)
    assert torch.equal(encoder_outputs.source_ids, source)
    kwargs = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "num_beams": 2}
    cached = model.generate(input_ids=source, **kwargs)
    uncached = model.generate(input_ids=source, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)
    # Each step's scores are the mixture's: the forward on the generated prefix gives the same choices.
    greedy = model.generate(input_ids=source, attention_mask=mask, max_new_tokens=6, do_sample=False)
    with torch.no_grad():
        logits = model(input_ids=source, attention_mask=mask, decoder_input_ids=greedy[:, :-1]).logits
    assert torch.equal(logits.argmax(-1), greedy[:, 1:])


def test_the_step_after_a_written_token_can_copy_the_token_that_follows_it():
    """With the bonus large, the copy mass goes to the positions after the occurrences of the step's input token."""
    config = tiny_seq2seq().config
    head = SourceCopyHead(config)
    torch.nn.init.zeros_(head.follow.weight)
    torch.nn.init.constant_(head.follow.bias, 30.0)
    torch.nn.init.constant_(head.gate.bias, -30.0)  # copy only
    source_ids = torch.tensor([[9, 4, 7, 8, 4, 6, 5]])  # 4 is followed by 7 and by 6
    vocab_logits = torch.zeros(1, 2, VOCAB)
    with torch.no_grad():
        probs = head(
            vocab_logits, torch.randn(1, 2, 32), torch.randn(1, 7, 32), source_ids, None, torch.tensor([[4, 5]])
        )
    probs = probs.exp()
    torch.testing.assert_close(probs[0, 0, 7] + probs[0, 0, 6], torch.tensor(1.0))
    # 5 ends the source: nothing follows it, so that step's copy attention is the content scores alone.
    assert probs[0, 1, [9, 4, 7, 8, 6, 5]].sum() > 0.99 and probs[0, 1, 4] < 0.9


def test_copy_needs_the_source_ids():
    model = tiny_seq2seq()
    source = torch.randint(4, VOCAB, (1, 8))
    states = model.get_encoder()(input_ids=source).last_hidden_state
    with pytest.raises(ValueError, match="copy_from_source"):
        model(encoder_outputs=(states,), decoder_input_ids=torch.tensor([[2, 5]]))
    with pytest.raises(ValueError, match="decoder_input_ids"):
        model(input_ids=source, decoder_inputs_embeds=torch.randn(1, 2, 32))


def test_copy_head_round_trips(tmp_path):
    model = tiny_seq2seq()
    torch.nn.init.normal_(model.copy_head.gate.bias)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.config.copy_from_source
    for name, tensor in model.copy_head.state_dict().items():
        torch.testing.assert_close(loaded.copy_head.state_dict()[name], tensor)


def copy_task_loss(copy_from_source: bool, steps: int = 160) -> float:
    """Train a tiny model on a task that only copying solves (the four tokens after a marker at a random place
    among random tokens) and return its loss on fresh examples."""
    model = tiny_seq2seq(copy_from_source=copy_from_source).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)

    def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        source = torch.randint(5, VOCAB, (size, 24), generator=generator)
        start = torch.randint(0, 19, (size,), generator=generator)
        rows = torch.arange(size)
        source[rows, start] = 4  # the marker
        labels = torch.stack([source[rows, start + 1 + i] for i in range(4)], dim=1)
        return source, torch.cat([labels, torch.full((size, 1), 3)], dim=1)

    for _ in range(steps):
        source, labels = batch(32)
        loss = model(input_ids=source, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    source, labels = batch(256)
    with torch.no_grad():
        return model(input_ids=source, labels=labels).loss.item()


def test_copying_learns_what_the_plain_head_cannot_in_the_same_steps():
    with_copy, plain = copy_task_loss(True), copy_task_loss(False)
    # Guessing the four copies uniformly among the 55 content tokens costs 4 ln 55 / 5 = 3.2 per target token, where
    # the plain head stays (3.21 when written); the copying head is at 0.41 (1.03 without its bonus for the position
    # after the token just written).
    assert with_copy < 0.5 * plain, (with_copy, plain)

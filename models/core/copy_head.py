"""Copying from the source: the pointer-generator output of the seq2seq head (See et al., 2017)."""

from __future__ import annotations

import torch
from torch import nn

from .configuration import ZooConfig


class SourceCopyHead(nn.Module):
    r"""
    Mixes the decoder's vocabulary distribution with a distribution over the source's tokens:

        P(w) = g * softmax(vocab_logits)(w) + (1 - g) * sum_{i : x_i = w} a_i,

    `a` a single-head attention of each decoder state over the encoder's states, `g = sigmoid(w [s; a·h] + b)` the
    generation gate read from the decoder state `s` and the attended context. A warm-started BERT2BERT decoder must
    otherwise learn to reproduce a figure or a name of the transcript through its fresh cross-attention and the
    30k-token softmax, which a short fine-tuning budget does not teach; here a source token is one attention weight
    away. The gate starts at one half (zero bias), so the untrained head already puts half of its mass on the
    source's tokens.

    The attention's logits also get a learned, state-dependent bonus `f(s)` at every source position that follows an
    occurrence of the token the step reads (the token just written): a figure or a name is several consecutive
    WordPiece tokens (`$`, `7`, `.`, `80`), and once the first is written this lets the next come from the position
    after it without the decoder having to recall where that was. It needs only the step's input token, so decoding
    with a cache computes it as training does.
    """

    def __init__(self, config: ZooConfig):
        super().__init__()
        hidden = config.hidden_size
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.gate = nn.Linear(2 * hidden, 1)
        self.follow = nn.Linear(hidden, 1)
        self.scale = hidden**-0.5

    def forward(
        self,
        vocab_logits: torch.Tensor,
        decoder_states: torch.Tensor,
        encoder_states: torch.Tensor,
        source_ids: torch.Tensor,
        encoder_key_valid: torch.Tensor | None,
        decoder_input_ids: torch.Tensor,
    ) -> torch.Tensor:
        """
        Args:
            vocab_logits (`torch.Tensor` of shape `(batch, target_len, vocab_size)`): the LM head's logits.
            decoder_states (`torch.Tensor` of shape `(batch, target_len, hidden)`): the decoder's last states.
            encoder_states (`torch.Tensor` of shape `(batch, source_len, hidden)`): the encoder's last states.
            source_ids (`torch.LongTensor` of shape `(batch, source_len)`): the encoder's input ids.
            encoder_key_valid (`torch.BoolTensor` of shape `(batch, source_len)`, *optional*): real source tokens.
            decoder_input_ids (`torch.LongTensor` of shape `(batch, target_len)`): the token each step reads.

        Returns:
            `torch.FloatTensor` of shape `(batch, target_len, vocab_size)`: log-probabilities of the mixture, in fp32
            (their log-softmax is themselves, so cross-entropy and `generate()` read them as logits).
        """
        if source_ids.shape != encoder_states.shape[:2]:
            raise ValueError(
                f"Copying from the source needs one source id per encoder state: ids {tuple(source_ids.shape)}, "
                f"states {tuple(encoder_states.shape[:2])}."
            )
        if decoder_input_ids.shape != decoder_states.shape[:2]:
            raise ValueError(
                f"The copy head needs each decoder step's input id: ids {tuple(decoder_input_ids.shape)}, states "
                f"{tuple(decoder_states.shape[:2])}."
            )
        # (batch, target_len, source_len): one head, scaled dot products of the projected states.
        scores = (self.query(decoder_states) @ self.key(encoder_states).transpose(1, 2)).float() * self.scale
        # Position j follows an occurrence of the step's input token when source_ids[j - 1] is that token (-1: no id).
        previous = nn.functional.pad(source_ids[:, :-1], (1, 0), value=-1)
        follows = previous[:, None, :] == decoder_input_ids[:, :, None]
        scores = scores + follows * self.follow(decoder_states).float()
        if encoder_key_valid is not None:
            scores = scores.masked_fill(~encoder_key_valid[:, None, :], float("-inf"))
        weights = scores.softmax(dim=-1)
        context = weights.to(encoder_states.dtype) @ encoder_states  # (batch, target_len, hidden)
        generate = torch.sigmoid(self.gate(torch.cat([decoder_states, context], dim=-1)).float())  # (b, t, 1)
        # Every occurrence of a token adds its weight to that token's probability.
        index = source_ids[:, None, :].expand_as(weights)
        copied = weights.new_zeros(vocab_logits.shape).scatter_add_(-1, index, weights)
        probs = generate * vocab_logits.float().softmax(dim=-1) + (1.0 - generate) * copied
        # A probability that underflows to zero would make log's gradient 0/0; the clamp passes none there.
        return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()

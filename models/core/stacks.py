"""Embeddings and the encoder / decoder stacks, which collect per-layer outputs and auxiliary losses."""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from .attention import ZooAttention
from .compat import cache_field
from .configuration import ZooConfig
from .layers import DecoderLayer, EncoderLayer
from .masking import key_valid_from_attention_mask
from .outputs import ZooDecoderOutput, ZooModelOutput
from .positions import build_position_embeddings


def check_inputs(
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    max_positions: int,
    field: str,
    past_length: int = 0,
) -> tuple[int, int]:
    """Validate that exactly one of ids/embeddings is given and the length fits after `past_length` cached positions;
    return `(batch, length)`."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of `input_ids` and `inputs_embeds`.")
    batch, length = input_ids.shape if input_ids is not None else inputs_embeds.shape[:2]
    if batch == 0 or length == 0:
        # Sparse selections, FFT pooling and the sampling kernels have no meaning for an empty batch; say so here
        # rather than fail deep inside a kernel.
        raise ValueError(
            f"Got inputs of shape {(batch, length)}: a batch needs at least one example of at least one token."
        )
    if past_length + length > max_positions:
        after_cache = f" after {past_length} cached positions" if past_length else ""
        raise ValueError(
            f"Sequence length {length}{after_cache} exceeds `{field}` ({max_positions}); truncate the inputs (or "
            f"generate fewer tokens) or use a config with a larger `{field}`."
        )
    return batch, length


def check_token_ids(input_ids: torch.Tensor | None, vocab_size: int) -> None:
    if input_ids is not None and input_ids.numel() and bool((input_ids >= vocab_size).any() | (input_ids < 0).any()):
        raise ValueError(f"`input_ids` contain ids outside [0, vocab_size={vocab_size}).")


def check_position_ids(position_ids: torch.Tensor, length: int, max_positions: int, rotary: bool = False) -> None:
    """Explicit `position_ids` must give one position per token and index the position table: a negative id would
    silently read its last rows.

    With rotary positions the attention rotates by each token's index, so only `0 .. N - 1` is meaningful.
    """
    if position_ids.shape[-1] != length:
        raise ValueError(
            f"`position_ids` must give one position per token: shape {tuple(position_ids.shape)} for an input of "
            f"{length} tokens."
        )
    if rotary:
        expected = torch.arange(length, device=position_ids.device).expand_as(position_ids)
        if not torch.equal(position_ids, expected):
            raise ValueError(
                "`position_ids` other than 0 .. N - 1 are not supported with `position_embedding_type='rotary'`: "
                "the attention rotates queries and keys by each token's index."
            )
    if position_ids.numel() and bool((position_ids >= max_positions).any() | (position_ids < 0).any()):
        raise ValueError(
            f"`position_ids` contain positions outside [0, max_position_embeddings={max_positions}): "
            f"min {int(position_ids.min())}, max {int(position_ids.max())}."
        )


class Embeddings(nn.Module):
    """Token + position + token type embeddings, LayerNorm and dropout (BERT layout).

    `position_embeddings` is BERT's learned table (`position_embedding_type="absolute"`), the fixed sinusoidal one
    (`"sinusoidal"`, a [`SinusoidalPositions`] whose table is never saved or loaded) or `None` (`"rotary"`: the
    attention layers rotate queries and keys instead).
    """

    def __init__(self, config: ZooConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = build_position_embeddings(config, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.type_vocab_size = config.type_vocab_size
        self.max_positions = config.max_position_embeddings

    def check_ids(self, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None, length: int) -> None:
        """Explicit `position_ids` and `token_type_ids` must index their tables (a `ValueError` naming them, not an
        `IndexError`). The encoder checks them before anything reads them (Smart Bird's sketch reads the positions)."""
        if position_ids is not None:
            check_position_ids(position_ids, length, self.max_positions, rotary=self.position_embeddings is None)
        if token_type_ids is not None and bool(
            ((token_type_ids < 0) | (token_type_ids >= self.type_vocab_size)).any()
        ):
            raise ValueError(
                f"`token_type_ids` must be in [0, type_vocab_size={self.type_vocab_size}): min "
                f"{int(token_type_ids.min())}, max {int(token_type_ids.max())}."
            )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor:
        """Embed the inputs; `position_ids` and `token_type_ids` are checked by [`check_ids`] first."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        length = inputs_embeds.shape[1]
        if position_ids is None:
            position_ids = torch.arange(length, device=inputs_embeds.device)[None]
        if token_type_ids is None:
            type_embeds = self.token_type_embeddings.weight[0]
        else:
            type_embeds = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds
        if self.position_embeddings is not None:  # None: rotary positions, applied in the attention
            # The fixed table is fp32 whatever the model's dtype (`from_pretrained(dtype=...)` rebuilds it in fp32).
            embeddings = embeddings + self.position_embeddings(position_ids).to(inputs_embeds.dtype)
        embeddings = embeddings + type_embeds
        return self.dropout(self.LayerNorm(embeddings))


class Encoder(nn.Module):
    """Embeddings and a stack of :class:`EncoderLayer`; sums the layers' auxiliary losses."""

    def __init__(self, config: ZooConfig, attention_class: type[ZooAttention]):
        super().__init__()
        self.config = config
        # Set by a seq2seq model that copies from its source: the output then carries the input ids.
        self.keeps_source_ids = False
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, attention_class, i) for i in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_norm else None

    def prepare_layers(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        key_valid: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Hook run once per forward, before the layers, for methods whose attention needs encoder-level inputs
        (Smart Bird's sketch network). Returns an auxiliary loss to add to the layers' ones, or `None`."""
        return None

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
    ) -> ZooModelOutput | tuple:
        batch, length = check_inputs(
            input_ids, inputs_embeds, self.config.max_position_embeddings, "max_position_embeddings"
        )
        check_token_ids(input_ids, self.config.vocab_size)
        self.embeddings.check_ids(token_type_ids, position_ids, length)
        key_valid = key_valid_from_attention_mask(attention_mask, batch, length)
        extra_aux_loss = self.prepare_layers(input_ids, inputs_embeds, position_ids, key_valid)
        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        all_hidden = [hidden_states] if output_hidden_states else None
        all_attn = [] if output_attentions else None
        aux_losses, densities = ([extra_aux_loss] if extra_aux_loss is not None else []), []
        for layer in self.layers:
            hidden_states, weights, aux_loss, density = layer(hidden_states, key_valid, output_attentions)
            if output_attentions:
                all_attn.append(weights)
            if aux_loss is not None:
                aux_losses.append(aux_loss)
            if density is not None:
                densities.append(density)
            if output_hidden_states:
                all_hidden.append(hidden_states)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
            if output_hidden_states:
                all_hidden[-1] = hidden_states
        out = ZooModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attn) if output_attentions else None,
            # Auxiliary losses are training terms; a scalar in eval outputs would also break beam search, which
            # repeats every encoder output along the batch dimension.
            aux_loss=torch.stack(aux_losses).sum() if aux_losses and self.training else None,
            attention_density=torch.stack(densities, dim=1) if len(densities) == len(self.layers) else None,
            source_ids=input_ids if self.keeps_source_ids else None,
        )
        return out if return_dict else out.to_tuple()


class Decoder(nn.Module):
    """Token + position embeddings and a stack of :class:`DecoderLayer` with an `EncoderDecoderCache`."""

    def __init__(
        self,
        config: ZooConfig,
        self_attention_class: type[ZooAttention],
        cross_attention_class: type[ZooAttention],
    ):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.embed_positions = nn.Embedding(config.decoder_max_position_embeddings, config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(
            DecoderLayer(config, self_attention_class, cross_attention_class, i) for i in range(config.decoder_layers)
        )
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_norm else None

    def forward(
        self,
        input_ids: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_key_valid: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool = False,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> ZooDecoderOutput:
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        past_length = cache.get_seq_length() if cache is not None else 0
        batch, length = check_inputs(
            input_ids, inputs_embeds, self.config.decoder_max_position_embeddings, "decoder_max_position_embeddings",
            past_length,
        )  # fmt: skip
        check_token_ids(input_ids, self.config.vocab_size)
        total = past_length + length
        if attention_mask is not None and attention_mask.shape[-1] == length and past_length:
            # Masks that cover only the new tokens: cached positions were real tokens.
            attention_mask = torch.cat([attention_mask.new_ones(batch, past_length), attention_mask], dim=-1)
        self_key_valid = key_valid_from_attention_mask(attention_mask, batch, total)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        positions = torch.arange(past_length, total, device=inputs_embeds.device)[None]
        hidden_states = self.dropout(self.embed_norm(inputs_embeds + self.embed_positions(positions)))
        all_hidden = [hidden_states] if output_hidden_states else None
        all_self, all_cross = ([], []) if output_attentions else (None, None)
        aux_losses = []
        for layer in self.layers:
            hidden_states, self_w, cross_w, aux_loss = layer(
                hidden_states,
                encoder_hidden_states,
                self_key_valid,
                encoder_key_valid,
                cache if use_cache else None,
                output_attentions,
            )
            if output_attentions:
                all_self.append(self_w)
                all_cross.append(cross_w)
            if aux_loss is not None:
                aux_losses.append(aux_loss)
            if output_hidden_states:
                all_hidden.append(hidden_states)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
            if output_hidden_states:
                all_hidden[-1] = hidden_states
        return ZooDecoderOutput(
            last_hidden_state=hidden_states,
            **cache_field(cache if use_cache else None),
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_self) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions else None,
            aux_loss=torch.stack(aux_losses).sum() if aux_losses else None,
        )

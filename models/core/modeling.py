"""Generic `PreTrainedModel` classes. A family binds `config_class` and `attention_class` in thin subclasses.

Layout of the parameters (identical for every family and head, so checkpoints move between them name for name):
`[model.]encoder.embeddings.*`, `[model.]encoder.layers.{i}.*`, `model.decoder.*` (seq2seq), `lm_head.*`,
`classifier.*`.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import ClassVar

import torch
import transformers.initialization as init
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import EncoderDecoderCache
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import logging

from .attention import DenseAttention, ZooAttention
from .compat import CACHE_NAME, LEGACY_CACHE_NAME, cache_field, get_cache, resolve_cache
from .configuration import ZooConfig
from .copy_head import SourceCopyHead
from .heads import ClassificationHead, MaskedLMHead
from .masking import key_valid_from_attention_mask
from .outputs import ZooMaskedLMOutput, ZooModelOutput, ZooSeq2SeqLMOutput, ZooSequenceClassifierOutput
from .positions import SinusoidalPositions
from .stacks import Decoder, Encoder

logger = logging.get_logger(__name__)

#: set while a head builds its inner `<Prefix>Model`, whose attention implementation is the head's (no second note)
_BUILDING_INNER_MODEL = contextvars.ContextVar("attnzoo_building_inner_model", default=False)


@contextlib.contextmanager
def _inner_model() -> contextlib.AbstractContextManager:
    token = _BUILDING_INNER_MODEL.set(True)
    try:
        yield
    finally:
        _BUILDING_INNER_MODEL.reset(token)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: prepend the start token, drop the last label, replace -100 by padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def add_aux_loss(
    loss: torch.Tensor,
    aux_loss: torch.Tensor | None,
    coef: float,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None,
) -> torch.Tensor:
    """Add `coef * aux_loss` with the task loss's gradient-accumulation scale.

    When Trainer passes `num_items_in_batch` the task loss is a sum over this micro-batch divided by the token count
    of the whole accumulated batch; the per-micro-batch auxiliary mean gets the same share (local / total items).
    """
    if aux_loss is None or coef == 0:
        return loss
    if num_items_in_batch is not None:
        local = (labels != -100).sum().to(loss.dtype)
        return loss + coef * aux_loss * local / torch.as_tensor(num_items_in_batch, device=loss.device).to(loss.dtype)
    return loss + coef * aux_loss


class ZooPreTrainedModel(PreTrainedModel):
    """Base of every attnzoo model: weight init, checkpointing flags and the attention binding.

    Families subclass it once to set `config_class` and `attention_class` (and, where a method runs in the decoder,
    `decoder_self_attention_class` / `cross_attention_class`).
    """

    config_class = ZooConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    # Dense attentions compute through transformers' attention interface (`attnzoo.core.attention_interface`), so
    # `attn_implementation` selects their kernel as in BERT/BART; sparse attentions ignore it (noted in the log).
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _no_split_modules: ClassVar[list[str]] = ["EncoderLayer", "DecoderLayer"]
    _skip_keys_device_placement: ClassVar[list[str]] = [CACHE_NAME, LEGACY_CACHE_NAME]
    #: attention of the encoder's self-attention layers
    attention_class: ClassVar[type[ZooAttention]] = DenseAttention
    #: attention of the decoder's causal self-attention (dense unless the method supports causal use)
    decoder_self_attention_class: ClassVar[type[ZooAttention]] = DenseAttention
    #: attention from decoder to encoder (dense unless the method supports cross-attention)
    cross_attention_class: ClassVar[type[ZooAttention]] = DenseAttention
    #: encoder stack (a family whose attention needs encoder-level inputs, like Smart Bird's sketch, subclasses it)
    encoder_class: ClassVar[type[Encoder]] = Encoder

    def _initialize_weights(self, module: nn.Module, is_custom_code: bool = False) -> None:
        # transformers skips `_init_weights` for custom-code modules that own no direct parameters (a guard for code
        # that writes weights in place). Every init here goes through `transformers.initialization`, which skips
        # loaded tensors itself, so the guard is not needed, and it would skip method attentions whose own
        # parameters live in child modules.
        super()._initialize_weights(module, is_custom_code=False)

    def _check_and_adjust_attn_implementation(
        self, attn_implementation: str | None, is_init_check: bool = False, **kwargs
    ) -> str:
        # transformers validates the name (an unknown one is a ValueError) and picks the default.
        chosen = super()._check_and_adjust_attn_implementation(attn_implementation, is_init_check, **kwargs)
        if attn_implementation is not None and not _BUILDING_INNER_MODEL.get():
            self._note_sparse_attention(chosen)
        return chosen

    def _note_sparse_attention(self, implementation: str) -> None:
        """Say once that a method's sparse attention does not use the requested implementation."""
        sparse = self.attention_class
        if sparse.uses_attention_interface:
            return
        logger.warning_once(
            f"{type(self).__name__}: attn_implementation={implementation!r} selects the kernel of the dense "
            "attentions only (decoder self- and cross-attention where they are dense); the encoder's "
            f"{sparse.__name__} is sparse and runs its own kernels whatever the choice."
        )

    def resolve_output_flags(
        self, output_attentions: bool | None, output_hidden_states: bool | None, return_dict: bool | None
    ) -> tuple[bool, bool, bool]:
        """Per-call output switches, falling back to the config's."""
        config = self.config
        return (
            bool(output_attentions if output_attentions is not None else config.output_attentions),
            bool(output_hidden_states if output_hidden_states is not None else config.output_hidden_states),
            bool(return_dict if return_dict is not None else config.return_dict),
        )

    def encoder_label_scope(self, labels: torch.Tensor | None) -> contextlib.AbstractContextManager:
        """Context in which a head runs its encoder: a family whose encoder trains on the head's labels (Smart
        Bird's sketch) hands them over here; the default does nothing. Heads validate `labels` before it."""
        return contextlib.nullcontext()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, MaskedLMHead):
            init.zeros_(module.bias)
        if isinstance(module, SinusoidalPositions):
            # A non-persistent buffer: built on the meta device by `from_pretrained`, so rebuilt here.
            init.copy_(module.table, module.build())
        # Method attentions with parameters of their own initialise them here, with `transformers.initialization`
        # helpers so that weights loaded from a checkpoint are never overwritten.
        if isinstance(module, ZooAttention) and hasattr(module, "init_method_weights"):
            module.init_method_weights()


class ZooModel(ZooPreTrainedModel):
    """Bare encoder returning hidden states (the `AutoModel` of every family, like `BertModel`)."""

    def __init__(self, config: ZooConfig):
        super().__init__(config)
        self.encoder = self.encoder_class(config, self.attention_class)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> ZooModelOutput | tuple:
        """
        Args:
            input_ids (`torch.LongTensor` of shape `(batch, seq_len)`): token ids.
            attention_mask (`torch.Tensor` of shape `(batch, seq_len)`, *optional*): 1 for real tokens, 0 for padding.
            token_type_ids (`torch.LongTensor` of shape `(batch, seq_len)`, *optional*): segment ids.
            position_ids (`torch.LongTensor` of shape `(batch, seq_len)`, *optional*): absolute positions.
            inputs_embeds (`torch.Tensor` of shape `(batch, seq_len, hidden_size)`, *optional*): instead of ids.
        """
        output_attentions, output_hidden_states, return_dict = self.resolve_output_flags(
            output_attentions, output_hidden_states, return_dict
        )
        out = self.encoder(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        return out if return_dict else out.to_tuple()


class _EncoderHeadMixin:
    """Shared plumbing of the encoder-only heads: build `self.model`, run it, expose embeddings."""

    #: the family's `<Prefix>Model`, set by the thin subclasses
    base_model_class: ClassVar[type[ZooModel]] = ZooModel

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def run_encoder(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, oa, oh, rd, labels):
        """Run the encoder (in the head's `encoder_label_scope` for `labels`); returns its output and `return_dict`."""
        with self.encoder_label_scope(labels):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                output_attentions=oa,
                output_hidden_states=oh,
                return_dict=True,
            )
        return out, self.resolve_output_flags(oa, oh, rd)[2]


class ZooForMaskedLM(_EncoderHeadMixin, ZooPreTrainedModel):
    """Encoder with the masked-LM head (tied to the token embeddings); adds the attention auxiliary loss."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {
        "lm_head.decoder.weight": "model.encoder.embeddings.word_embeddings.weight"
    }
    # Trainer passes `num_items_in_batch` so the token-level loss is exact under gradient accumulation.
    accepts_loss_kwargs = True

    def __init__(self, config: ZooConfig):
        super().__init__(config)
        with _inner_model():
            self.model = self.base_model_class(config)
        self.lm_head = MaskedLMHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head.set_decoder(value)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> ZooMaskedLMOutput | tuple:
        """
        Args:
            labels (`torch.LongTensor` of shape `(batch, seq_len)`, *optional*): target ids, -100 where ignored.
            num_items_in_batch (`int`, *optional*): number of target tokens in the accumulated batch (Trainer).
        """
        out, return_dict = self.run_encoder(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict,
            labels,
        )
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = ForMaskedLMLoss(logits, labels, self.config.vocab_size, num_items_in_batch=num_items_in_batch)
            loss = add_aux_loss(loss, out.aux_loss, self.config.aux_loss_coef, labels, num_items_in_batch)
        result = ZooMaskedLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            aux_loss=out.aux_loss,
            attention_density=out.attention_density,
        )
        return result if return_dict else result.to_tuple()


class ZooForSequenceClassification(_EncoderHeadMixin, ZooPreTrainedModel):
    """Encoder with a pooled classification/regression head (`config.num_labels`, `config.problem_type`)."""

    # Per-example losses: let Trainer divide by the accumulation steps (exact for equal micro-batches, all problem
    # types including regression, which ignores `num_items_in_batch` upstream).
    accepts_loss_kwargs = False

    def __init__(self, config: ZooConfig):
        super().__init__(config)
        with _inner_model():
            self.model = self.base_model_class(config)
        self.classifier = ClassificationHead(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> ZooSequenceClassifierOutput | tuple:
        """
        Args:
            labels (`torch.Tensor` of shape `(batch,)` or `(batch, num_labels)`, *optional*): class ids in
                `[0, num_labels)` (-100: ignored by the loss, as in BERT), regression targets (`num_labels == 1`)
                or multi-hot targets.
        """
        if labels is not None:
            self._check_labels(labels)
        out, return_dict = self.run_encoder(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict,
            labels,
        )
        logits = self.classifier(out.last_hidden_state, attention_mask)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
            loss = add_aux_loss(loss, out.aux_loss, self.config.aux_loss_coef, labels, None)
        result = ZooSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            aux_loss=out.aux_loss,
            attention_density=out.attention_density,
        )
        return result if return_dict else result.to_tuple()

    def _check_labels(self, labels: torch.Tensor) -> None:
        num_labels = self.config.num_labels
        integer = labels.dtype in (torch.long, torch.int)
        # -100 is ignored by the loss, as in BERT (e.g. examples without a gold label).
        outside = ((labels < 0) & (labels != -100)) | (labels >= num_labels)
        if num_labels > 1 and integer and labels.dim() == 1 and bool(outside.any()):
            raise ValueError(
                f"Classification labels must be in [0, num_labels={num_labels}) or -100 (ignored); got values "
                f"{sorted(set(labels.tolist()))}. Set `num_labels` (or `id2label`) in the config to match the data."
            )


class Seq2SeqCore(nn.Module):
    """Encoder (same layout as `<Prefix>Model.encoder`) and decoder of the seq2seq head."""

    def __init__(self, config: ZooConfig, owner: type[ZooPreTrainedModel]):
        super().__init__()
        self.encoder = owner.encoder_class(config, owner.attention_class)
        # generate() runs the encoder alone, then decodes from its output: a head that copies from the source
        # needs the source's ids there too.
        self.encoder.keeps_source_ids = config.copy_from_source
        self.decoder = Decoder(config, owner.decoder_self_attention_class, owner.cross_attention_class)


class ZooForConditionalGeneration(ZooPreTrainedModel, GenerationMixin):
    """Encoder-decoder for summarization with `generate()` (LED/BART style: the method in the encoder)."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {
        "model.decoder.embed_tokens.weight": "model.encoder.embeddings.word_embeddings.weight",
        "lm_head.weight": "model.encoder.embeddings.word_embeddings.weight",
    }
    accepts_loss_kwargs = True

    def __init__(self, config: ZooConfig):
        config.is_encoder_decoder = True
        super().__init__(config)
        self.model = Seq2SeqCore(config, type(self))
        if config.lm_head_transform:
            # BERT2BERT's decoder head: the tied matrix moves to `lm_head.decoder`, so the tie is declared per model.
            self.lm_head = MaskedLMHead(config)
            self._tied_weights_keys = {
                ("lm_head.decoder.weight" if target == "lm_head.weight" else target): source
                for target, source in type(self)._tied_weights_keys.items()
            }
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.copy_head = SourceCopyHead(config) if config.copy_from_source else None
        self.post_init()

    def get_encoder(self, modality: str | None = None) -> Encoder:
        return self.model.encoder

    def get_decoder(self) -> Decoder:
        return self.model.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.encoder.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.encoder.embeddings.word_embeddings = value
        self.model.decoder.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder if isinstance(self.lm_head, MaskedLMHead) else self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        if isinstance(self.lm_head, MaskedLMHead):
            self.lm_head.set_decoder(value)
        else:
            self.lm_head = value

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: ZooModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        past_key_values: EncoderDecoderCache | None = None,
    ) -> ZooSeq2SeqLMOutput | tuple:
        """
        Args:
            decoder_input_ids (`torch.LongTensor` of shape `(batch, target_len)`, *optional*): built from `labels`
                by shifting right when omitted.
            encoder_outputs (*optional*): precomputed encoder outputs (as `generate()` passes them).
            cache ([`~transformers.EncoderDecoderCache`], *optional*): decoder KV cache.
            labels (`torch.LongTensor` of shape `(batch, target_len)`, *optional*): target ids (not shifted), -100
                where ignored. The loss is computed without a further shift.
            past_key_values ([`~transformers.EncoderDecoderCache`], *optional*): the cache's name before
                transformers 5.24 (deprecated there); same as `cache`.

        Returns `logits` of shape `(batch, target_len, vocab_size)`: the LM head's, or with `copy_from_source` the
        log-probabilities of its mixture with the copy distribution (fp32).
        """
        cache = resolve_cache(cache, past_key_values)
        oa, oh, return_dict = self.resolve_output_flags(output_attentions, output_hidden_states, return_dict)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if encoder_outputs is None:
            with self.encoder_label_scope(labels):
                encoder_outputs = self.model.encoder(
                    input_ids,
                    attention_mask,
                    token_type_ids,
                    None,
                    inputs_embeds,
                    output_attentions=oa,
                    output_hidden_states=oh,
                )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = ZooModelOutput(*encoder_outputs)
        enc_states = encoder_outputs.last_hidden_state
        encoder_key_valid = key_valid_from_attention_mask(attention_mask, enc_states.shape[0], enc_states.shape[1])
        dec = self.model.decoder(
            decoder_input_ids,
            enc_states,
            attention_mask=decoder_attention_mask,
            encoder_key_valid=encoder_key_valid,
            cache=cache,
            use_cache=use_cache,
            inputs_embeds=decoder_inputs_embeds,
            output_attentions=oa,
            output_hidden_states=oh,
        )
        logits = self.lm_head(dec.last_hidden_state)
        if self.copy_head is not None:
            source_ids = input_ids if input_ids is not None else getattr(encoder_outputs, "source_ids", None)
            if source_ids is None:
                raise ValueError(
                    "This model copies from its source (`copy_from_source=True`) and needs the source's token ids: "
                    "pass `input_ids`, or `encoder_outputs` returned by its own encoder (`model.get_encoder()`)."
                )
            if decoder_input_ids is None:
                raise ValueError(
                    "The copy head (`copy_from_source=True`) reads each decoder step's input token: pass "
                    "`decoder_input_ids` (or `labels`), not `decoder_inputs_embeds`."
                )
            logits = self.copy_head(
                logits, dec.last_hidden_state, enc_states, source_ids, encoder_key_valid, decoder_input_ids
            )
        aux_terms = [a for a in (getattr(encoder_outputs, "aux_loss", None), dec.aux_loss) if a is not None]
        aux_loss = torch.stack(aux_terms).sum() if aux_terms else None
        loss = None
        if labels is not None:
            loss = ForMaskedLMLoss(logits, labels, self.config.vocab_size, num_items_in_batch=num_items_in_batch)
            loss = add_aux_loss(loss, aux_loss, self.config.aux_loss_coef, labels, num_items_in_batch)
        result = ZooSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **cache_field(get_cache(dec)),
            decoder_hidden_states=dec.hidden_states,
            decoder_attentions=dec.attentions,
            cross_attentions=dec.cross_attentions,
            encoder_last_hidden_state=enc_states,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            aux_loss=aux_loss,
        )
        return result if return_dict else result.to_tuple()

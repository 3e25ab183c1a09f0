"""Shared configuration of every attnzoo family: HF field names, seq2seq settings and validation."""

# No `from __future__ import annotations`: huggingface_hub's @strict checks field types only when the annotations
# are real types, not strings.

from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from ..kernels.dispatch import ATTENTION_BACKENDS
from .positions import POSITION_EMBEDDING_TYPES

POOLING_TYPES = ("cls", "mean", "attention")


@strict
class ZooConfig(PreTrainedConfig):
    r"""
    Base configuration shared by every attnzoo family. A method's config subclasses it and adds only its own
    fields; one config serves the encoder (`<Prefix>Model`), the masked-LM and classification heads and the
    encoder-decoder `<Prefix>ForConditionalGeneration`.

    The encoder follows BERT's parameter layout (post-norm by default), so a BERT/RoBERTa checkpoint maps onto
    it name for name (see `attnzoo.conversion.bert_names`).

    Args:
        vocab_size (`int`, *optional*, defaults to 30522):
            Size of the token vocabulary, shared by encoder, decoder and LM heads.
        hidden_size (`int`, *optional*, defaults to 256):
            Width of the hidden states.
        num_hidden_layers (`int`, *optional*, defaults to 2):
            Number of encoder layers.
        num_attention_heads (`int`, *optional*, defaults to 4):
            Attention heads per layer; must divide `hidden_size`.
        intermediate_size (`int`, *optional*, defaults to 1024):
            Width of the feed-forward network.
        hidden_act (`str`, *optional*, defaults to `"gelu"`):
            Activation of the feed-forward network (any key of `transformers.activations.ACT2FN`).
        hidden_dropout_prob (`float`, *optional*, defaults to 0.1):
            Dropout on embeddings and residual branches.
        attention_probs_dropout_prob (`float`, *optional*, defaults to 0.1):
            Dropout on attention probabilities.
        max_position_embeddings (`int`, *optional*, defaults to 4096):
            Longest encoder input (rows of the position table); longer inputs raise `ValueError`.
        position_embedding_type (`str`, *optional*, defaults to `"absolute"`):
            Encoder positions: `"absolute"` (BERT's learned table, one trained row per position; what BERT/RoBERTa
            checkpoints convert to), `"sinusoidal"` (the fixed sine/cosine table of Vaswani et al., 2017, as in
            the Long Range Arena encoders: no parameters, so positions that few training inputs reach are still
            well defined, and an offset between two tokens reads the same at every position) or `"rotary"` (RoPE,
            Su et al., 2021: every encoder self-attention rotates its queries and keys by position, base 10,000,
            so a logit depends on the offset between the two tokens; nothing is added to the embeddings, and
            explicit `position_ids` other than `0 .. N - 1` are refused). Smart Bird's sketch follows the encoder's
            choice; the seq2seq decoder keeps learned positions.
        type_vocab_size (`int`, *optional*, defaults to 2):
            Number of token types (segments) of the encoder.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal weight initialisation.
        layer_norm_eps (`float`, *optional*, defaults to 1e-12):
            Epsilon of every LayerNorm.
        pre_norm (`bool`, *optional*, defaults to `False`):
            Pre-norm blocks (LayerNorm before each sub-layer, plus a final LayerNorm) instead of BERT's post-norm.
        classifier_pooling (`str`, *optional*, defaults to `"cls"`):
            How the classification head pools the sequence: `"cls"` (first token, BERT's; the dense family's
            default), `"mean"` (over real tokens; the sparse families' default) or `"attention"` (learned additive
            attention pooling).
        classifier_dropout (`float`, *optional*):
            Dropout before the classifier; defaults to `hidden_dropout_prob`.
        num_global_tokens (`int`, *optional*, defaults to 0):
            Global positions of a sparse encoder self-attention (BigBird's ITC, Longformer's global attention): the
            first `num_global_tokens` tokens (the classification token first) attend to every real token and every
            token attends to them, in the same softmax as the method's own keys (FSAT: see its `global_key_softmax`),
            at O(N * g) cost. Sparse families default to 1; the dense family ignores it (every pair is already
            attended). 0 is the papers' attention.
        attention_backend (`str`, *optional*, defaults to `"fast"`):
            `"fast"` runs a method's optimised kernels (Triton on CUDA when `triton` is installed, the torch CSR /
            SDPA paths otherwise), `"reference"` the plain implementation over the same sparsity structure, on the
            same weights (use it to check a checkpoint), `"triton"` the Triton kernels (CUDA; on CPU only under
            `TRITON_INTERPRET=1`, for tests). See `attnzoo.kernels.dispatch`.
        aux_loss_coef (`float`, *optional*, defaults to 1.0):
            Weight of the attention auxiliary loss (e.g. SBM's density regulariser) added to the task loss.
        decoder_layers (`int`, *optional*, defaults to 2):
            Number of decoder layers of `<Prefix>ForConditionalGeneration`.
        decoder_max_position_embeddings (`int`, *optional*, defaults to 1024):
            Longest decoder (target) sequence.
        pad_token_id (`int`, *optional*, defaults to 0):
            Padding token id.
        bos_token_id (`int`, *optional*, defaults to 2):
            Beginning-of-sequence token id (`[CLS]` of the zoo's WordPiece tokenizers).
        eos_token_id (`int`, *optional*, defaults to 3):
            End-of-sequence token id (`[SEP]`).
        decoder_start_token_id (`int`, *optional*, defaults to 2):
            First decoder input token of seq2seq models.
        lm_head_transform (`bool`, *optional*, defaults to `False`):
            Seq2seq models only: apply BERT's masked-LM transform (`dense -> act -> LayerNorm`) before the tied output
            embedding and add an output bias, as the decoder of a BERT2BERT warm start does (Rothe et al., 2020),
            so that the decoder's hidden states reach the vocabulary the way the source checkpoint was trained to;
            `convert_checkpoint.py --seq2seq` sets it. `False` is a plain tied projection (BART's). The masked-LM
            head always has the transform.
        copy_from_source (`bool`, *optional*, defaults to `False`):
            Seq2seq models only: a pointer-generator output (See et al., 2017; `attnzoo.core.copy_head`): each
            decoding step mixes the vocabulary distribution with one attention over the source's tokens, through a
            learned gate, so that a summary can state the source's figures and names by pointing at them (the
            position after the token just written gets a learned bonus: a figure is several consecutive tokens). The
            model's `logits` are then the mixture's log-probabilities. `False` is the plain LM head.
        tie_word_embeddings (`bool`, *optional*, defaults to `True`):
            Tie LM heads and decoder embeddings to the encoder's token embeddings.
        use_cache (`bool`, *optional*, defaults to `True`):
            Use the key/value cache when decoding.
        is_decoder (`bool`, *optional*, defaults to `False`):
            Kept for HF compatibility; attnzoo decoders are built by `<Prefix>ForConditionalGeneration`.
    """

    model_type = "attnzoo"
    # A method switches these on when its attention is used in the decoder (causal) or in cross-attention; the model
    # checks them against the attention class's capability flags.
    method_sites: ClassVar[tuple[str, ...]] = ("encoder",)

    vocab_size: int = 30522
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 4096
    position_embedding_type: str = "absolute"
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pre_norm: bool = False
    classifier_pooling: str = "cls"
    classifier_dropout: float | int | None = None
    num_global_tokens: int = 0
    attention_backend: str = "fast"
    aux_loss_coef: float | int = 1.0
    decoder_layers: int = 2
    decoder_max_position_embeddings: int = 1024
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 3
    decoder_start_token_id: int | None = 2
    lm_head_transform: bool = False
    copy_from_source: bool = False
    tie_word_embeddings: bool = True
    use_cache: bool = True
    is_decoder: bool = False

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_zoo_fields()

    #: Fields added after checkpoints were already saved, with the value those checkpoints were trained with. A saved
    #: config (it records `transformers_version`) that lacks one gets this value, not today's default: attnzoo 0.1
    #: had no global tokens (the sparse families now default to 1). Families extend the mapping.
    values_before_the_field: ClassVar[dict[str, Any]] = {"num_global_tokens": 0}

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        """[`~transformers.PreTrainedConfig.from_dict`], keeping checkpoints saved before a field existed as they were
        trained (`values_before_the_field`); a hand-written dict gets the defaults."""
        if "transformers_version" in config_dict:
            missing = {k: v for k, v in cls.values_before_the_field.items() if k not in config_dict}
            config_dict = {**config_dict, **missing}
        return super().from_dict(config_dict, **kwargs)

    def validate_zoo_fields(self) -> None:
        """Strict-dataclass validator: re-checked whenever the config is saved."""
        self.check_zoo_fields()

    def check_zoo_fields(self) -> None:
        """Raise `ValueError` naming the offending field. Method configs extend this (call `super()`)."""
        positive = (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
            "decoder_layers",
            "decoder_max_position_embeddings",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)}.")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1), got {getattr(self, name)}.")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(f"`classifier_dropout` must be in [0, 1) or None, got {self.classifier_dropout}.")
        if self.num_global_tokens < 0:
            raise ValueError(f"`num_global_tokens` must be >= 0, got {self.num_global_tokens}.")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"`position_embedding_type` must be one of {POSITION_EMBEDDING_TYPES}, got "
                f"{self.position_embedding_type!r}."
            )
        if self.position_embedding_type == "sinusoidal" and self.hidden_size % 2:
            raise ValueError(
                f"`position_embedding_type='sinusoidal'` needs an even `hidden_size`, got {self.hidden_size}."
            )
        if self.position_embedding_type == "rotary" and (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                "`position_embedding_type='rotary'` turns pairs of coordinates and needs an even head size "
                f"(`hidden_size / num_attention_heads`), got {self.hidden_size // self.num_attention_heads}."
            )
        if self.classifier_pooling not in POOLING_TYPES:
            raise ValueError(f"`classifier_pooling` must be one of {POOLING_TYPES}, got {self.classifier_pooling!r}.")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"`attention_backend` must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}."
            )
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"`hidden_act` {self.hidden_act!r} is not a known activation (see ACT2FN).")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"`layer_norm_eps` must be positive, got {self.layer_norm_eps}.")
        for name in ("pad_token_id", "bos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"`{name}` ({value}) must be a token id in [0, vocab_size={self.vocab_size}).")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@strict
class SparseZooConfig(ZooConfig):
    r"""
    Base configuration of the five sparse families: [`ZooConfig`] with the defaults that let a sparse encoder read
    a long input (measured on IMDB at 2,048 tokens; the long-inputs study). Method configs subclass it and
    add their own fields; every field of [`ZooConfig`] applies.

    Args:
        num_global_tokens (`int`, *optional*, defaults to 1):
            Global positions (the classification token): they attend to every real token and every token attends
            to them, besides the method's own keys (see [`ZooConfig`]). 0 is the paper's attention alone, with
            which a first-token classifier cannot read a long input.
        classifier_pooling (`str`, *optional*, defaults to `"mean"`):
            Pooling of the classification head (see [`ZooConfig`]). The mean over real tokens reads every row of the
            last layer; with `"cls"` only the global first row would be read, and the last layer's method
            parameters (which shape the other rows) would never be trained.
    """

    num_global_tokens: int = 1
    classifier_pooling: str = "mean"

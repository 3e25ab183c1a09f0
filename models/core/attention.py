"""The attention contract every attnzoo method implements, and the dense attention of the baseline family.

Every attention module takes the same inputs and returns an :class:`AttentionOutput`. Capability flags on the class
tell the model, the config checks, the tests and the benchmark what a method can do; nothing dispatches on names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache, EncoderDecoderCache

from ..kernels import dense_attention, dense_masked_attention
from ..kernels.hashing import draw_seed
from .attention_interface import implementation_of, interface_attention, takes_causal_flag
from .configuration import ZooConfig
from .global_tokens import global_count, global_query_rows, splice_rows
from .masking import attention_bool_mask
from .positions import apply_rotary


@dataclass
class AttentionOutput:
    """What an attention module returns.

    Args:
        hidden_states (`torch.Tensor` of shape `(batch, query_len, hidden_size)`):
            Attention output after the output projection.
        attn_weights (`torch.Tensor` of shape `(batch, heads, query_len, key_len)`, *optional*):
            Dense attention probabilities (zeros off the sparsity pattern), only when `output_attentions=True`.
        aux_loss (`torch.Tensor`, *optional*):
            Scalar auxiliary loss of this layer (e.g. a density regulariser), added to the task loss by the heads.
        density (`torch.Tensor` of shape `(batch, heads)`, *optional*):
            Fraction of each example's valid (query, key) pairs each head attended to (per example, so that an
            example's outputs never depend on the rest of its batch); `None` for dense attention.
        global_rows (`torch.Tensor` of shape `(batch, heads, g, head_dim)`, *optional*):
            Inside the attention module only: the global queries' rows, which replace the first `g` rows of the
            head-split `hidden_states` when the heads are merged ([`ZooAttention.finish`]).
        inputs (`tuple` of three `torch.Tensor` of shape `(batch, heads, len, head_dim)`, *optional*):
            Inside the attention module only: the queries, keys and values as the method laid them out for its
            kernel (head-split views of the copies the kernel keeps for backward). The global rows read these, so
            that the projections' own layout is not kept alive for backward next to the kernel's copies.
        global_rows_done (`bool`, defaults to `False`):
            Inside the attention module only: the method's kernel already replaced the global queries' rows of
            `hidden_states` by their dense rows (`global_rows=` of the kernel layer's primitives), so
            [`ZooAttention.with_global_rows`] leaves them.
    """

    hidden_states: torch.Tensor
    attn_weights: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    density: torch.Tensor | None = None
    global_rows: torch.Tensor | None = None
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    global_rows_done: bool = False


class ZooAttention(nn.Module):
    """Base class of every attention: Q/K/V/O projections, head split/merge, KV cache handling.

    Subclasses implement :meth:`attend`, which receives projected, head-split tensors and the masks, and set the
    capability flags below. The projection names map to BERT's (`query`/`key`/`value`/`attention.output.dense`).

    Args:
        config ([`ZooConfig`]): model configuration.
        is_causal (`bool`): decoder self-attention (never attends to the future).
        is_cross_attention (`bool`): keys and values come from the encoder.
        layer_idx (`int`, *optional*): index of the layer, used for the KV cache.
    """

    #: can run as decoder self-attention (causal masking, incremental decoding with a KV cache)
    supports_causal: ClassVar[bool] = False
    #: can attend from decoder queries to encoder keys
    supports_cross_attention: ClassVar[bool] = False
    #: draws random structure in training (sampling); eval is deterministic given `config` seeds
    is_stochastic: ClassVar[bool] = False
    #: returns an auxiliary loss in training
    has_aux_loss: ClassVar[bool] = False
    #: the method needs the padded length to be a multiple of this (1 = any length)
    block_multiple: ClassVar[int] = 1
    #: computes through transformers' attention interface, so `attn_implementation` selects its kernel (dense
    #: attentions); a method's own sparse attention leaves it False and ignores the choice
    uses_attention_interface: ClassVar[bool] = False
    #: each query's attention weights sum to 1 (or 0 for a row without keys); False when the method rescales the
    #: normalised probabilities (FSAT's confidences), so rows sum to at most `max_row_weight` in eval
    weights_are_normalized: ClassVar[bool] = True
    #: adds `config.num_global_tokens` global positions to its encoder self-attention (see `core.global_tokens`);
    #: dense attention needs none (every position already sees every other)
    supports_global_tokens: ClassVar[bool] = False
    #: parameters (names inside the module) that a converted BERT / RoBERTa checkpoint does not initialise, each with
    #: the reason; `init_for_warm_start` sets them instead (see `attnzoo.conversion`). The projections of a method
    #: whose queries, keys and values read the hidden states, as BERT's do, are all carried over (empty).
    not_from_source: ClassVar[dict[str, str]] = {}

    def __init__(
        self, config: ZooConfig, *, is_causal: bool = False, is_cross_attention: bool = False, layer_idx: int = 0
    ):
        super().__init__()
        if is_causal and not self.supports_causal:
            raise ValueError(f"{type(self).__name__} cannot be used as causal (decoder) self-attention.")
        if is_cross_attention and not self.supports_cross_attention:
            raise ValueError(f"{type(self).__name__} cannot be used as cross-attention.")
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_probs_dropout_prob
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        #: global positions (`config.num_global_tokens`) of an encoder self-attention that supports them, else 0
        self.num_global_tokens = (
            config.num_global_tokens if self.supports_global_tokens and not (is_causal or is_cross_attention) else 0
        )
        self.layer_idx = layer_idx
        #: rotates queries and keys by position (`position_embedding_type="rotary"`): encoder self-attention only,
        #: since the seq2seq decoder keeps its learned positions
        self.rotary = config.position_embedding_type == "rotary" and not (is_causal or is_cross_attention)
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def init_for_warm_start(self) -> None:
        """Initialise the `not_from_source` parameters of an encoder layer whose other weights come from a
        checkpoint; the conversion calls it after loading them (nothing to do when every parameter is carried)."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys `(B, H, N, d)` rotated by position when the layer uses rotary positions, else as given.

        Every kernel and the global-token rows then see the same rotated tensors, so the fast paths and their
        references stay comparable as they are."""
        if not self.rotary:
            return q, k
        return apply_rotary(q), apply_rotary(k)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # (B, N, D) -> (B, H, N, d)
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def project_qkv(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None,
        cache: Cache | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project queries, keys and values, reading/updating the KV cache. Returns `(B, H, N, d)` tensors."""
        q = self._split(self.q_proj(hidden_states))
        if self.is_cross_attention:
            if isinstance(cache, EncoderDecoderCache) and cache.is_updated.get(self.layer_idx):
                layer = cache.cross_attention_cache.layers[self.layer_idx]
                return q, layer.keys, layer.values
            k = self._split(self.k_proj(key_value_states))
            v = self._split(self.v_proj(key_value_states))
            if isinstance(cache, EncoderDecoderCache):
                k, v = cache.cross_attention_cache.update(k, v, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
            return q, k, v
        k = self._split(self.k_proj(hidden_states))
        v = self._split(self.v_proj(hidden_states))
        q, k = self.rotate(q, k)
        if cache is not None:
            self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
            k, v = self_cache.update(k, v, self.layer_idx)
        return q, k, v

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_valid: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
    ) -> AttentionOutput:
        """
        Args:
            hidden_states (`torch.Tensor` of shape `(B, Nq, D)`): query-side hidden states.
            key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): True at real (non-padding) keys over the
                whole key sequence (cache included). `None` means every key is real.
            key_value_states (`torch.Tensor` of shape `(B, Nk, D)`, *optional*): encoder states (cross-attention).
            cache ([`~transformers.Cache`], *optional*): KV cache (decoder only).
            output_attentions (`bool`): also return dense `(B, H, Nq, Nk)` attention probabilities.
        """
        q, k, v = self.project_qkv(hidden_states, key_value_states, cache)
        out = self.attend(
            q,
            k,
            v,
            key_valid,
            query_offset=self.query_offset(q, k, cache),
            output_attentions=output_attentions,
            **self.attend_inputs(hidden_states),
        )
        return self.finish(self.with_global_rows(out, q, k, v, key_valid), hidden_states)

    def finish(self, out: AttentionOutput, hidden_states: torch.Tensor) -> AttentionOutput:
        """Merge the heads of `out.hidden_states` `(B, H, Nq, d)`, with `out.global_rows` spliced in (see
        [`with_global_rows`]), and apply the output projection."""
        rows, out.global_rows = out.global_rows, None
        if rows is None:
            merged = out.hidden_states.transpose(1, 2).reshape(hidden_states.shape[0], hidden_states.shape[1], -1)
            out.hidden_states = self.o_proj(merged)
        elif torch.is_grad_enabled() and (out.hidden_states.requires_grad or rows.requires_grad):
            # The spliced tensor is what the output projection keeps for its backward: a second copy of the attention
            # output next to the one the attention kernel keeps. Recomputed in backward instead (one `cat`).
            out.hidden_states = checkpoint(
                self._splice_and_project, out.hidden_states, rows, use_reentrant=False, preserve_rng_state=False
            )  # no randomness inside: no RNG state to restore
        else:
            out.hidden_states = self._splice_and_project(out.hidden_states, rows)
        return out

    @staticmethod
    def head_split_output(out: AttentionOutput) -> torch.Tensor:
        """The head-split output `(B, H, Nq, d)` that [`finish`] merges: `out.hidden_states` with `out.global_rows`
        (if any) in its first rows."""
        if out.global_rows is None:
            return out.hidden_states
        return torch.cat([out.global_rows, out.hidden_states[:, :, out.global_rows.shape[2] :]], dim=2)

    def _splice_and_project(self, full: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`o_proj` of the merged heads of `full` `(B, H, N, d)` with its first `g` rows from `rows` `(B, H, g, d)`."""
        B, H, N, d = full.shape
        # One write in token-major layout (B, N, H, d), so that the heads merge as a view (a head-major splice would
        # be copied a second time to merge them).
        merged = torch.cat([rows.transpose(1, 2), full[:, :, rows.shape[2] :].transpose(1, 2)], dim=1)
        return self.o_proj(merged.view(B, N, H * d))

    @property
    def max_row_weight(self) -> float:
        """The largest sum of a query's attention weights in eval: one per softmax the query's keys are split into
        (1 for every method but FSAT with `global_key_softmax="own"`)."""
        return 1.0

    def global_positions(self, num_keys: int) -> int:
        """Number of global positions of this layer in a sequence of `num_keys` tokens."""
        return global_count(self.num_global_tokens, num_keys)

    def kernel_global_rows(self, num_queries: int, num_keys: int, query_offset: int) -> int:
        """How many global rows a method's kernel may compute itself (`global_rows=` of the kernel layer's
        primitives; then it sets `AttentionOutput.global_rows_done`): the rows [`with_global_rows`] would take from
        dense attention, in encoder self-attention (their dropout in training is the counter hash's, which the
        kernels regenerate); 0 where it must do them."""
        if self.is_causal or self.is_cross_attention or query_offset or num_queries != num_keys:
            return 0
        return self.global_positions(num_keys)

    def with_global_rows(
        self, out: AttentionOutput, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor | None
    ) -> AttentionOutput:
        """Replace the global queries' rows of the method's (head-split) output by dense attention over every key.

        The method itself adds the global keys to every query's key set (in `attend`, through `core.global_tokens`).
        The rows come from [`~attnzoo.kernels.dense_attention`] (SDPA off the reference backend: one op and its
        backward, no materialised fp32 softmax, attention dropout in the same kernel on CUDA) and are spliced in when
        the heads merge ([`finish`]). With returned weights, or attention dropout in training on the reference backend
        (the counter hash's mask that the kernels computing these rows themselves regenerate,
        `kernels.dense.global_rows_keep`), the materialised rows are spliced here instead (returned weights off the
        reference backend take `F.dropout`'s mask). They read `out.inputs` in place of `q`, `k`, `v` when the
        method set it.
        """
        if out.inputs is not None:
            q, k, v = out.inputs  # the same values, in the layout the method's kernel keeps
            out.inputs = None
        g = self.global_positions(k.shape[2])
        if g == 0 or out.global_rows_done:
            return out
        # On the reference backend the rows' dropout is the kernels' truth: the counter hash of a seed.
        hashed = self.training and self.dropout > 0.0 and self.config.attention_backend == "reference"
        if out.attn_weights is None and not hashed:
            mask = None if key_valid is None else key_valid[:, None, None, :]  # (B, 1, 1, N)
            rows = dense_attention(
                q[:, :, :g], k, v, mask, scale=self.scaling, dropout_p=self.dropout, training=self.training,
                backend=self.config.attention_backend,
            )  # fmt: skip
            head = rows.to(out.hidden_states.dtype)  # (B, H, g, d)
            if key_valid is not None:
                # A global position that is padding is no global query: its row stays the method's.
                head = torch.where(key_valid[:, None, :g, None], head, out.hidden_states[:, :, :g])
            out.global_rows = head
            return out
        rows, weights = global_query_rows(
            q,
            k,
            v,
            key_valid,
            g,
            scale=self.scaling,
            dropout_p=self.dropout,
            training=self.training,
            return_weights=out.attn_weights is not None,
            seed=draw_seed(q.device) if hashed else None,
        )
        if out.attn_weights is None:
            out.hidden_states = splice_rows(out.hidden_states, rows, key_valid)
            return out
        out.attn_weights = splice_rows(out.attn_weights, weights, key_valid)
        # The returned weights are the ones applied to the values, in the graph (as without global tokens).
        out.hidden_states = torch.matmul(out.attn_weights, v.to(out.attn_weights.dtype)).to(out.hidden_states.dtype)
        return out

    def query_offset(self, q: torch.Tensor, k: torch.Tensor, cache: Cache | None) -> int:
        """Position of the first query: queries of an incremental decoding step sit after the cached keys."""
        return k.shape[2] - q.shape[2] if self.is_causal else 0

    def attend_inputs(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor]:
        """Extra keyword inputs of :meth:`attend` computed from the query-side hidden states (none by default)."""
        return {}

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_valid: torch.Tensor | None,
        *,
        query_offset: int = 0,
        output_attentions: bool = False,
    ) -> AttentionOutput:
        """Attention over head-split tensors `(B, H, N, d)`; returns head-split `hidden_states` `(B, H, Nq, d)`."""
        raise NotImplementedError

    def dense_reference(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        output_attentions: bool = False,
    ) -> AttentionOutput:
        """Plain dense masked attention (the reference path every method shares)."""
        out, weights = dense_masked_attention(
            q,
            k,
            v,
            mask,
            dropout_p=self.dropout,
            scale=self.scaling,
            training=self.training,
            return_weights=output_attentions,
        )
        return AttentionOutput(hidden_states=out, attn_weights=weights)


class DenseAttention(ZooAttention):
    """Full softmax attention (the baseline of every comparison) through transformers' attention interface.

    The kernel is the one `config._attn_implementation` selects (`attn_implementation="eager" | "sdpa" |
    "flex_attention" | "flash_attention_2"`, see [`~attnzoo.core.attention_interface.interface_attention`]), as in
    BERT and BART. Works as encoder self-attention, causal decoder self-attention with KV cache, and
    cross-attention. With `output_attentions=True` (or `attention_backend="reference"`) it runs the reference kernel,
    whatever the implementation, to return the probabilities.
    """

    supports_causal = True
    supports_cross_attention = True
    uses_attention_interface = True

    def attend(self, q, k, v, key_valid, *, query_offset=0, output_attentions=False):
        reference = output_attentions or self.config.attention_backend == "reference"
        # A kernel without a causal flag (the reference one, eager, flex, registered ones) reads causality from the
        # mask, also without padding.
        causal_flag = not reference and takes_causal_flag(implementation_of(self))
        mask = attention_bool_mask(
            key_valid, q.shape[2], k.shape[2], self.is_causal, query_offset, q.device, kernel_is_causal=causal_flag
        )
        if reference:
            return self.dense_reference(q, k, v, mask, output_attentions)
        return AttentionOutput(hidden_states=interface_attention(self, q, k, v, key_valid, mask))

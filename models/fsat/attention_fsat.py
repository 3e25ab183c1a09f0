"""FSAT attention: FFT-pooled hidden-state cross, predicted dominant indices and confidence-weighted edge attention.

Per layer (reconstruction of the garbled paper formulas, see `model_cards/fsat.md`):

1. `F1 = f1(X)`, `F2 = f2(X)` (zeroed at padded positions), `C0_k = sum_{i+j=k} F1_i * F2_j` by FFT (fp32; fp64
   for fp64 inputs; `pooling.py`: transforms of length N on the even/odd token split, only `F1` and `F2` saved
   for the backward).
2. Central-token merge: `C_t = LN(C0_{2t} + C0_{2t+1} - F1_t * F2_t)` (`C0_{2N-1}` is an empty antidiagonal = 0).
3. `Q = X W_Q`, `K = C W_K`, `V = C W_V`.
4. Selection: `I_bar = sigmoid(C W_I + b_I) * L` predicts, for every key `j`, `M` query positions (with
   `index_prior="key_position"`, ours and the default, `logit((j + 0.5) / L)` is added inside the sigmoid so that
   untrained keys predict queries around themselves); the edges are `(floor(I_bar_jm) -> j)`, plus in training
   uniformly drawn queries per key. Where the attention backend resolves to Triton, the prediction and the selection
   are one kernel each way (`attnzoo.kernels.triton.fsat_index`; `predict_indices` and `select_slots` are its
   reference).
5. Compute: segment softmax over each query's edges, times the Gaussian confidence `rho(i | I_bar, sigma^2)` (no
   renormalisation), through the kernel layer's key-slot attention (`attnzoo.kernels.key_slot_attention`): the edges
   stay in fixed slots per key, `-1` where dropped, so that selecting them needs no host sync. The confidence
   gradient can be truncated to `(-inf, 0]`. The training-only exploration edges of a query have a softmax of their
   own (ours, see `sparse_attend`). The global queries' dense rows come from the same call (`global_rows=True`):
   the Triton kernels compute them in programs of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from ..core.attention import AttentionOutput, ZooAttention
from ..core.global_tokens import global_edges
from ..core.masking import attention_bool_mask
from ..kernels import dense_attention, key_slot_attention
from ..kernels.constants import cached_constant, scalar
from ..kernels.dispatch import fsat_index_slots
from ..kernels.key_slots import (
    gaussian_confidence,
    key_slot_edges,
    real_positions_first,
    truncate_positive_gradient,
)
from .configuration_fsat import FSATConfig
from .feature_maps import mlp_feature_maps
from .pooling import antidiagonal_sums, central_token_merge, pooled_cross_stacked
from .recompute import linear_of_recomputed

__all__ = [
    "FSATAttention",
    "FSATEdges",
    "FeatureMap",
    "KeySlots",
    "antidiagonal_sums",
    "central_token_merge",
    "gaussian_confidence",
    "truncate_positive_gradient",
]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _position_prior(length: int, scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    """`logit((j + 0.5) / scale)` `(1 or B, 1, N, 1)` fp32: the `"key_position"` prior of key `j`'s predictions."""
    centre = torch.arange(0.5, length, device=device, dtype=torch.float32).view(1, 1, length, 1) / scale
    return torch.logit(centre, eps=torch.finfo(torch.float32).eps)


#: The prior at a fixed scale (no padding, or `index_scale="max_length"`): one per (length, scale, device).
_cached_position_prior = cached_constant(_position_prior)


class FeatureMap(nn.Module):
    """One of FSAT's parameterised feature maps `f1`, `f2` (D -> D).

    `"mlp"`: `W2 act(W1 x + b1) + b2`. `"dsconv"`: depth-wise Conv1d over the sequence, activation, point-wise
    Linear. Inputs are zeroed at padded positions first, so a convolution never reads padding. The layer runs its two
    `"mlp"` maps together ([`FSATAttention.feature_maps`]); this `forward` is their reference and the `"dsconv"` path.
    """

    def __init__(self, config: FSATConfig):
        super().__init__()
        width = config.hidden_size
        if config.feature_map == "mlp":
            self.conv = None
            self.inner = nn.Linear(width, width)
        else:
            self.conv = nn.Conv1d(
                width, width, config.feature_map_kernel_size, padding=config.feature_map_kernel_size // 2, groups=width
            )
            self.inner = None
        self.act = ACT2FN[config.feature_map_act]
        self.outer = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        # Without padding (`valid=None`) the masking multiplications and their saved activations are skipped.
        mask = None if valid is None else valid[..., None].to(x.dtype)  # (B, N, 1)
        if mask is not None:
            x = x * mask
        h = self.inner(x) if self.conv is None else self.conv(x.transpose(1, 2)).transpose(1, 2)
        # The activation saves h: the outer projection's input is recomputed from it rather than saved too.
        out = linear_of_recomputed(h, self.act, self.outer)
        return out if mask is None else out * mask


@dataclass
class FSATEdges:
    """Selected structure of one layer: edges over the flattened `(B*H*N)` rows and their confidences.

    Args:
        rows (`torch.LongTensor` of shape `(E,)`): flat query row `(b*H + h)*N + i` of each edge.
        cols (`torch.LongTensor` of shape `(E,)`): flat key row `(b*H + h)*N + j`.
        query_index (`torch.Tensor` of shape `(E,)`): integer query position `i` as fp32 (constant).
        mean (`torch.Tensor` of shape `(E,)`): the prediction `I_bar` the edge's confidence is centred on.
        predicted (`torch.BoolTensor` of shape `(E,)`): True for predicted edges, False for random and global ones.
        explore (`torch.BoolTensor` of shape `(E,)`): True for the random (training-only exploration) edges.
        fixed (`torch.BoolTensor` of shape `(E,)`): True for the edges to the global keys.
    """

    rows: torch.Tensor
    cols: torch.Tensor
    query_index: torch.Tensor
    mean: torch.Tensor
    predicted: torch.Tensor
    explore: torch.Tensor
    fixed: torch.Tensor


@dataclass
class KeySlots:
    """Selected structure of one layer in fixed slots per key (static shapes, no host sync).

    Args:
        query (`torch.IntTensor` of shape `(B, H, N, S)`): query position `i` of slot `s` of key `j`, -1 where the
            slot is dropped (query out of range or padding, padded key). The first `M` slots are the predicted ones,
            the other `R` (training only) the random ones.
        mean (`torch.Tensor` of shape `(B, H, N, S)`): the prediction `I_bar` each slot's confidence is centred on
            (a random slot takes the prediction of slot `r mod M`).
    """

    query: torch.Tensor
    mean: torch.Tensor


class FSATAttention(ZooAttention):
    """FSAT encoder self-attention (see the module docstring for the computation).

    Keys and values are projected from the pooled cross `C`, not from the hidden states, so this class overrides
    `forward` instead of `attend`. The edges go through [`~attnzoo.kernels.key_slot_attention`], whose implementation
    `attention_backend` picks (reference, CPU CSR path or Triton); `output_attentions=True` computes the same edges
    with dense masked attention to return the weights. `use_sparse=False` is the dense "FAT" ablation.

    Args:
        config ([`FSATConfig`]): model configuration.
        is_causal (`bool`): must be False (FSAT cannot be causal).
        is_cross_attention (`bool`): must be False.
        layer_idx (`int`, *optional*): index of the layer.
    """

    supports_causal = False
    supports_cross_attention = False
    is_stochastic = True
    has_aux_loss = False
    block_multiple = 1
    # Confidences multiply the softmax probabilities without renormalisation (the paper's Formula 7).
    weights_are_normalized = False
    supports_global_tokens = True
    # Warm starts: keys and values project the pooled cross `C`, which a BERT checkpoint's W_K / W_V never read
    # (`C_t` leaves out the pair (t, t), so no f1 / f2 makes it a function of `x_t`). Carried over, they would map
    # an input they never saw into the residual stream of every layer; they start fresh instead, and the output
    # projection at zero, so that each converted layer starts as the source's feed-forward path on the source's
    # hidden states and the attention branch grows from there (numbers: scripts/experiments/warm-start/).
    not_from_source = {
        **dict.fromkeys(
            ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"),
            "FSAT's keys and values project its pooled cross C, not the hidden states the source's were trained on",
        ),
        "o_proj.weight": "zero at a warm start, so FSAT's attention branch (whose keys and values start fresh) "
        "adds nothing to the carried layers until it has learnt something",
    }

    def __init__(
        self, config: FSATConfig, *, is_causal: bool = False, is_cross_attention: bool = False, layer_idx: int = 0
    ):
        super().__init__(config, is_causal=is_causal, is_cross_attention=is_cross_attention, layer_idx=layer_idx)
        self.feature_map_1 = FeatureMap(config)
        self.feature_map_2 = FeatureMap(config)
        self.cross_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.num_predicted = config.num_dominant_indices
        self.num_random = config.num_random_indices
        predictor_heads = 1 if config.shared_index_predictor else self.num_heads
        self.index_predictor = nn.Linear(config.hidden_size, predictor_heads * self.num_predicted)
        self.variance = config.fsat_confidence_variance

    @torch.no_grad()
    def init_for_warm_start(self) -> None:
        # Fresh keys and values as any new projection (normal, zero bias); the branch's output starts at zero.
        for projection in (self.k_proj, self.v_proj):
            nn.init.normal_(projection.weight, std=self.config.initializer_range)
            nn.init.zeros_(projection.bias)
        nn.init.zeros_(self.o_proj.weight)

    def pooled_cross(self, hidden_states: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The hidden-state cross `C` `(B, N, D)`: FFT antidiagonal pooling, central-token merge and LayerNorm.

        `valid` `(B, N)` marks real tokens (`None`: all real). Rows without any real pair are exact zeros before the
        LayerNorm (`pooling.rows_with_pairs`). Every attention backend pools with the Function that saves only the
        feature maps (`pooling.pooled_cross_stacked`: the method's own computation, not an attention kernel; tested
        against the plain-autograd FFT, whose fp32 round-off is about half of its 4e-7).
        """
        merged = pooled_cross_stacked(
            self.feature_maps(hidden_states, valid), valid, out_dtype=hidden_states.dtype,
            backend=self.config.attention_backend,
        )  # fmt: skip
        return self.cross_norm(merged)

    def feature_maps(self, hidden_states: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """`f1` and `f2` of the hidden states, stacked `(2, B, N, D)`, zero at padded positions (`valid`).

        The `"mlp"` maps run as one autograd Function ([`~attnzoo.fsat.feature_maps.mlp_feature_maps`]: one
        activation for both, their gradients by batched GEMMs, one input gradient; equal to the two modules'
        `forward`, tested), the `"dsconv"` ones module by module.
        """
        first, second = self.feature_map_1, self.feature_map_2
        if first.conv is not None:
            return torch.stack((first(hidden_states, valid), second(hidden_states, valid)))
        mask = None if valid is None else valid[..., None].to(hidden_states.dtype)  # (B, N, 1)
        x = hidden_states if mask is None else hidden_states * mask
        features = mlp_feature_maps(x, first, second, first.act)
        return features if mask is None else features * mask

    def predict_indices(self, cross: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """Continuous predicted query positions `I_bar` `(B, H, N, M)` in fp32, in `(0, L)`.

        `lengths` `(B,)` holds the real tokens per example (`None`: all `N` are real).
        """
        B, N, _ = cross.shape
        # fp32 even under autocast: a bf16 logit would move a prediction of scale L by ~L/256 positions.
        with torch.autocast(device_type=cross.device.type, enabled=False):
            # The keys' and values' projections save the cross: its fp32 copy is recomputed, not saved.
            logits = linear_of_recomputed(cross, _identity, self.index_predictor, compute_dtype=torch.float32)
            logits = logits.view(B, N, -1, self.num_predicted).transpose(1, 2)
        scale, prior = self.index_scale_and_prior(N, lengths, cross.device)
        if prior is not None:
            logits = logits + prior  # (B, H', N, M)
        mean = torch.sigmoid(logits).expand(B, self.num_heads, N, self.num_predicted)  # (B, H, N, M)
        if torch.is_grad_enabled():
            return mean * scale
        # Without autograd the product is written in the (b, h, j, m) order the kernels read: no copy to lay it out.
        return torch.mul(mean, scale, out=torch.empty(mean.shape, dtype=mean.dtype, device=mean.device))

    def index_scale_and_prior(
        self, length: int, lengths: torch.Tensor | None, device: torch.device
    ) -> tuple[float | torch.Tensor, torch.Tensor | None]:
        """The predictions' range `L` (a number, or `(B, 1, 1, 1)` fp32 per example) and the fp32 logit prior
        `(1 or B, 1, N, 1)` added to key `j`'s predictions (None with `index_prior="none"`)."""
        if self.config.index_scale == "max_length":
            scale = float(self.config.fsat_index_length)
        elif lengths is None:
            scale = float(length)
        else:
            scale = lengths.to(torch.float32).view(-1, 1, 1, 1)
        if self.config.index_prior != "key_position":
            return scale, None
        # Centre key j's predictions on j itself: sigmoid(logit(p)) * L = p * L = j + 0.5 when the learnt part is
        # zero. Keys past the scale (padding, or beyond L_max) are clamped; their edges are dropped anyway.
        prior = _position_prior if isinstance(scale, torch.Tensor) else _cached_position_prior
        return scale, prior(length, scale, device)

    def select_slots(self, mean: torch.Tensor, valid: torch.Tensor | None) -> KeySlots:
        """Key-centric edges in fixed slots: predicted queries `floor(I_bar)` and, in training, random real queries
        per key.

        Edges whose key is padding or whose query falls outside the real tokens are dropped (-1), not clamped
        (clamping would pile edges on the last token). The global keys keep their slots here; the attention ignores
        them, as every query reads those keys anyway. Random queries are drawn from the global torch RNG (replayed
        by gradient checkpointing) uniformly over each sample's real positions, so they never depend on padding.

        Args:
            mean (`torch.Tensor` of shape `(B, H, N, M)`): the predictions.
            valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real tokens (`None`: all real).
        """
        B, H, N, M = mean.shape
        explore = self.training and self.num_random > 0
        if not explore:
            # The predictor's heads come out of one linear as (B, N, H, M), and the kernels read the slots by their
            # flat (b, h, j, s) position: lay them out in that order (in training, appending the random slots does).
            mean = mean.contiguous()
        predicted = mean.detach()  # (B, H, N, M); >= 0, so the cast to int32 below is the floor
        # -1 (dropped) out of range, and for NaN, which fails the comparison.
        index = torch.where(predicted < N, predicted, scalar(-1.0, torch.float32, mean.device)).to(torch.int32)
        slot_mean = mean
        if explore:
            R = self.num_random
            u = torch.rand(B, H, N, R, device=mean.device)
            if valid is None:
                random_index = (u * N).to(torch.int32).clamp(max=N - 1)
            else:
                lengths = valid.sum(-1)  # (B,)
                real_positions = real_positions_first(valid)  # (B, N)
                rank = (u * lengths.view(B, 1, 1, 1)).long().clamp(max=N - 1)
                random_index = real_positions.gather(1, rank.view(B, -1)).view(B, H, N, R).to(torch.int32)
            index = torch.cat([index, random_index], dim=-1)  # (B, H, N, M + R)
            # Random slot r is centred on prediction r mod M.
            paired_mean = mean.repeat(1, 1, 1, -(-R // M))[..., :R] if R > M else mean[..., :R]
            slot_mean = torch.cat([mean, paired_mean], dim=-1)
        if valid is not None:
            query_real = valid.gather(1, index.clamp(min=0).reshape(B, -1).long()).view(index.shape)
            index = torch.where(query_real & valid.view(B, 1, N, 1), index, -1)
        return KeySlots(query=index, mean=slot_mean)

    def select_edges(self, mean: torch.Tensor, valid: torch.Tensor | None) -> FSATEdges:
        """The live slots of [`select_slots`] as a flat edge list (global keys' own predictions included).

        A compaction, so a host sync on an accelerator: the dense reference of `output_attentions` uses it, the
        attention itself reads the slots.
        """
        slots = self.select_slots(mean, valid)
        live, rows, cols, slot = key_slot_edges(slots.query)
        predicted = slot < self.num_predicted
        return FSATEdges(
            rows=rows,
            cols=cols,
            query_index=slots.query[live].to(torch.float32),
            mean=slots.mean[live],
            predicted=predicted,
            explore=~predicted,
            fixed=torch.zeros_like(predicted),
        )

    def add_global_edges(
        self, edges: FSATEdges, conf: torch.Tensor, valid: torch.Tensor, g: int
    ) -> tuple[FSATEdges, torch.Tensor]:
        """Every real query also attends to the `g` global keys, with confidence 1 (a fixed edge, not a prediction);
        the predicted and random edges of a global key are dropped, so that each of its pairs enters the softmax once.
        """
        B, N = valid.shape
        own = (edges.cols % N) >= g
        rows, cols = global_edges(B, self.num_heads, N, N, valid, valid, g, valid.device)
        no = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
        merged = FSATEdges(
            rows=torch.cat([edges.rows[own], rows]),
            cols=torch.cat([edges.cols[own], cols]),
            query_index=torch.cat([edges.query_index[own], (rows % N).to(torch.float32)]),
            mean=torch.cat([edges.mean[own], (rows % N).to(edges.mean.dtype)]),
            predicted=torch.cat([edges.predicted[own], no]),
            explore=torch.cat([edges.explore[own], no]),
            fixed=torch.cat([edges.fixed[own], ~no]),
        )
        return merged, torch.cat([conf[own], torch.ones(rows.shape, dtype=conf.dtype, device=conf.device)])

    @property
    def global_keys_apart(self) -> bool:
        """Whether the global keys have a softmax of their own (`global_key_softmax="own"` and any global token)."""
        return self.config.global_key_softmax == "own" and self.config.num_global_tokens > 0

    @property
    def max_row_weight(self) -> float:
        # The predicted edges' softmax (scaled by confidences <= 1), plus the global keys' own softmax.
        return 2.0 if self.global_keys_apart else 1.0

    def softmax_groups(self, edges: FSATEdges, g: int) -> list[torch.Tensor]:
        """Masks `(E,)` of the edges that share one softmax per query; a query's output is the sum over the groups.

        The graph (predicted edges, and the global keys with `global_key_softmax="shared"`) comes first, then the
        exploration edges in training, then the global keys with `global_key_softmax="own"`. `g` is the number of
        global keys whose edges `edges` holds (0 where they were taken out, as the fast path computes them apart).
        """
        apart = []
        if self.training and self.num_random > 0:
            apart.append(edges.explore)
        # Decided from the settings, not from the edges, so that no device sync is needed.
        if g and self.global_keys_apart:
            apart.append(edges.fixed)
        if not apart:
            return [torch.ones_like(edges.explore)]
        return [~torch.stack(apart).any(0), *apart]

    def confidences(self, edges: FSATEdges) -> torch.Tensor:
        """Gaussian confidence `s_e` `(E,)` of every edge, with the truncated gradient in training."""
        s = gaussian_confidence(edges.query_index, edges.mean, self.variance, self.config.confidence_normalized)
        if self.training and self.config.gradient_truncation:
            s = truncate_positive_gradient(s)
        return s

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_valid: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        cache=None,
        output_attentions: bool = False,
    ) -> AttentionOutput:
        """
        Args:
            hidden_states (`torch.Tensor` of shape `(B, N, D)`): encoder hidden states.
            key_valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): True at real tokens; `None` = all real.
            key_value_states, cache: must be `None` (FSAT is encoder self-attention only).
            output_attentions (`bool`): also return the dense `(B, H, N, N)` weights applied to the values
                (softmax probabilities times confidences; zeros off the edge set).
        """
        if key_value_states is not None or cache is not None:
            raise ValueError("FSATAttention is encoder self-attention only: no cross-attention and no KV cache.")
        cross = self.pooled_cross(hidden_states, key_valid)  # (B, N, D)
        q = self._split(self.q_proj(hidden_states))  # (B, H, N, d)
        k = self._split(self.k_proj(cross))
        v = self._split(self.v_proj(cross))
        q, k = self.rotate(q, k)  # rotary positions: key j is the pooled cross at position j
        if self.config.use_sparse:
            out = self.sparse_attend(q, k, v, cross, key_valid, output_attentions)
        else:
            out = self.dense_attend(q, k, v, key_valid, output_attentions)
        return self.finish(self.with_global_rows(out, q, k, v, key_valid), hidden_states)

    def dense_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_valid: torch.Tensor | None,
        output_attentions: bool,
    ) -> AttentionOutput:
        """The "FAT" ablation: every query attends to every real key of the pooled cross."""
        mask = attention_bool_mask(key_valid, q.shape[2], k.shape[2], False, 0, q.device)
        if output_attentions:
            return self.dense_reference(q, k, v, mask, output_attentions)
        out = dense_attention(
            q, k, v, mask, scale=self.scaling, dropout_p=self.dropout, training=self.training,
            backend=self.config.attention_backend,
        )  # fmt: skip
        return AttentionOutput(hidden_states=out)

    # A compiler boundary: the edge kernels' custom autograd Functions broke dynamo's automatic-dynamic shapes pass
    # (IndexError in torch 2.13), so under `torch.compile` this part runs eagerly (one graph break per layer) and the
    # rest of the model is compiled.
    @torch.compiler.disable
    def sparse_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cross: torch.Tensor,
        valid: torch.Tensor | None,
        output_attentions: bool,
    ) -> AttentionOutput:
        """FSAT proper: select the edges from `cross`, then attend along them (`valid` `(B, N)`: real tokens, `None`
        when all are real).

        The exploration edges of a query (training only) are normalised in a softmax of their own, added to the
        output of the graph's softmax (ours; the paper has one softmax over both). In one softmax they take
        probability from the predicted and global edges in training and give it back in eval: with a global key
        (confidence 1) and exploration edges of confidence ~0, a query's global share was ~1/(1 + its random edges)
        in training and 1 in eval, so the eval outputs were several times the trained ones (IMDB at 2048: train loss
        0.22, validation loss 1.01). Kept apart, the graph attends identically in training and eval, and every
        exploration edge still gets the confidence gradient `a_e * <dL/do_i, v_j>` that teaches `I_bar`.

        With `global_key_softmax="own"` the global keys get a softmax of their own too: every real query reads them
        at full weight, however many edges were predicted for it (in one softmax, its global share falls as its
        predicted edges grow; see the config).
        """
        B, H, N, _ = q.shape
        lengths = None if valid is None else valid.sum(-1)  # (B,)
        g = self.global_positions(N)
        fused = None
        if not output_attentions:  # (the weights' path runs the reference)
            fused = fsat_index_slots(self.config.attention_backend, cross.device, cross.dtype)
        if fused is not None:
            # The Triton path: prediction and selection in one kernel (the same values as the two methods below).
            scale, prior = self.index_scale_and_prior(N, lengths, cross.device)
            query, slot_mean = fused(
                cross, self.index_predictor.weight, self.index_predictor.bias, prior, scale, valid,
                self.num_heads, self.num_predicted, self.num_random if self.training else 0,
            )  # fmt: skip
            slots = KeySlots(query=query, mean=slot_mean)
        else:
            mean = self.predict_indices(cross, lengths)
            if output_attentions:
                return self.attend_with_weights(q, k, v, mean, valid, g)
            slots = self.select_slots(mean, valid)
        out, pairs = key_slot_attention(
            q,
            k,
            v,
            slots.query,
            slots.mean,
            num_graph_slots=self.num_predicted,
            variance=self.variance,
            normalized=self.config.confidence_normalized,
            truncate=self.training and self.config.gradient_truncation,
            num_global=g,
            global_softmax=self.config.global_key_softmax,
            key_valid=valid,
            scale=self.scaling,
            dropout_p=self.dropout,
            training=self.training,
            # The global queries' dense rows of `with_global_rows`, in the Triton kernels on the CUDA path.
            global_rows=True,
            backend=self.config.attention_backend,
        )
        # The fraction of each example's real (query, key) pairs joined by an edge, per head.
        density = pairs / (N * N) if lengths is None else pairs / (lengths.to(pairs.dtype) ** 2).clamp(min=1)[:, None]
        return AttentionOutput(hidden_states=out, density=density, global_rows_done=True)

    def attend_with_weights(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mean: torch.Tensor, valid: torch.Tensor | None, g: int
    ) -> AttentionOutput:
        """`output_attentions=True`: the same edges as a flat list, attended by dense masked attention
        ([`edge_reference`]) to return the `(B, H, N, N)` weights."""
        B, H, N, _ = q.shape
        valid = torch.ones(B, N, dtype=torch.bool, device=q.device) if valid is None else valid
        edges = self.select_edges(mean, valid)
        conf = self.confidences(edges)
        if g:
            edges, conf = self.add_global_edges(edges, conf, valid, g)
        density = self.edge_density(edges, valid.sum(-1), B, H, N)
        out, weights = self.edge_reference(q, k, v, edges, conf)
        return AttentionOutput(hidden_states=out, attn_weights=weights, density=density)

    def edge_reference(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, edges: FSATEdges, conf: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense masked attention over the same edges (reference path; materialises `(B, H, N, N)`).

        A (query, key) pair hit by `c` duplicate edges enters the softmax `c` times, as in the edge kernel: its
        logit gets `+ log c` and its probability is multiplied by the mean confidence of its edges. The exploration
        edges (and, with `global_key_softmax="own"`, the global keys) have a softmax of their own (see
        `sparse_attend`); the returned weights are the sum over the softmax groups.
        """
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * self.scaling  # (B, H, N, N)
        groups = self.softmax_groups(edges, self.global_positions(q.shape[2]))
        weights = sum(self._pair_weights(scores, edges, conf, use) for use in groups)
        weights = weights.to(q.dtype)
        if self.training and self.dropout > 0.0:
            weights = F.dropout(weights, p=self.dropout, training=True)
        return torch.matmul(weights, v), weights

    @staticmethod
    def _pair_weights(scores: torch.Tensor, edges: FSATEdges, conf: torch.Tensor, use: torch.Tensor) -> torch.Tensor:
        """Softmax of `scores` `(B, H, N, N)` over the pairs of the edges in `use`, times their mean confidence."""
        B, H, N, _ = scores.shape
        pair = (edges.rows * N + edges.cols % N)[use]  # flat (b, h, i, j)
        count = scores.new_zeros(B * H * N * N).index_add(0, pair, torch.ones_like(pair, dtype=scores.dtype))
        weight_sum = torch.zeros_like(count).index_add(0, pair, conf[use].float())
        count, weight_sum = count.view(B, H, N, N), weight_sum.view(B, H, N, N)
        mask = count > 0
        masked = (scores + count.clamp(min=1).log()).masked_fill(~mask, torch.finfo(torch.float32).min)
        probs = masked.softmax(dim=-1).masked_fill(~mask, 0.0)
        return probs * weight_sum / count.clamp(min=1)

    @staticmethod
    def edge_density(edges: FSATEdges, lengths: torch.Tensor, batch: int, num_heads: int, length: int) -> torch.Tensor:
        """Fraction `(B, H)` of each example's real (query, key) pairs joined by at least one edge, per head."""
        with torch.no_grad():
            pairs = torch.unique(edges.rows * length + edges.cols % length)
            owner = pairs // (length * length)  # flat (b, h) of each distinct pair
            per_head = torch.bincount(owner, minlength=batch * num_heads).to(torch.float32).view(batch, num_heads)
            return per_head / (lengths.to(torch.float32) ** 2).clamp(min=1.0)[:, None]

"""FSAT attention: FFT-pooled hidden-state cross, predicted dominant indices and confidence-weighted edge attention.

Per layer (reconstruction of the garbled paper formulas, see `model_cards/fsat.md`):

1. `F1 = f1(X)`, `F2 = f2(X)` (zeroed at padded positions), `C0_k = sum_{i+j=k} F1_i * F2_j` by FFT (fp32; fp64
   for fp64 inputs).
2. Central-token merge: `C_t = LN(C0_{2t} + C0_{2t+1} - F1_t * F2_t)` (`C0_{2N-1}` is an empty antidiagonal = 0).
3. `Q = X W_Q`, `K = C W_K`, `V = C W_V`.
4. Selection: `I_bar = sigmoid(C W_I + b_I) * L` predicts, for every key `j`, `M` query positions (with
   `index_prior="key_position"`, ours and the default, `logit((j + 0.5) / L)` is added inside the sigmoid so that
   untrained keys predict queries around themselves); the edges are `(floor(I_bar_jm) -> j)`, plus in training
   uniformly drawn queries per key.
5. Compute: segment softmax over each query's edges, times the Gaussian confidence `rho(i | I_bar, sigma^2)` (no
   renormalisation), through the shared edge-list kernel. The confidence gradient can be truncated to `(-inf, 0]`.
   The training-only exploration edges of a query have a softmax of their own (ours, see `sparse_attend`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from ..core.attention import AttentionOutput, ZooAttention
from ..core.global_tokens import global_edges
from ..core.masking import attention_bool_mask
from ..kernels import dense_attention, dense_masked_attention, edge_attention, flatten_heads, unflatten_heads
from .configuration_fsat import FSATConfig


class _TruncatePositiveGradient(torch.autograd.Function):
    """Identity forward; the backward keeps only the non-positive part of the incoming gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.clamp(max=0.0)


def truncate_positive_gradient(x: torch.Tensor) -> torch.Tensor:
    """FSAT's gradient truncation: identity, but `dL/dx` is clipped to `(-inf, 0]` on the way back.

    A negative gradient on a confidence means "this edge helped": the predicted position moves towards it. Positive
    gradients would push the prediction around without pointing at a better query, so they are dropped.
    """
    return _TruncatePositiveGradient.apply(x)


def gaussian_confidence(index: torch.Tensor, mean: torch.Tensor, variance: float, normalized: bool) -> torch.Tensor:
    """`rho(index | mean, variance)`: Gaussian density of the (constant) integer index around the prediction.

    The index is a constant of the density, so the gradient reaches only `mean` (the reparameterisation of the
    discrete choice): `d rho / d mean = rho * (index - mean) / variance`.
    """
    out = torch.exp(-((index - mean) ** 2) / (2.0 * variance))
    return out / math.sqrt(2.0 * math.pi * variance) if normalized else out


def antidiagonal_sums(f1: torch.Tensor, f2: torch.Tensor) -> torch.Tensor:
    """`C0_k = sum_{i+j=k} f1_i * f2_j` for `k = 0 .. 2N-2` via a zero-padded real FFT (a linear convolution).

    Args:
        f1, f2 (`torch.Tensor` of shape `(B, N, D)`): mapped sequences (zeros at padded positions).

    Returns:
        `torch.Tensor` of shape `(B, 2N-1, D)` in fp32, or fp64 for fp64 inputs (computed with autocast disabled).
    """
    length = f1.shape[1]
    # A power of two >= 2N keeps pocketfft/cuFFT on their fast paths and avoids circular wrap-around.
    n_fft = 1 << (2 * length - 1).bit_length()
    with torch.autocast(device_type=f1.device.type, enabled=False):
        f1_hat = torch.fft.rfft(_at_least_fp32(f1), n=n_fft, dim=1)
        f2_hat = torch.fft.rfft(_at_least_fp32(f2), n=n_fft, dim=1)
        return torch.fft.irfft(f1_hat * f2_hat, n=n_fft, dim=1)[:, : 2 * length - 1]


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Half precision goes up to fp32 (FFT round-off); fp32 and fp64 stay as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def central_token_merge(c0: torch.Tensor, f1: torch.Tensor, f2: torch.Tensor) -> torch.Tensor:
    """Row `t` = antidiagonals `2t` and `2t+1` minus the self pair `(t, t)` (before the LayerNorm).

    Args:
        c0 (`torch.Tensor` of shape `(B, 2N-1, D)`): antidiagonal sums.
        f1, f2 (`torch.Tensor` of shape `(B, N, D)`): the mapped sequences they were computed from.

    Returns:
        `torch.Tensor` of shape `(B, N, D)`.
    """
    even = c0[:, 0::2]  # (B, N, D): centre on token t
    odd = F.pad(c0[:, 1::2], (0, 0, 0, 1))  # (B, N, D): centre between t and t+1, none after the last token
    return even + odd - _at_least_fp32(f1) * _at_least_fp32(f2)


class FeatureMap(nn.Module):
    """One of FSAT's parameterised feature maps `f1`, `f2` (D -> D).

    `"mlp"`: `W2 act(W1 x + b1) + b2`. `"dsconv"`: depth-wise Conv1d over the sequence, activation, point-wise
    Linear. Inputs are zeroed at padded positions first, so a convolution never reads padding.
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
        out = self.outer(self.act(h))
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

    def select(self, keep: torch.Tensor) -> FSATEdges:
        """The edges where `keep` `(E,)` is True."""
        return FSATEdges(*(getattr(self, f.name)[keep] for f in dataclasses.fields(self)))


class FSATAttention(ZooAttention):
    """FSAT encoder self-attention (see the module docstring for the computation).

    Keys and values are projected from the pooled cross `C`, not from the hidden states, so this class overrides
    `forward` instead of `attend`. The edges go through [`~attnzoo.kernels.edge_attention`], whose implementation
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

        `valid` `(B, N)` marks real tokens (`None`: all real).
        """
        f1 = self.feature_map_1(hidden_states, valid)
        f2 = self.feature_map_2(hidden_states, valid)
        merged = central_token_merge(antidiagonal_sums(f1, f2), f1, f2)  # (B, N, D) fp32
        # Rows without any real pair (the last real token: its antidiagonals hold only the self pair; and padding) are
        # zero in exact arithmetic but FFT round-off, which the LayerNorm would blow up to unit scale and which
        # depends on the padded length. Make them exact zeros: count the real pairs with the same pooling on the mask.
        if valid is None:
            has_pairs = torch.arange(hidden_states.shape[1], device=merged.device) < hidden_states.shape[1] - 1
            has_pairs = has_pairs[None, :, None]  # (1, N, 1)
        else:
            m = valid[..., None].to(torch.float32)  # (B, N, 1)
            has_pairs = central_token_merge(antidiagonal_sums(m, m), m, m) > 0.5
        return self.cross_norm((merged * has_pairs).to(hidden_states.dtype))

    def predict_indices(self, cross: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Continuous predicted query positions `I_bar` `(B, H, N, M)` in fp32, in `(0, L)`."""
        B, N, _ = cross.shape
        # fp32 even under autocast: a bf16 logit would move a prediction of scale L by ~L/256 positions.
        with torch.autocast(device_type=cross.device.type, enabled=False):
            weight, bias = self.index_predictor.weight.float(), self.index_predictor.bias.float()
            logits = F.linear(cross.float(), weight, bias).view(B, N, -1, self.num_predicted).transpose(1, 2)
        if self.config.index_scale == "max_length":
            scale = torch.full((B, 1, 1, 1), float(self.config.fsat_index_length), device=cross.device)
        else:
            scale = lengths.to(torch.float32).view(B, 1, 1, 1)
        if self.config.index_prior == "key_position":
            # Centre key j's predictions on j itself: sigmoid(logit(p)) * L = p * L = j + 0.5 when the learnt part is
            # zero. Keys past the scale (padding, or beyond L_max) are clamped; their edges are dropped anyway.
            centre = (torch.arange(N, device=cross.device, dtype=torch.float32).view(1, 1, N, 1) + 0.5) / scale
            eps = torch.finfo(torch.float32).eps
            logits = logits + torch.logit(centre.clamp(eps, 1.0 - eps))  # (B, H', N, M)
        return torch.sigmoid(logits).expand(B, self.num_heads, N, self.num_predicted) * scale

    def select_edges(self, mean: torch.Tensor, valid: torch.Tensor) -> FSATEdges:
        """Key-centric edges: predicted queries `floor(I_bar)` and, in training, random real queries per key.

        Edges whose key is padding or whose query falls outside the real tokens are dropped, not clamped (clamping
        would pile edges on the last token). Random queries are drawn from the global torch RNG (replayed by
        gradient checkpointing) uniformly over each sample's real positions, so they never depend on padding.
        """
        B, H, N, M = mean.shape
        index = mean.detach().floor().long()  # (B, H, N, M)
        slot_mean = mean
        predicted = torch.ones_like(index, dtype=torch.bool)
        if self.training and self.num_random > 0:
            lengths = valid.sum(-1)  # (B,)
            # Real positions first (stable), so rank r < N_b maps to the r-th real token whatever the padding side.
            real_positions = torch.sort((~valid).to(torch.int8), dim=-1, stable=True)[1]  # (B, N)
            u = torch.rand(B, H, N, self.num_random, device=mean.device)
            rank = (u * lengths.view(B, 1, 1, 1)).long().clamp(max=N - 1)
            random_index = real_positions.gather(1, rank.view(B, -1)).view(B, H, N, self.num_random)
            paired_mean = mean[..., torch.arange(self.num_random, device=mean.device) % M]
            index = torch.cat([index, random_index], dim=-1)  # (B, H, N, M + R)
            slot_mean = torch.cat([mean, paired_mean], dim=-1)
            predicted = torch.cat([predicted, torch.zeros_like(random_index, dtype=torch.bool)], dim=-1)
        in_range = (index >= 0) & (index < N)
        safe_index = index.clamp(0, N - 1)
        query_real = valid.gather(1, safe_index.reshape(B, -1)).view(index.shape)
        keep = in_range & query_real & valid.view(B, 1, N, 1)  # (B, H, N, S)
        base = (torch.arange(B * H, device=mean.device) * N).view(B, H, 1, 1)
        keys = torch.arange(N, device=mean.device).view(1, 1, N, 1)
        rows = (base + safe_index)[keep]
        cols = (base + keys).expand_as(index)[keep]
        return FSATEdges(
            rows=rows,
            cols=cols,
            query_index=index[keep].to(torch.float32),
            mean=slot_mean[keep],
            predicted=predicted[keep],
            explore=~predicted[keep],
            fixed=torch.zeros_like(predicted[keep]),
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
        B, N, _ = hidden_states.shape
        cross = self.pooled_cross(hidden_states, key_valid)  # (B, N, D)
        q = self._split(self.q_proj(hidden_states))  # (B, H, N, d)
        k = self._split(self.k_proj(cross))
        v = self._split(self.v_proj(cross))
        q, k = self.rotate(q, k)  # rotary positions: key j is the pooled cross at position j
        if self.config.use_sparse:
            valid = key_valid
            if valid is None:
                valid = torch.ones(B, N, dtype=torch.bool, device=hidden_states.device)
            out = self.sparse_attend(q, k, v, cross, valid, output_attentions)
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

    # A compiler boundary: edge selection has data-dependent shapes and the edge kernel's custom autograd Function
    # breaks dynamo's automatic-dynamic shapes pass (IndexError in torch 2.13), so under `torch.compile` this part
    # runs eagerly (one graph break per layer) and the rest of the model is compiled.
    @torch.compiler.disable
    def sparse_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cross: torch.Tensor,
        valid: torch.Tensor,
        output_attentions: bool,
    ) -> AttentionOutput:
        """FSAT proper: select the edges from `cross`, then attend along them.

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
        lengths = valid.sum(-1)  # (B,)
        edges = self.select_edges(self.predict_indices(cross, lengths), valid)
        conf = self.confidences(edges)
        g = self.global_positions(N)
        if g:
            edges, conf = self.add_global_edges(edges, conf, valid, g)
        density = self.edge_density(edges, lengths, B, H, N)
        if output_attentions:
            out, weights = self.edge_reference(q, k, v, edges, conf)
            return AttentionOutput(hidden_states=out, attn_weights=weights, density=density)
        own_global = g > 0 and self.global_keys_apart
        if own_global:
            # The global keys' own softmax is a dense (N x g) attention: computed as one, not through the edge list.
            edges, conf = edges.select(~edges.fixed), conf[~edges.fixed]
        groups = self.softmax_groups(edges, 0)
        q_flat, rows = flatten_heads(q), edges.rows
        if len(groups) > 1:
            # Group `s` goes to virtual query rows `s * B*H*N + row`: one softmax per query and group, summed below.
            group = sum(s * mask.long() for s, mask in enumerate(groups))  # (E,)
            rows = rows + group * (B * H * N)
            q_flat = q_flat.repeat(len(groups), 1)  # (S*B*H*N, d)
        flat = edge_attention(
            q_flat,
            flatten_heads(k),
            flatten_heads(v),
            rows,
            edges.cols,
            edge_weight=conf,
            scale=self.scaling,
            dropout_p=self.dropout,
            training=self.training,
            backend=self.config.attention_backend,
        )
        if len(groups) > 1:
            flat = flat.view(len(groups), B * H * N, -1).sum(0)  # per query: the sum of its groups' outputs
        out = unflatten_heads(flat, B, H, N)  # (B, H, N, d)
        if own_global:
            # Real queries over the real global keys (confidence 1); a padded query or global key takes no part.
            mask = valid[:, None, :, None] & valid[:, None, None, :g]  # (B, 1, N, g)
            reads, _ = dense_masked_attention(
                q, k[:, :, :g], v[:, :, :g], mask, dropout_p=self.dropout, scale=self.scaling, training=self.training
            )
            out = out + reads
        return AttentionOutput(hidden_states=out, density=density)

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

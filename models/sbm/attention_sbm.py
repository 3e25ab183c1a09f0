"""SBM attention: each head samples a bipartite graph from a stochastic block model over queries and keys and
attends over the sampled edges only (Cho et al., "Transformers meet Stochastic Block Models", NeurIPS 2022).

Selection (memberships, block matrix, sampling) is separate from compute: the dense-Bernoulli backend produces a
mask (as a logit bias) for dense attention, the fastRG backend an edge list for the shared edge kernel; both go
through the kernel dispatch, so `attention_backend` picks the reference, CPU or Triton implementation over the same
sampled graph.
"""

from __future__ import annotations

import contextlib
import functools
from types import ModuleType

import torch
import transformers.initialization as init
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache

from ..core.attention import AttentionOutput, DenseAttention, ZooAttention
from ..core.masking import causal_bool_mask
from ..core.positions import apply_rotary
from ..core.saved_tensors import RegeneratedTensors, other_saved_tensor_hooks
from ..kernels import (
    dense_attention,
    dense_masked_attention,
    edge_attention,
    flatten_heads,
    gated_attention,
    unflatten_heads,
)
from ..kernels.dispatch import fastrg_sampler, resolve_backend, sbm_selection_kernels
from ..kernels.hashing import counter_uniform
from .budget import EdgeBudget, reads_draw_counts
from .configuration_sbm import SBMConfig
from .fastrg import FastRGGraph, FastRGKernels, StructuralPairs, fastrg_edges
from .sampling import DenseMaskSTE, EdgeSTE, duplicate_bias, edge_pattern

_SITES = ("encoder", "decoder", "cross_attention")


def total_pairs(pairs: torch.Tensor | float, batch: int) -> torch.Tensor | float:
    """All sequences' pairs ([`SBMAttention.count_pairs`]), at least 1."""
    if isinstance(pairs, torch.Tensor):
        return pairs.sum().clamp(min=1.0)
    return max(batch * pairs, 1.0)


class HeadwiseMLP(nn.Module):
    """Two-layer ReLU MLP with separate weights per head, applied to `(B, H, N, d)` tensors."""

    def __init__(self, num_heads: int, dim: int):
        super().__init__()
        self.weight1 = nn.Parameter(torch.empty(num_heads, dim, dim))
        self.bias1 = nn.Parameter(torch.empty(num_heads, dim))
        self.weight2 = nn.Parameter(torch.empty(num_heads, dim, dim))
        self.bias2 = nn.Parameter(torch.empty(num_heads, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(torch.einsum("bhnd,hde->bhne", x, self.weight1) + self.bias1[:, None])
        return torch.einsum("bhnd,hde->bhne", hidden, self.weight2) + self.bias2[:, None]


class SBMAttention(ZooAttention):
    """Stochastic-block-model attention with a learned, data-adaptive sparsity per head.

    Per head: cluster embeddings `C` (k, d), block matrix `Ŝ = softmax over all k² entries of C Cᵀ`, memberships
    `Q̂ = σ(MLP(Q) Cᵀ)`, `K̂ = σ(MLP(K) Cᵀ)`, edge probabilities `P = Q̂ Ŝ K̂ᵀ` (+ exploration `δ`), a sampled graph
    and softmax attention over its edges. The straight-through estimator sends the attention gradient of each
    sampled edge back to its probability (on the dense backend by default also that of each allowed, unsampled pair:
    `ste_all_pairs`); the density regulariser (`sparsity_weight`) is the auxiliary loss.

    Used as encoder self-attention, causal decoder self-attention and cross-attention; the config can fall back
    to dense attention in the decoder sites (`sbm_in_decoder`, `sbm_in_cross_attention`).

    Args:
        config ([`SBMConfig`]): model configuration.
        is_causal (`bool`): decoder self-attention (never samples an edge to the future).
        is_cross_attention (`bool`): keys and values come from the encoder (bipartite graphs).
        layer_idx (`int`): index of the layer (KV cache, eval seed).
    """

    supports_causal = True
    supports_cross_attention = True
    is_stochastic = True
    has_aux_loss = True
    supports_global_tokens = True

    def __init__(
        self, config: SBMConfig, *, is_causal: bool = False, is_cross_attention: bool = False, layer_idx: int = 0
    ):
        super().__init__(config, is_causal=is_causal, is_cross_attention=is_cross_attention, layer_idx=layer_idx)
        if is_cross_attention:
            site, self.use_sbm, self.num_site_layers = 2, config.sbm_in_cross_attention, config.decoder_layers
        elif is_causal:
            site, self.use_sbm, self.num_site_layers = 1, config.sbm_in_decoder, config.decoder_layers
        else:
            site, self.use_sbm, self.num_site_layers = 0, True, config.num_hidden_layers
        self.site = _SITES[site]
        # A site that falls back to dense attention computes through transformers' attention interface.
        self.uses_attention_interface = not self.use_sbm
        # Eval-mode seed: distinct per layer and site so that layers do not share their random draws.
        self.eval_seed = (config.sampling_seed * 1_000_003 + layer_idx * 7 + site) % (2**62)
        if not self.use_sbm:
            return
        #: edge slots of the fastRG graphs on an accelerator (host state, not saved)
        self.edge_budget = EdgeBudget(f"{self.site} layer {layer_idx}")
        self.clusters = nn.Parameter(torch.empty(self.num_heads, config.num_clusters, self.head_dim))
        if config.shared_membership_mlp:
            self.membership_mlp = nn.Sequential(
                nn.Linear(self.head_dim, self.head_dim), nn.ReLU(), nn.Linear(self.head_dim, self.head_dim)
            )
        else:
            self.membership_mlp = HeadwiseMLP(self.num_heads, self.head_dim)

    def init_method_weights(self) -> None:
        """Kaiming-normal cluster embeddings (as the official code); per-head MLPs like the zoo's Linear layers."""
        if not self.use_sbm:
            return
        init.kaiming_normal_(self.clusters)
        if isinstance(self.membership_mlp, HeadwiseMLP):
            for name in ("weight1", "weight2"):
                init.normal_(getattr(self.membership_mlp, name), mean=0.0, std=self.config.initializer_range)
            for name in ("bias1", "bias2"):
                init.zeros_(getattr(self.membership_mlp, name))

    # ----- selection -------------------------------------------------------------------------------------------

    def selection_kernels(self, device: torch.device) -> ModuleType | None:
        """The fused membership network and block matrix on `device` (`attnzoo.kernels.triton.memberships`) where the
        attention backend runs the Triton kernels, else `None` (the torch code of [`selection`])."""
        return sbm_selection_kernels(
            self.config.attention_backend, device, self.clusters.dtype, self.head_dim, self.clusters.shape[1]
        )

    def block_matrix(self, clusters: torch.Tensor | None = None) -> torch.Tensor:
        """`Ŝ` of every head, `(H, k, k)` fp32, a softmax over all k² entries of `C Cᵀ` (so every `p_ij` is in
        [0, 1]); `clusters`: the fp32 cluster embeddings, if the caller has them (the torch code)."""
        if clusters is None and (kernels := self.selection_kernels(self.clusters.device)) is not None:
            return kernels.block_matrix_triton(self.clusters)
        clusters = self.clusters.float() if clusters is None else clusters
        logits = clusters @ clusters.transpose(-1, -2)  # (H, k, k)
        return logits.flatten(1).softmax(-1).view_as(logits)

    def unrotated(self, x: torch.Tensor) -> torch.Tensor:
        """The queries or keys `(B, H, N, d)` the memberships read: with rotary positions, before the rotation (a
        token's clusters are about its content; the rotation, which the logits keep, already carries the offsets)."""
        return apply_rotary(x, inverse=True) if self.rotary else x

    def membership_weights(self) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter, nn.Parameter]:
        """The membership MLP's `(weight1, bias1, weight2, bias2)`: `nn.Linear`'s when shared by the heads, else
        [`HeadwiseMLP`]'s."""
        mlp = self.membership_mlp
        if isinstance(mlp, HeadwiseMLP):
            return mlp.weight1, mlp.bias1, mlp.weight2, mlp.bias2
        return mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias

    def membership_features(self, x: torch.Tensor) -> torch.Tensor:
        """`MLP(x)` of queries or keys `(B, H, N, d)`, in fp32."""
        return self.membership_mlp(x.to(self.clusters.dtype)).float()

    def memberships(self, x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """`σ(MLP(x) Cᵀ)` in fp32, `(B, H, N, k)`; rows of padded positions are zero (they get no edge)."""
        return self._memberships_of(self.membership_features(x), valid, self.clusters.float())

    def _memberships_of(self, features: torch.Tensor, valid: torch.Tensor | None, clusters: torch.Tensor):
        """[`memberships`] from `MLP(x)` `(B, H, N, d)` and the fp32 cluster embeddings `(H, k, d)`."""
        logits = features @ clusters.transpose(-1, -2)[None]  # (B, H, N, k)
        memb = torch.sigmoid(logits + self.config.membership_logit_bias)
        return memb if valid is None else memb * valid[:, None, :, None]

    def selection(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        query_valid: torch.Tensor | None,
        key_valid: torch.Tensor | None,
        joint: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(Q̂, K̂, Ŝ)`: the memberships of the queries `(B, H, n, k)` and keys `(B, H, m, k)` and the block matrix
        `(H, k, k)`, in fp32 (the cluster embeddings cast once for the three).

        Where the attention backend runs the Triton kernels ([`selection_kernels`]), the network, the memberships and
        the block matrix are fused kernels (their backward too). Otherwise, when `n == m`, the queries and keys go
        through the membership MLP together, stacked along the batch (one pass of its ops for both; the cluster
        logits, `(B, H, n, k)` fp32 each, are made apart so that none is larger than the FFN activation at 128
        clusters); `joint` `(2B, H, n, d)`: that stack, if the caller holds `q` and `k` in it.
        """
        kernels = self.selection_kernels(q.device)
        if kernels is not None:  # the network and the memberships in one kernel per input (two in backward)
            return kernels.memberships_triton(
                ((self.unrotated(q), query_valid), (self.unrotated(k), key_valid)), *self.membership_weights(),
                self.clusters, logit_bias=self.config.membership_logit_bias, shared=self.config.shared_membership_mlp,
            )  # fmt: skip
        if q.shape == k.shape:
            joint = torch.cat([q, k]) if joint is None else joint  # (2B, H, n, d)
            q_features, k_features = self.membership_features(self.unrotated(joint)).split(q.shape[0])
        else:
            q_features, k_features = (self.membership_features(self.unrotated(t)) for t in (q, k))
        clusters = self.clusters.float()  # (H, k, d)
        q_memb = self._memberships_of(q_features, query_valid, clusters)
        k_memb = self._memberships_of(k_features, key_valid, clusters)
        return q_memb, k_memb, self.block_matrix(clusters)

    def allowed_pairs(
        self, key_valid: torch.Tensor | None, query_valid: torch.Tensor | None, n: int, m: int, offset: int, device
    ) -> torch.Tensor | None:
        """Pairs that may carry an edge, `(B or 1, 1, n, m)` bool (None: all pairs)."""
        allowed = None
        if key_valid is not None:
            allowed = key_valid[:, None, None, :]
            if query_valid is not None:
                allowed = allowed & query_valid[:, None, :, None]
        if self.is_causal:
            causal = causal_bool_mask(n, m, offset, device)[None, None]
            allowed = causal if allowed is None else allowed & causal
        return allowed

    def count_pairs(
        self,
        key_valid: torch.Tensor | None,
        query_valid: torch.Tensor | None,
        B: int,
        n: int,
        m: int,
        offset: int,
        device,
    ) -> torch.Tensor | float:
        """Number of pairs that may carry an edge per sequence, `(B,)` float, without building an `n × m` mask; a
        Python float (the same for every sequence) when there is no padding: it costs the device nothing then."""
        if key_valid is None and query_valid is None:
            if not self.is_causal:
                return float(n * m)
            # Query i sees min(i + offset + 1, m) keys: the first t of them fewer than m.
            t = min(n, max(m - offset - 1, 0))
            return float(t * (offset + 1) + t * (t - 1) // 2 + (n - t) * m)
        keys = torch.ones(B, m, device=device) if key_valid is None else key_valid.float()
        queries = torch.ones(B, n, device=device) if query_valid is None else query_valid.float()
        if not self.is_causal:
            return queries.sum(-1) * keys.sum(-1)
        # Query i sees the valid keys at positions <= i + offset.
        visible = keys.cumsum(-1)[:, (torch.arange(n, device=device) + offset).clamp(max=m - 1)]  # (B, n)
        return (queries * visible).sum(-1)

    def structural_offsets(self) -> list[int]:
        """Key offsets `j - i` always attended in self-attention (self loops and the sliding window)."""
        if self.is_cross_attention:
            return []
        half = self.config.local_window // 2
        if half > 0:
            return list(range(-half, half + 1))
        return [0] if self.config.add_self_loops else []

    def sample_dense(
        self, probs: torch.Tensor, delta: float, allowed: torch.Tensor | None, offset: int, sampling: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Exact Bernoulli graph with edge probabilities `min(probs + delta, 1)` on the allowed pairs.

        Returns `blocked` `(B, H, n, m)` float (1 where no edge is attended, 0 elsewhere) and, when structural
        edges (self loops, window, global columns) are attended too, the boolean graph of sampled edges (else
        `None`): `(B, H, n, m)`, or `(B, H, n, g)` when the only structural edges are the `g` global columns (beyond
        them, sampled = attended).
        """
        _, H, n, m = probs.shape
        # u - δ < p  <=>  u < p + δ: the exploration shift is folded into the uniforms. The comparison runs in place
        # on the float uniforms (bool conversions cost a slow extra pass over the pairs).
        if not sampling:
            uniforms = torch.full_like(probs, 0.5 - delta)  # the most likely graph
        elif self.training:
            uniforms = torch.empty_like(probs).uniform_(-delta, 1.0 - delta)
        else:
            positions = torch.arange(offset, offset + n, device=probs.device)
            keys = torch.arange(m, device=probs.device)
            uniforms = counter_uniform(self.eval_seed, H, positions, keys).sub_(delta)[None].expand_as(probs)
            uniforms = uniforms.contiguous()
        blocked = uniforms.sub_(probs).ge_(0.0)  # 1.0 where u >= p + δ
        if allowed is not None:
            blocked.masked_fill_(~allowed, 1.0)
        offsets = self.structural_offsets()
        g = self.global_positions(m)
        if not offsets and not g:
            return blocked, None
        if not offsets:
            # Global columns only: what was sampled there fits in `(B, H, n, g)`, so no `n × m` graph is kept.
            sampled = blocked[..., :g] == 0
            columns = blocked[..., :g]
            if allowed is None:
                columns.zero_()  # attended by every query
            else:
                columns.copy_(~allowed[..., :g].expand_as(columns))  # by every query allowed to see them
            return blocked, sampled
        sampled = blocked == 0
        struct = torch.zeros(n, m, dtype=torch.bool, device=probs.device)
        if offsets:
            keys = torch.arange(m, device=probs.device)[None]
            dist = keys - torch.arange(offset, offset + n, device=probs.device)[:, None]
            struct |= (dist >= offsets[0]) & (dist <= offsets[-1])  # (n, m)
        # Global keys are attended by every query without sampling (`core.global_tokens`).
        struct[:, :g] = True
        struct = struct[None, None] if allowed is None else struct & allowed
        return blocked.masked_fill_(struct, 0.0), sampled

    def structural_pairs(self, m: int) -> StructuralPairs | None:
        """The structural edges of the fastRG backend (the diagonals of :meth:`structural_offsets` and the global
        columns among `m` keys), `None` when there are none."""
        offsets = self.structural_offsets()
        g = self.global_positions(m)
        if not offsets and not g:
            return None
        return StructuralPairs(first=offsets[0] if offsets else 0, diagonals=len(offsets), columns=g)

    def fixed_backend(self, sampling: bool) -> str | None:
        """The sampling backend of this call when the memberships do not decide it (`None`: "auto" decides)."""
        if not sampling or (not self.training and self.decoder_site):
            # Eval at a decoder site draws every pair from its own counter-based uniform (the dense sampler): a
            # fastRG multigraph couples all pairs of a sequence, so its draws would change with the KV cache (one
            # query per step) and with the padded decoder positions, which cross-attention cannot tell apart.
            return "bernoulli"
        backend = self.config.sampling_backend
        return None if backend == "auto" else backend

    def choose_backend(self, q_memb, k_memb, blocks, delta: float, pairs: torch.Tensor | float, sampling: bool) -> str:
        backend = self.fixed_backend(sampling)
        if backend is not None:
            return backend
        with torch.no_grad():
            # Σ_ij p_ij = Σ_uv y_u Ŝ_uv z_v: the expected edge count without touching the n × m pairs.
            expected = torch.einsum("bhu,huv,bhv->", q_memb.sum(2), blocks, k_memb.sum(2))
            total = total_pairs(pairs, q_memb.shape[0]) * self.num_heads
            density = float((expected + delta * total) / total)
        return "fastrg" if density < self.config.auto_density_threshold else "bernoulli"

    @property
    def decoder_site(self) -> bool:
        """Decoder self-attention or cross-attention (queries generated step by step)."""
        return self.is_causal or self.is_cross_attention

    def query_offset(self, q: torch.Tensor, k: torch.Tensor, cache: Cache | None) -> int:
        """As [`ZooAttention.query_offset`]; cross-attention also gets its queries' decoder positions, so that
        eval-mode draws of a pair are the same with and without the KV cache."""
        if self.is_cross_attention and isinstance(cache, EncoderDecoderCache):
            # The decoder layer has already appended this step to its self-attention cache.
            cached = cache.self_attention_cache.get_seq_length(self.layer_idx)
            return max(cached - q.shape[2], 0)
        return super().query_offset(q, k, cache)

    # ----- compute ---------------------------------------------------------------------------------------------

    def attend(self, q, k, v, key_valid, *, query_offset=0, output_attentions=False):
        if not self.use_sbm:
            return DenseAttention.attend(
                self, q, k, v, key_valid, query_offset=query_offset, output_attentions=output_attentions
            )
        in_dtype = q.dtype
        # Probabilities and sampling run in fp32 (as the official code does): small edge probabilities are compared
        # with uniforms, and bf16's 8-bit mantissa would coarsen them. The edge attention reads q, k, v in their own
        # dtype and accumulates in fp32; the dense backend's attention runs in fp32.
        with torch.autocast(device_type=q.device.type, enabled=False):
            out = self._attend_sbm(q, k, v, key_valid, query_offset, output_attentions)
        out.hidden_states = out.hidden_states.to(in_dtype)
        if out.attn_weights is not None:
            out.attn_weights = out.attn_weights.to(in_dtype)
        return out

    def _attend_each_example(self, q, k, v, key_valid, offset: int, output_attentions: bool) -> AttentionOutput:
        """[`_attend_sbm`] one example at a time (eval), outputs concatenated along the batch."""
        parts = [
            self._attend_sbm(
                q[b : b + 1],
                k[b : b + 1],
                v[b : b + 1],
                None if key_valid is None else key_valid[b : b + 1],
                offset,
                output_attentions,
            )
            for b in range(q.shape[0])
        ]
        return AttentionOutput(
            hidden_states=torch.cat([part.hidden_states for part in parts]),
            attn_weights=torch.cat([part.attn_weights for part in parts]) if output_attentions else None,
            density=torch.cat([part.density for part in parts]),
            # Examples may take different backends: unless every kernel did, `with_global_rows` does all of them
            # (recomputing equal rows where a kernel did).
            global_rows_done=all(part.global_rows_done for part in parts),
        )

    def _attend_sbm(self, q, k, v, key_valid, offset: int, output_attentions: bool) -> AttentionOutput:
        cfg = self.config
        B, H, n, _ = q.shape
        per_example = not (self.training or self.decoder_site) and cfg.sample_at_eval
        if per_example and B > 1 and cfg.sampling_backend != "bernoulli":
            # A fastRG graph is one multigraph per sequence drawn from one generator, and "auto" picks its backend
            # from the density: in eval each example runs alone, so its graph never depends on its batch.
            return self._attend_each_example(q, k, v, key_valid, offset, output_attentions)
        m = k.shape[2]
        device = q.device
        query_valid = None
        if key_valid is not None and not self.is_cross_attention:
            query_valid = key_valid[:, offset : offset + n]
        sampling = self.training or cfg.sample_at_eval
        # fastRG's estimator recomputes the memberships in backward: no autograd graph for them here ("auto" builds
        # one, dropped at the end of this call when it picks fastRG).
        fixed = self.fixed_backend(sampling)
        joint = None
        # The Triton kernels (edge attention, membership network) read the head-split views of the projections in
        # place. The torch edge attention reads flat head-major rows: q, k and v are copied into that layout once,
        # here, so that the memberships read them as they are (a linear layer would copy a head-split view first)
        # and the global rows keep the edge attention's copies (`AttentionOutput.inputs`). Of one shape, they are
        # stacked along the batch by one copy, and the membership network reads the queries and keys stacked.
        if fixed == "fastrg" and resolve_backend(cfg.attention_backend, device, q.dtype, k.dtype, v.dtype) != "triton":
            if q.shape == k.shape == v.shape:
                stacked = torch.cat([q, k, v])  # (3B, H, n, d), contiguous
                q, k, v = stacked.split(B)
                joint = stacked[: 2 * B]
            else:
                q, k, v = (unflatten_heads(flatten_heads(t), B, H, t.shape[2]) for t in (q, k, v))
        with torch.set_grad_enabled(torch.is_grad_enabled() and fixed != "fastrg"):
            # (B, H, n | m, k) twice, (H, k, k)
            q_memb, k_memb, blocks = self.selection(q, k, query_valid, key_valid, joint)
        pairs = self.count_pairs(key_valid, query_valid, B, n, m, offset, device)  # (B,)
        delta = float(cfg.exploration_delta) if (self.training or cfg.exploration_at_eval) else 0.0
        graph = (q_memb, k_memb, blocks, delta, key_valid, query_valid, offset)
        inputs, global_rows_done = None, False
        if self.choose_backend(q_memb, k_memb, blocks, delta, pairs, sampling) == "bernoulli":
            out, weights, counts, attended_counts = self._attend_dense_graph(
                q.float(), k.float(), v.float(), *graph, sampling, output_attentions
            )
        else:
            out, weights, counts, attended_counts, inputs, global_rows_done = self._attend_fastrg(
                q, k, v, *graph, output_attentions
            )

        # The contract returns auxiliary losses in training only (a scalar in the encoder outputs would also be
        # expanded along dim 0 by beam search).
        aux_loss = None
        if self.training and cfg.sparsity_weight == 0:
            # A zero keeps the loss graph (and the STE backward) free of a regulariser that contributes nothing.
            aux_loss = counts.new_zeros(())
        elif self.training:
            # Regulariser on the sampled edges through the straight-through counts: λ times this layer's mean
            # density, divided by the depth of the stack so that the model's total is λ times the mean over layers.
            aux_loss = (counts.sum(0) / total_pairs(pairs, B)).mean() * (cfg.sparsity_weight / self.num_site_layers)
        sequence_pairs = pairs.clamp(min=1.0)[:, None] if isinstance(pairs, torch.Tensor) else max(pairs, 1.0)
        density = (attended_counts / sequence_pairs).detach()  # (B, H), per example
        return AttentionOutput(
            hidden_states=out,
            attn_weights=weights,
            aux_loss=aux_loss,
            density=density,
            inputs=inputs,
            global_rows_done=global_rows_done,
        )

    def _attend_dense_graph(
        self, q, k, v, q_memb, k_memb, blocks, delta, key_valid, query_valid, offset, sampling, output_attentions
    ):
        """The dense-Bernoulli backend: `(out, attention weights or None, sampled counts (B, H) carrying the
        straight-through gradient, attended counts (B, H))`."""
        cfg = self.config
        B, H, n, _ = q.shape
        m = k.shape[2]
        allowed = self.allowed_pairs(key_valid, query_valid, n, m, offset, q.device)
        dropout_p = self.dropout if self.training else 0.0
        # Every allowed pair's straight-through gradient (the default in training) needs the gated attention, whose
        # gate is differentiable also where it is closed; the sampled pairs' alone, a logit bias.
        all_pairs = cfg.ste_all_pairs is not False and self.training
        probs = (q_memb @ blocks) @ k_memb.transpose(-1, -2)  # (B, H, n, m)
        with torch.no_grad():
            law, law_delta = probs.detach(), delta
            if sampling and not self.training and cfg.sampling_backend == "fastrg":
                # A decoder site of a model trained with fastRG samples under its law in eval: merged Poisson
                # counts make a pair present with probability 1 - exp(-(p + δ)), not p + δ.
                law, law_delta = -torch.expm1(-(law + delta)), 0.0
            blocked, sampled = self.sample_dense(law, law_delta, allowed, offset, sampling)
            row_counts = m - blocked.sum(-1)  # (B, H, n) attended keys per query
            if sampled is None:
                sampled_rows = row_counts
            elif sampled.shape[-1] == m:
                sampled_rows = sampled.sum(-1, dtype=torch.float32)
            else:  # the graph of the global columns only: take their attended, unsampled pairs off
                forced = (blocked[..., : sampled.shape[-1]] == 0) & ~sampled
                sampled_rows = row_counts - forced.sum(-1, dtype=torch.float32)
            sampled_counts = sampled_rows.sum(-1)
            attended = blocked == 0 if output_attentions and not all_pairs else None
        logits = (q.detach(), k.detach(), self.scaling) if cfg.ste_variant == "paper" else None
        attend, counts = DenseMaskSTE.apply(
            probs, blocked, sampled, sampled_counts, float(cfg.ste_clip), logits, all_pairs, allowed
        )
        weights = None
        if all_pairs:
            keep = None
            if dropout_p > 0.0:
                # u >= p keeps a pair with probability 1 - p (uniforms are ~1.5x cheaper than `bernoulli_` on CPU)
                keep = torch.rand_like(attend).ge_(dropout_p).div_(1.0 - dropout_p)
            out, weights = gated_attention(
                q, k, v, attend, keep=keep, scale=self.scaling, return_weights=output_attentions,
                closed_gradient=cfg.ste_unsampled_gradient, backend=cfg.attention_backend,
            )  # fmt: skip
        elif output_attentions:
            out, weights = dense_masked_attention(
                q, k, v, attended, dropout_p=dropout_p, scale=self.scaling, training=self.training,
                return_weights=True, logit_bias=attend,
            )  # fmt: skip
        else:
            # The bias is the mask (the dtype's minimum off the graph) and carries the straight-through gradient; a
            # float bias that requires grad makes SDPA use its math kernel and return that gradient.
            out = dense_attention(
                q, k, v, logit_bias=attend, scale=self.scaling, dropout_p=dropout_p, training=self.training,
                backend=cfg.attention_backend,
            )  # fmt: skip
            out = out.masked_fill((row_counts == 0)[..., None], 0.0)
        return out, weights, counts, row_counts.sum(-1)

    def _attend_fastrg(
        self, q, k, v, q_memb, k_memb, blocks, delta, key_valid, query_valid, offset, output_attentions
    ):
        """The fastRG backend over a fixed-size edge list, in q, k, v's dtype: as [`_attend_dense_graph`], then the
        head-split views of the flat q, k, v the edge attention keeps (`AttentionOutput.inputs`) and whether the
        kernels computed the global rows (`AttentionOutput.global_rows_done`). The memberships are
        recomputed in backward from the queries and keys the edge attention keeps anyway; where the kernels run, so is
        the graph (from the call's seed and Poisson totals), so that backward keeps nothing per edge."""
        cfg = self.config
        B, H, n, _ = q.shape
        m = k.shape[2]
        device = q.device
        num_rows, num_cols = B * H * n, B * H * m
        kernel = resolve_backend(cfg.attention_backend, device, q.dtype, k.dtype, v.dtype)
        triton = kernel == "triton"
        generator = None
        if not self.training:
            generator = torch.Generator(device=device).manual_seed(self.eval_seed)
        # On the Triton path the host reserves the edge slots without reading the device; the others compact the
        # edge list anyway and read the exact count.
        reserve = None
        if not reads_draw_counts(kernel):
            reserve = functools.partial(self.edge_budget.reserve, pairs=B * H * n * m)
        # The fused sampler where the edge attention runs the Triton kernels (the same graph as the torch one).
        sampler = fastrg_sampler(cfg.attention_backend, device) if triton else None
        selection_kernels = self.selection_kernels(device)
        sample = functools.partial(
            fastrg_edges, delta=delta, query_valid=query_valid, key_valid=key_valid, causal=self.is_causal,
            query_offset=offset, structural=self.structural_pairs(m),
            kernels=None if sampler is None else FastRGKernels(*sampler),
            weights_kernel=None if selection_kernels is None else selection_kernels.fastrg_weights_triton,
        )  # fmt: skip
        with torch.no_grad():
            graph = sample(q_memb.detach(), k_memb.detach(), blocks.detach(), generator=generator, reserve=reserve)
        if reserve is not None:
            self.edge_budget.record(graph, B * H * n * m)
        rows, cols, crow = graph.rows, graph.cols, graph.crow

        # What the edge attention reads: the head-split q, k, v in place (Triton), or their flat rows (B*H*n, d),
        # (B*H*m, d) twice (views of the stacked copies made in `_attend_sbm`).
        edge_inputs = (q, k, v) if triton else (flatten_heads(q), flatten_heads(k), flatten_heads(v))

        def factors(queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # p_ij = <Q̂_i, Ŝ K̂_j> = <Q̂_i, (K̂ Ŝᵀ)_j>, from the queries and keys the edge attention reads
            with torch.autocast(device_type=device.type, enabled=False):
                if queries.dim() == 2:
                    queries, keys = unflatten_heads(queries, B, H, n), unflatten_heads(keys, B, H, m)
                q_factor, keys, blocks = self.selection(queries, keys, query_valid, key_valid)
                k_factor = keys @ blocks.transpose(-1, -2)  # (B, H, m, k)
            return q_factor.reshape(num_rows, -1), k_factor.reshape(num_cols, -1)

        # The queries and keys are what the edge attention keeps for its backward: the recomputation adds nothing
        # of its own.
        params = tuple(p for p in (*self.membership_mlp.parameters(), self.clusters) if p.requires_grad)
        # The sampled counts carry the regulariser's gradient to the edges; without a regulariser (its loss is
        # detached, and there is none outside training) they need no autograd graph, which would keep the edges'
        # owners for backward.
        counted = cfg.sparsity_weight > 0 and self.training

        def flags_of(sampled: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
            return torch.stack([sampled, attended.float()], -1)  # (E, 2): what the per-head counts sum

        def per_edge(graph: FastRGGraph) -> dict[str, torch.Tensor | None]:
            # What backward reads of a graph besides its row pointers, made alike in forward and when sampled again.
            grad_scale = None
            if cfg.ste_variant == "paper":
                # The paper's bias is `logit * (m - 1)`: the gradient reaching it, times the logit, is that of `m`.
                with torch.no_grad():
                    pattern = edge_pattern(graph.rows, graph.cols, num_rows, num_cols, crow=graph.crow, triton=triton)
                    grad_scale = pattern.sddmm(flatten_heads(q), flatten_heads(k), self.scaling)
            owner = graph.rows // n if counted else None  # (b, h) of each edge; B * H on padding
            return {"cols": graph.cols, "sampled": graph.sampled, "grad_scale": grad_scale, "owner": owner}

        edges = per_edge(graph)
        regenerated, hooks = None, contextlib.nullcontext()
        # Where the kernels run, backward samples the graph again rather than keep its per-edge tensors
        # (`core.saved_tensors`); not inside torch.compile (whose graph keeps them), nor under other saved-tensor
        # hooks (activation checkpointing, which recomputes the whole layer).
        if (
            triton
            and torch.is_grad_enabled()
            and not output_attentions
            and not torch.compiler.is_compiling()
            and not other_saved_tensor_hooks()
        ):
            draws = graph.draws

            def rebuild() -> dict[str, torch.Tensor | None]:
                again = sample(*self.selection(q, k, query_valid, key_valid), generator=None, draws=draws)
                bias = duplicate_bias(again.duplicate, again.cols)
                flags = flags_of(again.sampled.float(), again.attended) if counted else None
                return {**per_edge(again), "bias": bias, "flags": flags}

            regenerated = RegeneratedTensors(rebuild, device.type)
            regenerated.register(**edges)
            hooks = regenerated.active()
        with hooks:
            # Forward 0, and -inf at a repeated draw of a pair (listed again after its first copy: weight 0).
            estimated = EdgeSTE.apply(
                factors, rows, cols, crow, edges["sampled"], graph.duplicate, edges["grad_scale"], counted,
                float(cfg.ste_clip), triton, *edge_inputs[:2], *params,
            )  # fmt: skip
            logit_bias, sampled = estimated if counted else (estimated, None)
            if regenerated is not None:
                regenerated.register(bias=logit_bias)
                # the estimator's node is upstream of every other reader of the rebuilt tensors
                regenerated.release_after(logit_bias.grad_fn)
            if counted:
                flags = flags_of(sampled, graph.attended)
                if regenerated is not None:  # index_add keeps its source (and its index, `owner`) for backward
                    regenerated.register(flags=flags)
                # sampled and attended edges per (b, h), one pass for both
                per_head = torch.zeros(B * H + 1, 2, device=device).index_add(0, edges["owner"], flags)[:-1]
            else:
                per_head = graph.head_counts.float()  # (B*H, 2), counted by the sampler
            counts, attended_counts = per_head[:, 0].view(B, H), per_head[:, 1].view(B, H)
            dropout_p = self.dropout if self.training else 0.0
            if output_attentions:
                # The dense weights of the real edges (a debugging path: compaction is fine here).
                real = graph.attended
                flat = rows[real].long() * m + cols[real] % m  # int64: rows times m may not fit in int32
                mask = torch.zeros(num_rows * m, dtype=torch.bool, device=device).index_fill_(0, flat, True)
                dense_bias = torch.zeros(num_rows * m, device=device).index_put((flat,), logit_bias[real])
                out, weights = dense_masked_attention(
                    q.float(), k.float(), v.float(), mask.view(B, H, n, m), dropout_p=dropout_p, scale=self.scaling,
                    training=self.training, return_weights=True, logit_bias=dense_bias.view(B, H, n, m),
                )  # fmt: skip
                return out, weights, counts, attended_counts, None, False
            # The Triton kernels compute the global queries' dense rows in their own programs (no op around them).
            global_rows = self.kernel_global_rows(n, m, offset) if triton else 0
            out = edge_attention(
                # Dropout from the graph's hash (a fixed number of generator draws per call, whatever the edge count),
                # which the Triton kernels regenerate per edge instead of storing a mask.
                *edge_inputs, rows, cols, logit_bias=logit_bias, scale=self.scaling, dropout_p=dropout_p,
                keep_seed=graph.seed, training=self.training, sorted_rows=True, padded=True, crow=crow,
                global_rows=global_rows, key_valid=key_valid, backend=cfg.attention_backend,
            )  # fmt: skip
            if triton:  # read in place: the global rows read the same q, k, v
                return out, None, counts, attended_counts, None, global_rows > 0
            inputs = tuple(unflatten_heads(t, B, H, t.shape[0] // (B * H)) for t in edge_inputs)  # the flat copies
            return unflatten_heads(out, B, H, n), None, counts, attended_counts, inputs, False

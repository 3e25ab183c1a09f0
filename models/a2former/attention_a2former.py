"""A²-Former attention: every query attends to K points at learned fractional positions, read by interpolation.

Selection: offsets predicted per head from the query token are added to the query's own index (the meta position),
bounded to the span of the sample's real tokens (and to the past when causal) and split into its two neighbouring
real keys plus an interpolation weight. Selection and attention are one kernel-layer primitive,
[`~attnzoo.kernels.interpolated_attention`], whose implementation `attention_backend` picks: on CUDA one Triton kernel
per pass that computes the positions from the offsets in registers; the reference and CPU paths materialise the
selection (:meth:`A2FormerAttention.sample_positions`) and run gathered attention with two weighted entries per point.
With `output_attentions=True` the dense interpolation matrix on the same positions and weights returns the weights.
"""

from __future__ import annotations

import torch
import transformers.initialization as init
from torch import nn

from ..core.attention import AttentionOutput, ZooAttention
from ..kernels import interpolated_attention
from ..kernels.hashing import draw_seed, grid_keep
from ..kernels.interpolated import interpolated_density, interpolated_slots, interpolation_points
from .configuration_a2former import A2FormerConfig
from .interpolated import interpolated_attention_reference
from .wide_linear import wide_linear


def spread_offsets(num_heads: int, num_points: int) -> torch.Tensor:
    """Initial offsets `(H, K)`: `{-K/2, ..., -1, 1, ..., K - K/2}` tokens, scaled by `h + 1` for head `h`."""
    half = num_points // 2
    base = torch.cat((torch.arange(-half, 0), torch.arange(1, num_points - half + 1))).float()  # (K,)
    return torch.arange(1, num_heads + 1).float()[:, None] * base  # (H, K)


class A2FormerAttention(ZooAttention):
    """A²-Former self-attention (Zhang et al., 2023), multi-head in the Deformable-DETR style.

    For query `i` and head `h`: `p = i + offset_scale * (x_i W_off + b_off)` (K points), bounded to the span of the
    sample's real tokens (`[first, last]`) and, when causal, to `[first, i + query_offset]`. Keys and values are
    interpolated at `p` from the projected K/V (interpolation commutes with the affine projections; with rotary
    positions the rotated keys are interpolated, so a point between two keys reads a blend of their rotations)
    between the nearest real keys on either side of `p`: masked keys (padding, or holes anywhere in the attention
    mask) never receive weight, exactly as a dense model's masked keys. A point that lands in a hole reads the linear
    interpolation of the real keys at the hole's two edges (the hole is bridged, as if its tokens were absent); on
    a real key it reads that key, and without holes this is plain interpolation between `floor(p)` and
    `floor(p) + 1`. The K points are weighted by a softmax over `<q, k~> / sqrt(d)` (or over a learned linear map of
    `x_i` with `attention_weights="linear"`), and `out = sum_k alpha_k v~_k`. Deterministic, so eval and training
    differ only by dropout. Decoder use is supported (`is_causal=True`, works with the KV cache since a query's
    positions depend only on its own token and index); cross-attention is not (the paper defines none).
    """

    supports_causal = True
    supports_global_tokens = True

    def __init__(
        self, config: A2FormerConfig, *, is_causal: bool = False, is_cross_attention: bool = False, layer_idx: int = 0
    ):
        super().__init__(config, is_causal=is_causal, is_cross_attention=is_cross_attention, layer_idx=layer_idx)
        self.num_points = config.num_sample_points
        self.offset_scale = float(config.offset_scale)
        num_outputs = self.num_heads * self.num_points
        # Direct parameters (not nn.Linear children): HF's initialisation only reaches a module's own init when it
        # owns parameters, and these need the method's initialisation, not the generic normal one.
        self.offset_weight = nn.Parameter(torch.empty(num_outputs, config.hidden_size))
        self.offset_bias = nn.Parameter(torch.empty(num_outputs))
        if config.attention_weights == "linear":
            self.point_logit_weight = nn.Parameter(torch.empty(num_outputs, config.hidden_size))
            self.point_logit_bias = nn.Parameter(torch.empty(num_outputs))
        else:
            self.point_logit_weight = self.point_logit_bias = None

    def init_method_weights(self) -> None:
        """Zero offset weights with a grid bias (initial positions exactly on the grid), zero linear logits."""
        init.zeros_(self.offset_weight)
        if self.config.offset_bias_init == "spread":
            grid = spread_offsets(self.num_heads, self.num_points) / self.offset_scale
            init.copy_(self.offset_bias, grid.reshape(-1).to(self.offset_bias))
        else:
            init.zeros_(self.offset_bias)
        if self.point_logit_weight is not None:
            init.zeros_(self.point_logit_weight)
            init.zeros_(self.point_logit_bias)

    def _per_head(self, x: torch.Tensor) -> torch.Tensor:
        # (B, N, H * K) -> (B, H, N, K)
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.num_points).transpose(1, 2)

    def predict_offsets(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Offsets in tokens `(B, H, N, K)` (fp32: bf16 cannot hold fractional positions beyond 256) and, in linear
        mode, the point logits `(B, H, N, K)`. Computed in fp32 without keeping an fp32 copy of the hidden states
        for backward ([`~attnzoo.a2former.wide_linear.wide_linear`])."""
        offsets = wide_linear(hidden_states, self.offset_weight, self.offset_bias, self.offset_scale)
        logits = None
        if self.point_logit_weight is not None:
            logits = self._per_head(wide_linear(hidden_states, self.point_logit_weight, self.point_logit_bias))
        return self._per_head(offsets), logits

    def attend_inputs(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """The offsets (and point logits of the linear mode) come from the query tokens' hidden states."""
        offsets, point_logits = self.predict_offsets(hidden_states)
        return {"offsets": offsets, "point_logits": point_logits}

    def sample_positions(
        self, offsets: torch.Tensor, key_valid: torch.Tensor | None, num_keys: int, query_offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Selection step of this layer (its bound and causality): bounded positions and their interpolation
        structure, as [`~attnzoo.kernels.interpolated.interpolation_points`] computes them.

        Args:
            offsets (`torch.Tensor` of shape `(B, H, Nq, K)`): offsets in tokens from the meta position.
            key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): real keys (any pattern, holes included).
            num_keys (`int`): key length `Nk`.
            query_offset (`int`): absolute index of the first query (cached keys before it).

        Returns:
            positions `(B, H, Nq, K)` (float, differentiable), `i0`, `i1` `(B, H, Nq, K)` (long: the nearest real
            keys at or before / after the position) and `row_valid` `(B, 1, Nq, 1)` (bool: the query has a key).
        """
        return interpolation_points(offsets, key_valid, num_keys, **self._selection(num_keys, query_offset, False))

    def _selection(self, num_keys: int, query_offset: int, with_globals: bool = True) -> dict:
        """This layer's selection settings, as the kernel layer's keyword arguments."""
        settings = {
            "causal": self.is_causal,
            "query_offset": query_offset,
            "position_bound": self.config.position_bound,
        }
        if with_globals:
            settings["num_global"] = self.global_positions(num_keys)
        return settings

    def with_global_rows(
        self, out: AttentionOutput, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor | None
    ) -> AttentionOutput:
        """The global queries' rows: [`~attnzoo.kernels.interpolated_attention`] computed them with the method's
        rows (in its kernels on the fused path); only the returned weights take the shared dense path."""
        if out.attn_weights is None:
            return out
        return super().with_global_rows(out, q, k, v, key_valid)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_valid: torch.Tensor | None,
        *,
        query_offset: int = 0,
        output_attentions: bool = False,
        offsets: torch.Tensor | None = None,
        point_logits: torch.Tensor | None = None,
    ) -> AttentionOutput:
        """A² attention over head-split `(B, H, N, d)` tensors.

        Args:
            offsets (`torch.Tensor` of shape `(B, H, Nq, K)`): offsets in tokens from :meth:`predict_offsets`
                (required: they come from the query tokens, which `attend` does not see).
            point_logits (`torch.Tensor` of shape `(B, H, Nq, K)`, *optional*): logits of the linear weight mode.
        """
        if offsets is None:
            raise ValueError("A2FormerAttention.attend needs `offsets` (see `predict_offsets`); call the module.")
        num_keys = k.shape[2]
        selection = self._selection(num_keys, query_offset)
        if not output_attentions:
            # In training the primitive draws the dropout's hash seed (its Triton kernels regenerate the mask).
            out, density = interpolated_attention(
                q,
                k,
                v,
                offsets,
                point_logits=point_logits,
                key_valid=key_valid,
                scale=self.scaling,
                dropout_p=self.dropout,
                training=self.training,
                global_rows=True,  # see `with_global_rows`
                backend=self.config.attention_backend,
                **selection,
            )
            return AttentionOutput(hidden_states=out, density=density)
        # The dense interpolation matrix on the same slots returns the weights, in the graph (a user may
        # differentiate through them), as in the other families.
        keep = None
        if self.training and self.dropout > 0:
            slots = (*offsets.shape[:3], offsets.shape[3] + selection["num_global"])
            keep = grid_keep(draw_seed(q.device), slots, self.dropout)
        i0, i1, w1, bias, row_valid = interpolated_slots(offsets, point_logits, key_valid, num_keys, **selection)
        out, weights = interpolated_attention_reference(
            q,
            k,
            v,
            i0,
            i1,
            w1,
            logit_bias=None if bias is None else bias.expand(i0.shape),
            dot_product=point_logits is None,
            scale=self.scaling,
            keep=keep,
            dropout_p=self.dropout,
        )
        density = interpolated_density(i0, i1, w1, bias, row_valid, key_valid, num_keys)
        return AttentionOutput(hidden_states=out, attn_weights=weights, density=density)

"""A²-Former attention: every query attends to K points at learned fractional positions, read by interpolation.

Selection (:meth:`A2FormerAttention.sample_positions`): offsets predicted per head from the query token are added to
the query's own index (the meta position), bounded to the span of the sample's real tokens (and to the past when
causal) and split into its two neighbouring real keys plus an interpolation weight. Compute: each point is one slot
of [`~attnzoo.kernels.gathered_attention`] with two weighted entries (the neighbours, weights `1 - w` and `w`), whose
implementation `attention_backend` picks (reference gather, CPU CSR path with 2K edges per query, or Triton); with
`output_attentions=True` the dense interpolation matrix on the same positions and weights returns the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers.initialization as init
from torch import nn

from ..core.attention import AttentionOutput, ZooAttention
from ..core.global_tokens import append_global_slots
from ..kernels import gathered_attention
from ..kernels.dropout import sample_keep_mask
from .configuration_a2former import A2FormerConfig
from .interpolated import interpolated_attention_reference


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
        mode, the point logits `(B, H, N, K)`."""
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            dtype = torch.promote_types(hidden_states.dtype, torch.float32)
            x = hidden_states.to(dtype)
            offsets = self._per_head(F.linear(x, self.offset_weight.to(dtype), self.offset_bias.to(dtype)))
            logits = None
            if self.point_logit_weight is not None:
                weight, bias = self.point_logit_weight.to(dtype), self.point_logit_bias.to(dtype)
                logits = self._per_head(F.linear(x, weight, bias))
        return offsets * self.offset_scale, logits

    def attend_inputs(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """The offsets (and point logits of the linear mode) come from the query tokens' hidden states."""
        offsets, point_logits = self.predict_offsets(hidden_states)
        return {"offsets": offsets, "point_logits": point_logits}

    def key_span(
        self, key_valid: torch.Tensor | None, batch: int, num_keys: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """First and last real key `(B,)` of every sample (last < first for a sample without real keys)."""
        if key_valid is None:
            return torch.zeros(batch, device=device), torch.full((batch,), num_keys - 1.0, device=device)
        index = torch.arange(num_keys, device=device)
        first = torch.where(key_valid, index, num_keys).amin(-1)
        last = torch.where(key_valid, index, -1).amax(-1)
        return first.float(), last.float()

    @staticmethod
    def real_neighbours(key_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For every key position `j`, the nearest real key at or before `j` and at or after `j`, `(B, Nk)` long
        each (-1 / `Nk` where there is none)."""
        num_keys = key_valid.shape[-1]
        index = torch.arange(num_keys, device=key_valid.device).expand_as(key_valid)
        before = torch.where(key_valid, index, -1).cummax(-1).values
        after = torch.where(key_valid, index, num_keys).flip(-1).cummin(-1).values.flip(-1)
        return before, after

    def sample_positions(
        self, offsets: torch.Tensor, key_valid: torch.Tensor | None, num_keys: int, query_offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Selection step: bounded positions and their interpolation structure.

        Args:
            offsets (`torch.Tensor` of shape `(B, H, Nq, K)`): offsets in tokens from the meta position.
            key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): real keys (any pattern, holes included).
            num_keys (`int`): key length `Nk`.
            query_offset (`int`): absolute index of the first query (cached keys before it).

        Returns:
            positions `(B, H, Nq, K)` (float, differentiable), `i0`, `i1` `(B, H, Nq, K)` (long: the nearest real
            keys at or before / after the position, `i0 <= position <= i1`, equal when the position is on the last
            allowed key), `row_valid` `(B, 1, Nq, 1)` (bool: the query has at least one key to look at). The
            interpolation weight of `i1` is `(position - i0) / max(i1 - i0, 1)` (see :meth:`interpolation_weight`).
        """
        B, _, Nq, _ = offsets.shape
        first, last = self.key_span(key_valid, B, num_keys, offsets.device)
        meta = (torch.arange(Nq, device=offsets.device) + query_offset).float().view(1, 1, Nq, 1)
        lo = first.view(B, 1, 1, 1)
        hi = last.view(B, 1, 1, 1)
        if self.is_causal:
            hi = torch.minimum(hi, meta)  # never the future
        row_valid = hi >= lo  # (B, 1, Nq or 1, 1)
        lo = torch.where(row_valid, lo, 0.0)
        hi = torch.where(row_valid, hi, 0.0)
        raw = meta + offsets
        if self.config.position_bound == "clamp":
            positions = torch.clamp(raw, lo, hi)
        else:
            span = hi - lo
            folded = torch.remainder(raw - lo, torch.clamp(2.0 * span, min=1.0))
            positions = torch.where(span > 0, lo + span - (span - folded).abs(), lo)
        floor = torch.minimum(positions.detach().floor(), hi).long()  # in [lo, hi]
        if key_valid is None:
            return positions, floor, torch.minimum(floor + 1, hi.long()), row_valid.expand(B, 1, Nq, 1)
        before, after = self.real_neighbours(key_valid)
        shape = floor.shape
        flat = floor.reshape(B, -1)
        i0 = before.gather(1, flat).view(shape).clamp(min=0)  # a real key: `lo` is one and lo <= floor
        # The right neighbour of the interval `[floor, floor + 1)`, which is `floor` itself only on the last key.
        nxt = torch.minimum(flat + 1, torch.full_like(flat, num_keys - 1))
        i1 = after.gather(1, nxt).view(shape)
        # Past the last allowed key (the end of the span, or the query itself when causal) only i0 remains.
        i1 = torch.where(i1 > hi.long(), i0, i1)
        return positions, i0, i1, row_valid.expand(B, 1, Nq, 1)

    @staticmethod
    def add_global_points(
        i0: torch.Tensor,
        i1: torch.Tensor,
        w1: torch.Tensor,
        point_logits: torch.Tensor | None,
        key_valid: torch.Tensor | None,
        g: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Append the `g` global keys as `g` more points on integer positions (both neighbours `j`, weight 0), so
        every query reads them in the same softmax as its own points; a padded global key gets a `-inf` logit. In
        the linear weight mode a global point's logit is 0 (it has no learned logit of its own).

        Returns:
            `i0`, `i1`, `w1` `(B, H, Nq, K + g)` and the point logits / bias `(B, H, Nq, K + g)` (or `None`).
        """
        i0, real = append_global_slots(i0, None, key_valid, g, as_set=False)
        i1 = torch.cat([i1, i0[..., -g:]], dim=-1)
        bias = None
        if point_logits is not None or key_valid is not None:
            own = torch.zeros_like(w1) if point_logits is None else point_logits.expand_as(w1)
            bias = F.pad(own, (0, g)).masked_fill(~real, float("-inf"))
        return i0, i1, F.pad(w1, (0, g)), bias

    @staticmethod
    def interpolation_weight(positions: torch.Tensor, i0: torch.Tensor, i1: torch.Tensor) -> torch.Tensor:
        """Weight of the right neighbour `i1` (differentiable in the positions): `(p - i0) / (i1 - i0)`, 0 when
        `i1 == i0`."""
        return torch.where(i1 > i0, (positions - i0) / (i1 - i0).clamp(min=1), 0.0)

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
        positions, i0, i1, row_valid = self.sample_positions(offsets, key_valid, num_keys, query_offset)
        w1 = self.interpolation_weight(positions, i0, i1)  # carries the position gradient
        logit_bias = point_logits
        g = self.global_positions(num_keys)
        if g:
            i0, i1, w1, logit_bias = self.add_global_points(i0, i1, w1, logit_bias, key_valid, g)
        if not bool(row_valid.all()):
            # Rows without any real key: -inf on every point gives exact zeros.
            empty = torch.zeros(row_valid.shape, device=q.device).masked_fill(~row_valid, float("-inf"))
            logit_bias = empty if logit_bias is None else logit_bias + empty
        keep = None
        if self.training and self.dropout > 0:
            keep = sample_keep_mask(tuple(i0.shape), self.dropout, q.device)
        kwargs = {
            "logit_bias": None if logit_bias is None else logit_bias.expand(i0.shape),
            "dot_product": point_logits is None,
            "scale": self.scaling,
            "keep": keep,
            "dropout_p": self.dropout,
        }
        weights = None
        # Returned weights are part of the graph (a user may differentiate through them), as in the other families.
        if output_attentions:
            out, weights = interpolated_attention_reference(q, k, v, i0, i1, w1, **kwargs)
        else:
            # A point reads its two neighbours: one gathered slot of two entries weighted 1 - w1 and w1.
            neighbours, mix = torch.stack((i0, i1), -1), torch.stack((1.0 - w1, w1), -1)  # (B, H, Nq, K, 2)
            out = gathered_attention(q, k, v, neighbours, weight=mix, backend=self.config.attention_backend, **kwargs)
        return AttentionOutput(
            hidden_states=out,
            attn_weights=weights if output_attentions else None,
            density=self._density(i0, i1, w1, row_valid, key_valid, num_keys),
        )

    @torch.no_grad()
    def _density(self, i0, i1, w1, row_valid, key_valid, num_keys) -> torch.Tensor:
        """`(B, H)`: distinct keys with non-zero weight per query / real keys of the sample, averaged over queries."""
        keys = torch.cat((i0.masked_fill(w1 >= 1, -1), i1.masked_fill(w1 <= 0, -1)), -1).sort(-1).values
        distinct = ((keys[..., 1:] != keys[..., :-1]) & (keys[..., 1:] >= 0)).sum(-1) + (keys[..., 0] >= 0).long()
        real = float(num_keys) if key_valid is None else key_valid.sum(-1).clamp(min=1).float().view(-1, 1, 1)
        frac = distinct.float() / real  # (B, H, Nq)
        rows = row_valid[..., 0].expand_as(frac)
        if key_valid is not None:
            # Padded queries (the last Nq keys are the queries in self-attention) do not count.
            rows = rows & key_valid[:, None, -frac.shape[-1] :]
        return (frac * rows).sum(2) / rows.sum(2).clamp(min=1)

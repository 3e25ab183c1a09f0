"""Interpolated attention: every query attends to K points at fractional key positions offset from itself.

The primitive behind A²-Former. Point `s` of query `i` (absolute index `i + query_offset`) sits at
`p = i + query_offset + offsets[i, s]`, bounded to the allowed keys: the span `[first, last]` of the sample's real
keys, and never past the query itself when causal (`"clamp"` stops a point at the ends, `"reflect"` mirrors it back).
It reads the two real keys around `p`, `i0 <= p <= i1` (holes in the key mask are bridged: the nearest real key on
either side), mixed with the weights `1 - w1` and `w1`, `w1 = (p - i0) / (i1 - i0)`. The `g` global keys (the first
`g` positions, `core.global_tokens`) are `g` more slots on integer positions. The slot logits are `scale * <q, k~>`
(or learned point logits, 0 for the global slots), the softmax runs over the K + g slots of the query, dropout
multiplies the probabilities, and `out = sum_s p_s v~_s`. Gradients reach q, k, v, the offsets (through `w1`) and the
point logits. A query without any allowed key outputs zeros. On request the primitive also computes the global
queries' rows (dense attention over every real key, replacing the method's rows of the real ones).

This module holds the torch implementation, which materialises the selection (`(B, H, Nq, K + g)` neighbour indices
and weights) and feeds it to gathered attention with two weighted entries per slot: it is the truth the fused Triton
kernel ([`attnzoo.kernels.triton.interpolated`]) is tested against, and the CPU path.
[`attnzoo.kernels.dispatch.interpolated_attention`] picks between them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .gathered import gathered_attention_reference_with_mask, gathered_attention_with_mask
from .global_rows import replace_global_rows, row_settings

#: How points beyond the allowed keys are brought back (values of `A2FormerConfig.position_bound`).
POSITION_BOUNDS = ("clamp", "reflect")


def check_interpolated(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    point_logits: Tensor | None,
    key_valid: Tensor | None,
    num_global: int,
    position_bound: str,
    query_offset: int,
    keep: Tensor | None,
    causal: bool = False,
    global_rows: bool = False,
) -> None:
    """Raise `ValueError` unless the inputs of interpolated attention fit (shape and dtype checks only: no sync)."""
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"expected q (B,H,Nq,d), k/v (B,H,Nk,d), got {tuple(q.shape)}, {tuple(k.shape)}")
    if offsets.dim() != 4 or offsets.shape[:3] != q.shape[:3] or not offsets.is_floating_point():
        raise ValueError(
            f"offsets must be floating point of shape (B,H,Nq,K) = {tuple(q.shape[:3])} + (K,), got {offsets.dtype} "
            f"{tuple(offsets.shape)}"
        )
    if point_logits is not None and point_logits.shape != offsets.shape:
        raise ValueError(
            f"point_logits must have the shape of offsets {tuple(offsets.shape)}, got {point_logits.shape}"
        )
    B, _, Nq, _ = q.shape
    Nk = k.shape[2]
    if key_valid is not None and (key_valid.dtype != torch.bool or tuple(key_valid.shape) != (B, Nk)):
        raise ValueError(f"key_valid must be bool of shape {(B, Nk)}, got {key_valid.dtype} {tuple(key_valid.shape)}")
    if not 0 <= num_global <= Nk:
        raise ValueError(f"num_global must be in [0, Nk = {Nk}], got {num_global}")
    if position_bound not in POSITION_BOUNDS:
        raise ValueError(f"position_bound must be one of {POSITION_BOUNDS}, got {position_bound!r}")
    if query_offset < 0:
        raise ValueError(f"query_offset must be non-negative, got {query_offset}")
    slots = (*offsets.shape[:3], offsets.shape[3] + num_global)
    if keep is not None and (keep.dtype != torch.bool or tuple(keep.shape) != slots):
        raise ValueError(f"keep must be bool of shape {slots} (K points + g global slots), got {tuple(keep.shape)}")
    if Nk == 0 and Nq > 0:
        raise ValueError("k and v have no key rows (Nk = 0): interpolated attention needs a key to read")
    # The global queries are the first `g` tokens of an encoder self-attention: query i is key i, and all g are there.
    if global_rows and num_global and (causal or query_offset or Nq < num_global):
        raise ValueError(
            f"global_rows needs non-causal queries from key 0 on (query_offset 0), at least num_global = {num_global} "
            f"of them, got causal={causal}, query_offset={query_offset}, Nq={Nq}"
        )


def key_span(key_valid: Tensor | None, batch: int, num_keys: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """First and last real key `(B,)` (float) of every sample (last < first for a sample without real keys)."""
    if key_valid is None:
        return torch.zeros(batch, device=device), torch.full((batch,), num_keys - 1.0, device=device)
    index = torch.arange(num_keys, device=device)
    first = torch.where(key_valid, index, num_keys).amin(-1)
    last = torch.where(key_valid, index, -1).amax(-1)
    return first.float(), last.float()


def real_neighbours(key_valid: Tensor) -> tuple[Tensor, Tensor]:
    """For every key position `j`, the nearest real key at or before `j` and at or after `j`, `(B, Nk)` long each
    (-1 / `Nk` where there is none)."""
    num_keys = key_valid.shape[-1]
    index = torch.arange(num_keys, device=key_valid.device).expand_as(key_valid)
    before = torch.where(key_valid, index, -1).cummax(-1).values
    after = torch.where(key_valid, index, num_keys).flip(-1).cummin(-1).values.flip(-1)
    return before, after


def interpolation_points(
    offsets: Tensor,
    key_valid: Tensor | None,
    num_keys: int,
    *,
    causal: bool = False,
    query_offset: int = 0,
    position_bound: str = "clamp",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Selection step: bounded positions and their interpolation structure.

    Args:
        offsets (`torch.Tensor` of shape `(B, H, Nq, K)`): offsets in tokens from the query's own index.
        key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): real keys (any pattern, holes included).
        num_keys (`int`): key length `Nk`.
        causal (`bool`): bound the points to the past (the query itself included).
        query_offset (`int`): absolute index of the first query (cached keys before it).
        position_bound (`str`): `"clamp"` or `"reflect"`.

    Returns:
        positions `(B, H, Nq, K)` (float, differentiable), `i0`, `i1` `(B, H, Nq, K)` (long: the nearest real keys
        at or before / after the position, `i0 <= position <= i1`, equal when the position is on the last allowed
        key), `row_valid` `(B, 1, Nq, 1)` (bool: the query has at least one key to look at). The interpolation
        weight of `i1` is [`interpolation_weight`].
    """
    B, _, Nq, _ = offsets.shape
    first, last = key_span(key_valid, B, num_keys, offsets.device)
    meta = (torch.arange(Nq, device=offsets.device) + query_offset).to(offsets.dtype).view(1, 1, Nq, 1)
    lo = first.to(offsets.dtype).view(B, 1, 1, 1)
    hi = last.to(offsets.dtype).view(B, 1, 1, 1)
    if causal:
        hi = torch.minimum(hi, meta)  # never the future
    row_valid = hi >= lo  # (B, 1, Nq or 1, 1)
    lo = torch.where(row_valid, lo, 0.0)
    hi = torch.where(row_valid, hi, 0.0)
    raw = meta + offsets
    if position_bound == "clamp":
        positions = torch.clamp(raw, lo, hi)
    else:
        span = hi - lo
        folded = torch.remainder(raw - lo, torch.clamp(2.0 * span, min=1.0))
        positions = torch.where(span > 0, lo + span - (span - folded).abs(), lo)
    floor = torch.minimum(positions.detach().floor(), hi).long()  # in [lo, hi]
    row_valid = row_valid.expand(B, 1, Nq, 1)
    if key_valid is None:
        return positions, floor, torch.minimum(floor + 1, hi.long()), row_valid
    before, after = real_neighbours(key_valid)
    shape = floor.shape
    flat = floor.reshape(B, -1)
    i0 = before.gather(1, flat).view(shape).clamp(min=0)  # a real key: `lo` is one and lo <= floor
    # The right neighbour of the interval `[floor, floor + 1)`, which is `floor` itself only on the last key.
    nxt = torch.minimum(flat + 1, torch.full_like(flat, num_keys - 1))
    i1 = after.gather(1, nxt).view(shape)
    # Past the last allowed key (the end of the span, or the query itself when causal) only i0 remains.
    i1 = torch.where(i1 > hi.long(), i0, i1)
    return positions, i0, i1, row_valid


def interpolation_weight(positions: Tensor, i0: Tensor, i1: Tensor) -> Tensor:
    """Weight of the right neighbour `i1` (differentiable in the positions): `(p - i0) / (i1 - i0)`, 0 when
    `i1 == i0`."""
    return torch.where(i1 > i0, (positions - i0) / (i1 - i0).clamp(min=1), 0.0)


def interpolated_slots(
    offsets: Tensor,
    point_logits: Tensor | None,
    key_valid: Tensor | None,
    num_keys: int,
    *,
    num_global: int = 0,
    causal: bool = False,
    query_offset: int = 0,
    position_bound: str = "clamp",
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """The K points and the `g` global keys of every query as slots of two weighted neighbours.

    The global keys are `g` more points on integer positions (both neighbours `j`, weight 0), read in the same
    softmax as the query's own points; a padded global key gets a `-inf` logit, and so does every slot of a query
    without any allowed key (its output is then exactly zero). A global slot's point logit is 0.

    Returns:
        `i0`, `i1` (long), `w1` (float, differentiable) of shape `(B, H, Nq, K + g)`, the slot logit bias
        `(B, H, Nq, K + g)` (the point logits, -inf on the slots to drop; `None` when there is neither) and
        `row_valid` `(B, 1, Nq, 1)`.
    """
    positions, i0, i1, row_valid = interpolation_points(
        offsets, key_valid, num_keys, causal=causal, query_offset=query_offset, position_bound=position_bound
    )
    w1 = interpolation_weight(positions, i0, i1)  # carries the position gradient
    B, H, Nq, K = offsets.shape
    bias = point_logits
    if num_global:
        globals_ = torch.arange(num_global, device=offsets.device).expand(B, H, Nq, num_global)
        i0 = torch.cat([i0, globals_], dim=-1)
        i1 = torch.cat([i1, globals_], dim=-1)
        w1 = F.pad(w1, (0, num_global))
        if bias is not None:
            bias = F.pad(bias, (0, num_global))
    if key_valid is not None:
        # -inf on the padded global keys and on every slot of a query without an allowed key (row_valid can only
        # be False where keys are masked), added without asking the device which rows those are.
        allowed = row_valid  # (B, 1, Nq, 1)
        if num_global:
            real_global = key_valid[:, None, None, :num_global]  # (B, 1, 1, g)
            allowed = allowed & torch.cat([real_global.new_ones(B, 1, 1, K), real_global], dim=-1)
        shape = (B, 1, Nq, K + num_global)
        dropped = torch.zeros(shape, dtype=offsets.dtype, device=offsets.device).masked_fill(~allowed, float("-inf"))
        bias = dropped if bias is None else bias + dropped
    return i0, i1, w1, bias, row_valid


def interpolated_density(
    i0: Tensor, i1: Tensor, w1: Tensor, bias: Tensor | None, row_valid: Tensor, key_valid: Tensor | None, num_keys: int
) -> Tensor:
    """`(B, H)`: distinct keys with non-zero weight per query / real keys of the sample, averaged over the real
    queries that have a key (the last `Nq` keys are the queries, as in self-attention).

    Args:
        i0, i1, w1, bias, row_valid: the slots of [`interpolated_slots`] (a slot whose bias is -inf has no weight).
        key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): real keys.
        num_keys (`int`): key length `Nk`.
    """
    with torch.no_grad():
        used = torch.ones_like(w1, dtype=torch.bool) if bias is None else (bias > float("-inf")).expand_as(w1)
        left = i0.masked_fill((w1 >= 1) | ~used, -1)
        right = i1.masked_fill((w1 <= 0) | ~used, -1)
        keys = torch.cat((left, right), -1).sort(-1).values
        distinct = ((keys[..., 1:] != keys[..., :-1]) & (keys[..., 1:] >= 0)).sum(-1) + (keys[..., 0] >= 0).long()
        num_queries = i0.shape[2]
        rows = row_valid[..., 0].expand_as(distinct)  # (B, H, Nq)
        if key_valid is None:
            frac = distinct.float() / max(num_keys, 1)
        else:
            frac = distinct.float() / key_valid.sum(-1).clamp(min=1).float().view(-1, 1, 1)
            rows = rows & key_valid[:, None, num_keys - num_queries :]
        return (frac * rows).sum(2) / rows.sum(2).clamp(min=1)


def interpolated_attention_torch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    point_logits: Tensor | None = None,
    key_valid: Tensor | None = None,
    causal: bool = False,
    query_offset: int = 0,
    position_bound: str = "clamp",
    num_global: int = 0,
    global_rows: bool = False,
    scale: float | None = None,
    keep: Tensor | None = None,
    dropout_p: float = 0.0,
    global_seed: Tensor | None = None,
    reference: bool = True,
) -> tuple[Tensor, Tensor]:
    """Torch implementation of [`attnzoo.kernels.dispatch.interpolated_attention`] (arguments as there): the slots
    of [`interpolated_slots`] through gathered attention with two weighted entries per slot, by gather + einsum
    (`reference=True`, the plain-autograd truth) or by the CSR kernels (`reference=False`).

    Returns:
        The output `(B, H, Nq, d)` and the density `(B, H)` of [`interpolated_density`].
    """
    i0, i1, w1, bias, row_valid = interpolated_slots(
        offsets,
        point_logits,
        key_valid,
        k.shape[2],
        num_global=num_global,
        causal=causal,
        query_offset=query_offset,
        position_bound=position_bound,
    )
    # A point reads its two neighbours: one gathered slot of two entries weighted 1 - w1 and w1.
    neighbours, mix = torch.stack((i0, i1), -1), torch.stack((1.0 - w1, w1), -1)  # (B, H, Nq, K + g, 2)
    function = gathered_attention_reference_with_mask if reference else gathered_attention_with_mask
    out = function(
        q,
        k,
        v,
        neighbours,
        None,
        scale=scale,
        keep=keep,
        dropout_p=dropout_p,
        weight=mix,
        logit_bias=None if bias is None else bias.expand(i0.shape),
        dot_product=point_logits is None,
    )
    density = interpolated_density(i0, i1, w1, bias, row_valid, key_valid, k.shape[2])
    if global_rows and num_global:
        out = replace_global_rows(out, q, k, v, key_valid, num_global, **row_settings(scale, dropout_p, global_seed))
    return out, density

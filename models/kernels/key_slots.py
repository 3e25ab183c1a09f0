"""Key-slot attention: every key names, in `S` fixed slots, the queries that attend to it (FSAT's predicted edges).

Slot `s` of key `j` (of batch `b`, head `h`) holds a query position `i = query[b, h, j, s]`, or -1 when the slot is
dropped, and a continuous prediction `mean[b, h, j, s]`. A live slot is the edge `(i -> j)` with the Gaussian
confidence `rho = exp(-(i - mean)^2 / (2 var))` (divided by `sqrt(2 pi var)` when normalised), whose gradient
reaches `mean` only (the index is a constant), truncated to `(-inf, 0]` on request. The first `num_graph_slots` slots
of a key are the graph's, the others exploration. The first `g` keys are global: every real query reads every real one
(confidence 1), and their own slots are ignored, so that each of their pairs enters once. Each query has one softmax
per group (the graph; the exploration slots; with
`global_softmax="own"` the global keys, which otherwise join the graph's), its output is the sum over the groups of
`sum_e dropout(softmax(scale <q_i, k_j>))_e rho_e v_j`. Duplicate edges count separately.
With `global_rows`, the rows of the real global queries (the first `g`) are then replaced by dense attention over
every real key, as `ZooAttention.with_global_rows` does (the method's output at a replaced row gets no gradient).

The fixed layout needs no compaction (no host sync, static shapes): the slots *are* the key-major order, and one sort
of their query rows gives the query-major order. The implementations (dispatch in [`attnzoo.kernels.dispatch`]):
this module's [`key_slot_attention_torch`] compacts the live slots into an edge list with one virtual query row per
(query, group) and runs the edge-list kernels (plain autograd for the reference, the CSR Functions on CPU); the
Triton one ([`attnzoo.kernels.triton.key_slots`]) keeps the groups' softmaxes and the confidences in registers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .edgelist import check_one_dtype, edge_attention_reference_with_mask, edge_attention_with_mask
from .global_rows import replace_global_rows, row_settings
from .indexing import flatten_heads, unflatten_heads

#: Values of `global_softmax`: the global keys in a softmax of their own, or in the graph's.
GLOBAL_SOFTMAXES = ("own", "shared")


class _TruncatePositiveGradient(torch.autograd.Function):
    """Identity forward; the backward keeps only the non-positive part of the incoming gradient."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.clamp(max=0.0)


def truncate_positive_gradient(x: Tensor) -> Tensor:
    """FSAT's gradient truncation: identity, but `dL/dx` is clipped to `(-inf, 0]` on the way back.

    A negative gradient on a confidence means "this edge helped": the predicted position moves towards it. Positive
    gradients would push the prediction around without pointing at a better query, so they are dropped.
    """
    return _TruncatePositiveGradient.apply(x)


def real_positions_first(valid: Tensor) -> Tensor:
    """`(B, N)` int64: each example's positions with its real tokens first, in order (a stable sort), so that rank
    `r` below the example's number of real tokens names its `r`-th real token whatever the padding (the exploration
    slots' uniform draw over the real queries).

    Args:
        valid (`torch.BoolTensor` of shape `(B, N)`): real tokens.
    """
    return torch.sort((~valid).to(torch.int8), dim=-1, stable=True)[1]


def gaussian_confidence(index: Tensor, mean: Tensor, variance: float, normalized: bool) -> Tensor:
    """`rho(index | mean, variance)`: Gaussian density of the (constant) integer index around the prediction.

    The index is a constant of the density, so the gradient reaches only `mean` (the reparameterisation of the
    discrete choice): `d rho / d mean = rho * (index - mean) / variance`.
    """
    out = torch.exp(-((index - mean) ** 2) / (2.0 * variance))
    return out / math.sqrt(2.0 * math.pi * variance) if normalized else out


def check_key_slots(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    query: Tensor,
    mean: Tensor,
    key_valid: Tensor | None,
    num_graph_slots: int,
    num_global: int,
    global_softmax: str,
    slot_keep: Tensor | None,
    global_keep: Tensor | None,
    global_rows: bool = False,
) -> None:
    """Raise a `ValueError` / `TypeError` / `IndexError` naming what is wrong with the arguments of
    [`attnzoo.kernels.key_slot_attention`]. Reads the slots on the host on a CPU only (a sync on an accelerator)."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            f"q, k and v must share one shape (B, H, N, d), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_one_dtype(q, k, v)
    B, H, N, _ = q.shape
    if query.dim() != 4 or tuple(query.shape[:3]) != (B, H, N):
        raise ValueError(f"query must have shape (B, H, N, S) = ({B}, {H}, {N}, S), got {tuple(query.shape)}")
    if query.dtype != torch.int32:
        raise TypeError(f"query must be int32 (-1 for a dropped slot), got {query.dtype}")
    if mean.shape != query.shape or not mean.is_floating_point():
        raise ValueError(f"mean must be a float tensor of the shape of query {tuple(query.shape)}, got "
                         f"{tuple(mean.shape)} {mean.dtype}")  # fmt: skip
    if key_valid is not None and (key_valid.dtype != torch.bool or tuple(key_valid.shape) != (B, N)):
        raise ValueError(f"key_valid must be a bool tensor of shape ({B}, {N}), got {tuple(key_valid.shape)} "
                         f"{key_valid.dtype}")  # fmt: skip
    if not 0 <= num_graph_slots <= query.shape[-1]:
        raise ValueError(f"num_graph_slots must be in [0, {query.shape[-1]}], got {num_graph_slots}")
    if not 0 <= num_global <= N:
        raise ValueError(f"num_global must be in [0, {N}], got {num_global}")
    if not isinstance(global_rows, bool):
        raise ValueError(f"global_rows must be a bool (it replaces the first num_global rows), got {global_rows!r}")
    if global_softmax not in GLOBAL_SOFTMAXES:
        raise ValueError(f"global_softmax must be one of {GLOBAL_SOFTMAXES}, got {global_softmax!r}")
    keeps = (("slot_keep", slot_keep, query.shape), ("global_keep", global_keep, (B, H, N, num_global)))
    for name, keep, shape in keeps:
        if keep is not None and (keep.dtype != torch.bool or tuple(keep.shape) != tuple(shape)):
            raise ValueError(f"{name} must be a bool tensor of shape {tuple(shape)}, got {tuple(keep.shape)} "
                             f"{keep.dtype}")  # fmt: skip
    if query.device.type == "cpu" and query.numel() > 0 and (int(query.min()) < -1 or int(query.max()) >= N):
        raise IndexError(f"query positions must be in [0, {N}) or -1 (dropped)")


def key_slot_edges(query: Tensor, num_global: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The live slots as a flat edge list (a compaction: a host sync on an accelerator).

    Args:
        query (`torch.IntTensor` of shape `(B, H, N, S)`): query position of every slot, -1 when dropped.
        num_global (`int`, *optional*, defaults to 0): the slots of the first `g` keys are not live.

    Returns:
        `live` (`torch.BoolTensor` of shape `(B, H, N, S)`), and per live slot in key-major order: `rows` and `cols`
        (`torch.LongTensor` of shape `(E,)`, the flat query and key rows `(b*H + h)*N + i` and `... + j`), `slot`
        (`torch.LongTensor` of shape `(E,)`, the slot index `s`).
    """
    B, H, N, S = query.shape
    live = query >= 0
    if num_global:
        live = live & (torch.arange(N, device=query.device) >= num_global).view(1, 1, N, 1)
    base = (torch.arange(B * H, device=query.device) * N).view(B, H, 1, 1)
    rows = (base + query)[live]
    cols = (base + torch.arange(N, device=query.device).view(1, 1, N, 1)).expand(B, H, N, S)[live]
    slot = torch.arange(S, device=query.device).expand(B, H, N, S)[live]
    return live, rows, cols, slot


def key_slot_pair_count(query: Tensor, key_valid: Tensor | None, num_global: int) -> Tensor:
    """Number of distinct `(query, key)` pairs joined by a live slot or a global edge, per (batch, head): `(B, H)`
    float. Duplicates can only share a key, so they are found among each key's own slots (no host sync)."""
    B, H, N, _ = query.shape
    ordered = query[:, :, num_global:].sort(dim=-1).values  # (B, H, N - g, S): each key's queries, dropped first
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    count = ((ordered >= 0) & first).sum((-1, -2), dtype=torch.float32)  # (B, H)
    if num_global:
        if key_valid is None:
            return count + float(N * num_global)
        real = key_valid.sum(-1, dtype=torch.float32) * key_valid[:, :num_global].sum(-1, dtype=torch.float32)
        count = count + real[:, None]  # every real query reads every real global key
    return count


def key_slot_attention_torch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    query: Tensor,
    mean: Tensor,
    *,
    num_graph_slots: int,
    num_global: int,
    global_softmax: str,
    key_valid: Tensor | None,
    variance: float,
    normalized: bool,
    truncate: bool,
    scale: float | None,
    slot_keep: Tensor | None,
    global_keep: Tensor | None,
    dropout_p: float,
    reference: bool,
    global_rows: bool = False,
    global_seed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """[`attnzoo.kernels.key_slot_attention`] through the edge-list kernels: the live slots and the global pairs as
    one edge list, query row `group * B*H*N + row` per softmax group, the queries repeated once per group; with
    `global_rows`, [`~attnzoo.kernels.global_rows.replace_global_rows`] after them (the method's output at a
    replaced row then gets no gradient).

    Args:
        reference (`bool`): the plain-autograd edge kernel (the truth), else the CSR Functions.

    Returns:
        The output `(B, H, N, d)` and the distinct pair count `(B, H)` ([`key_slot_pair_count`]).
    """
    B, H, N, S = query.shape
    num_rows = B * H * N
    live, rows, cols, slot = key_slot_edges(query, num_global)
    conf = gaussian_confidence(query[live].to(mean.dtype), mean[live], variance, normalized)
    if truncate:
        conf = truncate_positive_gradient(conf)
    explore = num_graph_slots < S
    own = num_global > 0 and global_softmax == "own"
    group = (slot >= num_graph_slots).long() if explore else torch.zeros_like(slot)
    keep = None if slot_keep is None else slot_keep[live]
    if num_global:
        real_query = torch.ones(B, N, dtype=torch.bool, device=q.device) if key_valid is None else key_valid
        real_key = real_query[:, :num_global]
        pairs = (real_query[:, None, :, None] & real_key[:, None, None, :]).expand(B, H, N, num_global)
        base = (torch.arange(B * H, device=q.device) * N).view(B, H, 1, 1)
        g_rows = (base + torch.arange(N, device=q.device).view(1, 1, N, 1)).expand_as(pairs)[pairs]
        g_cols = (base + torch.arange(num_global, device=q.device).view(1, 1, 1, -1)).expand_as(pairs)[pairs]
        rows, cols = torch.cat([rows, g_rows]), torch.cat([cols, g_cols])
        conf = torch.cat([conf, torch.ones(g_rows.shape, dtype=conf.dtype, device=conf.device)])
        g_group = 1 + explore if own else 0
        group = torch.cat([group, torch.full_like(g_rows, g_group)])
        if keep is not None:
            keep = torch.cat([keep, global_keep[pairs]])
    num_groups = 1 + explore + own
    q_flat = flatten_heads(q)
    if num_groups > 1:
        rows = rows + group * num_rows
        q_flat = q_flat.repeat(num_groups, 1)  # (G*B*H*N, d)
    kwargs = {"logit_bias": None, "edge_weight": conf, "scale": scale, "keep": keep, "dropout_p": dropout_p}
    k_flat, v_flat = flatten_heads(k), flatten_heads(v)
    if reference:
        flat = edge_attention_reference_with_mask(q_flat, k_flat, v_flat, rows, cols, **kwargs)
    else:
        flat = edge_attention_with_mask(q_flat, k_flat, v_flat, rows, cols, sorted_rows=False, **kwargs)
    flat = flat.view(num_groups, num_rows, -1).sum(0)  # per query: the sum of its groups' outputs
    out = unflatten_heads(flat, B, H, N)
    if global_rows and num_global:
        out = replace_global_rows(out, q, k, v, key_valid, num_global, **row_settings(scale, dropout_p, global_seed))
    return out, key_slot_pair_count(query, key_valid, num_global)

"""Gathered attention: every query row attends to its own K key slots (plain reference and CSR torch path).

A slot is one key row (Smart Bird's sampled keys) or a weighted mix of J key rows (A²-Former's interpolation
between two neighbours). The public entry point with backend dispatch is [`attnzoo.kernels.gathered_attention`].
"""

from __future__ import annotations

import torch
from torch import Tensor

from .csr import sparse_kernels_available
from .dropout import keep_multiplier
from .edgelist import check_one_dtype, edge_attention_with_mask
from .indexing import batch_head_offsets, flatten_heads, unflatten_heads
from .mixed_slots import MixedSlotAttentionFunction, slot_softmax


def check_gathered(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    valid: Tensor | None,
    weight: Tensor | None = None,
    logit_bias: Tensor | None = None,
) -> None:
    """Raise `ValueError` (or `IndexError` for keys out of range) unless the inputs of gathered attention fit."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"expected q (B,H,Nq,d), k/v (B,H,Nk,d), got {tuple(q.shape)}, {tuple(k.shape)}")
    check_one_dtype(q, k, v)
    if idx.dtype != torch.int64 or idx.dim() not in (4, 5) or idx.shape[:3] != q.shape[:3]:
        raise ValueError(f"idx must be int64 of shape (B,H,Nq,K) or (B,H,Nq,K,J), got {idx.dtype} {tuple(idx.shape)}")
    slots = idx.shape[:4]
    if valid is not None and (valid.dtype != torch.bool or valid.shape != slots):
        raise ValueError(f"valid must be bool of shape {tuple(slots)}, got {valid.dtype} {tuple(valid.shape)}")
    if idx.dim() == 5 and weight is None:
        raise ValueError("idx with J entries per slot (B,H,Nq,K,J) needs `weight` of the same shape to mix them.")
    if weight is not None and weight.shape != idx.shape:
        raise ValueError(f"weight must have the shape of idx {tuple(idx.shape)}, got {tuple(weight.shape)}")
    if logit_bias is not None:
        try:
            fits = torch.broadcast_shapes(logit_bias.shape, slots) == slots  # to the slots, not merely with them
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"logit_bias must broadcast to {tuple(slots)}, got {tuple(logit_bias.shape)}")
    if k.shape[2] == 0 and idx.numel() > 0:  # a shape check, free on every device
        raise ValueError("k and v have no key rows (Nk = 0) but idx has slots: gathered attention needs a key to read")
    # The fast paths run without invariant checks: reject out-of-range keys on CPU, where the O(E) check costs no
    # host sync (accelerator kernels fault loudly instead).
    if idx.device.type == "cpu" and idx.numel() > 0:
        used = _safe_index(idx, valid)
        if int(used.min()) < 0 or int(used.max()) >= k.shape[2]:
            raise IndexError(f"idx out of range [0, {k.shape[2]}) in a valid slot")


def _safe_index(idx: Tensor, valid: Tensor | None) -> Tensor:
    # Invalid slots may hold padding such as -1; point them at key 0 so every gather stays in range.
    if valid is None:
        return idx
    return idx.masked_fill(~(valid[..., None] if idx.dim() == 5 else valid), 0)


def _mixing(idx: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Entries as a `(B, H, Nq, K, J)` index and the weights (None: one entry of weight 1 per slot)."""
    if idx.dim() == 4:
        return idx[..., None], None if weight is None else weight[..., None]
    return idx, weight


def _slot_logits(bias: Tensor | None, valid: Tensor | None, shape, dtype: torch.dtype, device) -> Tensor | None:
    """Logit bias of every slot with `-inf` on invalid ones (None when there is neither)."""
    if bias is None and valid is None:
        return None
    out = torch.zeros(shape, dtype=dtype, device=device) if bias is None else bias.to(dtype).expand(shape)
    return out if valid is None else out.masked_fill(~valid, float("-inf"))


def gathered_attention_reference_with_mask(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    valid: Tensor | None,
    *,
    scale: float | None,
    keep: Tensor | None,
    dropout_p: float,
    weight: Tensor | None = None,
    logit_bias: Tensor | None = None,
    dot_product: bool = True,
) -> Tensor:
    """`torch.gather` + einsum implementation of [`gathered_attention`] with an explicit dropout keep-mask
    (correctness reference).

    Materialises `(B, H, Nq, K, J, d)` gathered keys and values. Arguments as in [`gathered_attention`]; `keep`
    (B, H, Nq, K) bool or None.
    """
    B, H, Nq, K = idx.shape[:4]
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    entries, weight = _mixing(_safe_index(idx, valid), weight)
    J = entries.shape[-1]
    flat_idx = entries.reshape(B, H, Nq * K * J, 1).expand(B, H, Nq * K * J, d)
    k_sel = torch.gather(k, 2, flat_idx).view(B, H, Nq, K, J, d)
    v_sel = torch.gather(v, 2, flat_idx).view(B, H, Nq, K, J, d)
    if weight is None:
        k_sel, v_sel = k_sel[..., 0, :], v_sel[..., 0, :]  # (B, H, Nq, K, d)
    else:
        k_sel = (weight.to(k.dtype)[..., None] * k_sel).sum(-2)
        v_sel = (weight.to(v.dtype)[..., None] * v_sel).sum(-2)
    scores = _slot_logits(logit_bias, valid, idx.shape[:4], q.dtype, q.device)
    if dot_product:
        dots = torch.einsum("bhnd,bhnkd->bhnk", q, k_sel) * scale  # (B, H, Nq, K)
        scores = dots if scores is None else scores + dots
    elif scores is None:
        scores = q.new_zeros(idx.shape[:4])
    # -inf rows (all slots invalid) would give NaN; shifting by a detached finite max keeps them at exp(-inf) = 0.
    probs = slot_softmax(scores)  # (B, H, Nq, K)
    if keep is not None:
        probs = probs * keep_multiplier(keep, dropout_p, probs.dtype)
    return torch.einsum("bhnk,bhnkd->bhnd", probs, v_sel)


def gathered_attention_with_mask(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    valid: Tensor | None,
    *,
    scale: float | None,
    keep: Tensor | None,
    dropout_p: float,
    weight: Tensor | None = None,
    logit_bias: Tensor | None = None,
    dot_product: bool = True,
    use_sparse: bool | None = None,
) -> Tensor:
    """CSR (torch) implementation of [`gathered_attention`] with an explicit dropout keep-mask (B, H, Nq, K) or None.

    Plain slots (one entry, no weight or bias) run on the CSR edge-attention Function with a fixed degree `K` per row
    (invalid slots become `-inf` logits, which keeps the pattern uniform and sync-free); mixed slots run on
    [`~attnzoo.kernels.mixed_slots.MixedSlotAttentionFunction`]. fp16/bf16 inputs are computed in fp32.

    Args:
        use_sparse (`bool`, *optional*): force the CSR kernels (`True`) or the gather/index_add fallback (`False`);
            default: CSR where torch has the kernels for the device and dtype.
    """
    B, H, Nq, K = idx.shape[:4]
    Nk = k.shape[2]
    if idx.dim() == 5 or weight is not None or logit_bias is not None or not dot_product:
        return _mixed_slot_attention(
            q, k, v, idx, valid, weight, logit_bias, dot_product, scale, keep, dropout_p, use_sparse
        )
    num_rows = B * H * Nq
    # Flat edges in row-major (b, h, i, slot) order: rows are sorted and every row has exactly K edges.
    rows = torch.arange(num_rows, device=idx.device).repeat_interleave(K)  # (E,)
    cols = (_safe_index(idx, valid) + batch_head_offsets(B, H, Nk, idx.device)[..., None]).reshape(-1)  # (E,)
    bias = _slot_logits(None, valid, idx.shape, torch.promote_types(q.dtype, torch.float32), q.device)
    out = edge_attention_with_mask(
        flatten_heads(q),
        flatten_heads(k),
        flatten_heads(v),
        rows,
        cols,
        logit_bias=None if bias is None else bias.reshape(-1),
        edge_weight=None,
        scale=scale,
        keep=None if keep is None else keep.reshape(-1),
        dropout_p=dropout_p,
        sorted_rows=True,
        degree=K if K > 0 else None,
        use_sparse=use_sparse,
    )
    return unflatten_heads(out, B, H, Nq)


def _mixed_slot_attention(q, k, v, idx, valid, weight, logit_bias, dot_product, scale, keep, dropout_p, use_sparse):
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    out_dtype = torch.result_type(q, v)
    compute_dtype = torch.promote_types(torch.promote_types(out_dtype, k.dtype), torch.float32)
    if use_sparse is None:
        use_sparse = sparse_kernels_available(q.device, compute_dtype)
    entries, weight = _mixing(_safe_index(idx, valid), weight)
    num_slots, J = entries.shape[3:]
    with torch.autocast(device_type=q.device.type, enabled=False):
        qf, kf, vf = (t.to(compute_dtype).reshape(-1, d).contiguous() for t in (q, k, v))
        if weight is None:
            weight = torch.ones(entries.shape, dtype=compute_dtype, device=q.device)
        rows = B * H * Nq  # spelled out: with no slot, reshape cannot infer -1 from 0 elements
        weight = weight.to(compute_dtype).reshape(rows, num_slots, J)
        bias = _slot_logits(logit_bias, valid, idx.shape[:4], compute_dtype, q.device)
        bias = None if bias is None else bias.reshape(rows, num_slots)
        mult = None if keep is None else keep_multiplier(keep, dropout_p, compute_dtype).reshape(rows, num_slots)
        cols = (entries + batch_head_offsets(B, H, Nk, q.device)[..., None, None]).reshape(rows, num_slots, J)
        out = MixedSlotAttentionFunction.apply(qf, kf, vf, weight, bias, mult, cols, scale, dot_product, use_sparse)
    return out.view(B, H, Nq, d).to(out_dtype)

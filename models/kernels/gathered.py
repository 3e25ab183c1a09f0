"""Gathered attention: every query row attends to its own K key slots."""

from __future__ import annotations

import torch
from torch import Tensor

from .dropout import keep_multiplier, sample_keep_mask
from .edgelist import edge_attention_with_mask
from .indexing import batch_head_offsets, flatten_heads, unflatten_heads


def _check_gathered(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, valid: Tensor | None) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"expected q (B,H,Nq,d), k/v (B,H,Nk,d), got {tuple(q.shape)}, {tuple(k.shape)}")
    if idx.dtype != torch.int64 or idx.dim() != 4 or idx.shape[:3] != q.shape[:3]:
        raise ValueError(f"idx must be int64 of shape (B,H,Nq,K), got {idx.dtype} {tuple(idx.shape)}")
    if valid is not None and (valid.dtype != torch.bool or valid.shape != idx.shape):
        raise ValueError(f"valid must be bool of shape {tuple(idx.shape)}, got {valid.dtype} {tuple(valid.shape)}")
    # The fast path runs CSR kernels without invariant checks: reject out-of-range keys on CPU, where the O(E)
    # check costs no host sync (accelerator kernels fault loudly instead).
    if idx.device.type == "cpu" and idx.numel() > 0:
        used = _safe_index(idx, valid)
        if int(used.min()) < 0 or int(used.max()) >= k.shape[2]:
            raise IndexError(f"idx out of range [0, {k.shape[2]}) in a valid slot")


def _keep_mask(idx: Tensor, dropout_p: float, training: bool) -> Tensor | None:
    if not training or dropout_p <= 0.0:
        return None
    return sample_keep_mask(tuple(idx.shape), dropout_p, idx.device)


def _safe_index(idx: Tensor, valid: Tensor | None) -> Tensor:
    # Invalid slots may hold padding such as -1; point them at key 0 so every gather stays in range.
    return idx if valid is None else idx.masked_fill(~valid, 0)


def gathered_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    valid: Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """`torch.gather` + einsum implementation of [`gathered_attention`] (correctness reference).

    Materialises `(B, H, Nq, K, d)` gathered keys and values. Arguments and result as in [`gathered_attention`].
    """
    _check_gathered(q, k, v, idx, valid)
    keep = _keep_mask(idx, dropout_p, training)
    return gathered_attention_reference_with_mask(q, k, v, idx, valid, scale=scale, keep=keep, dropout_p=dropout_p)


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
) -> Tensor:
    """[`gathered_attention_reference`] with an explicit dropout keep-mask `keep` (B, H, Nq, K) bool or None."""
    B, H, Nq, K = idx.shape
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    flat_idx = _safe_index(idx, valid).reshape(B, H, Nq * K, 1).expand(B, H, Nq * K, d)
    k_sel = torch.gather(k, 2, flat_idx).view(B, H, Nq, K, d)
    v_sel = torch.gather(v, 2, flat_idx).view(B, H, Nq, K, d)
    scores = torch.einsum("bhnd,bhnkd->bhnk", q, k_sel) * scale  # (B, H, Nq, K)
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    # -inf rows (all slots invalid) would give NaN; shifting by a detached finite max keeps them at exp(-inf) = 0.
    rowmax = scores.detach().amax(-1, keepdim=True)
    ex = torch.exp(scores - torch.where(torch.isfinite(rowmax), rowmax, 0.0))
    den = ex.sum(-1, keepdim=True)
    probs = ex / torch.where(den > 0, den, 1.0)  # (B, H, Nq, K)
    if keep is not None:
        probs = probs * keep_multiplier(keep, dropout_p, probs.dtype)
    return torch.einsum("bhnk,bhnkd->bhnd", probs, v_sel)


def gathered_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    valid: Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Each query row attends to its own `K` key slots, softmax over the slots.

    Duplicate indices in a row count separately (deduplicate beforehand if that is not wanted). Invalid slots get
    no weight; rows with no valid slot output exact zeros. Runs on the CSR edge-attention Function with a fixed
    degree `K` per row (invalid slots become `-inf` logits, which keeps the pattern uniform and sync-free).

    Args:
        q (`torch.Tensor` of shape `(B, H, Nq, d)`): queries.
        k (`torch.Tensor` of shape `(B, H, Nk, d)`): keys.
        v (`torch.Tensor` of shape `(B, H, Nk, d)`): values.
        idx (`torch.LongTensor` of shape `(B, H, Nq, K)`): key positions in `[0, Nk)` (any value where invalid).
        valid (`torch.BoolTensor` of shape `(B, H, Nq, K)`, *optional*): slot validity, `None` means all valid.
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout on the attention probabilities.
        training (`bool`, *optional*, defaults to `False`): dropout is only applied when `True`.

    Returns:
        `torch.Tensor` of shape `(B, H, Nq, d)` in the dtype of `q`.
    """
    _check_gathered(q, k, v, idx, valid)
    keep = _keep_mask(idx, dropout_p, training)
    return gathered_attention_with_mask(q, k, v, idx, valid, scale=scale, keep=keep, dropout_p=dropout_p)


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
    use_sparse: bool | None = None,
) -> Tensor:
    """[`gathered_attention`] with an explicit dropout keep-mask `keep` (B, H, Nq, K) bool or None."""
    B, H, Nq, K = idx.shape
    Nk = k.shape[2]
    num_rows = B * H * Nq
    # Flat edges in row-major (b, h, i, slot) order: rows are sorted and every row has exactly K edges.
    rows = torch.arange(num_rows, device=idx.device).repeat_interleave(K)  # (E,)
    cols = (_safe_index(idx, valid) + batch_head_offsets(B, H, Nk, idx.device)[..., None]).reshape(-1)  # (E,)
    logit_bias = None
    if valid is not None:
        logit_bias = torch.zeros(idx.shape, dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
        logit_bias = logit_bias.masked_fill_(~valid, float("-inf")).reshape(-1)
    out = edge_attention_with_mask(
        flatten_heads(q),
        flatten_heads(k),
        flatten_heads(v),
        rows,
        cols,
        logit_bias=logit_bias,
        edge_weight=None,
        scale=scale,
        keep=None if keep is None else keep.reshape(-1),
        dropout_p=dropout_p,
        sorted_rows=True,
        degree=K if K > 0 else None,
        use_sparse=use_sparse,
    )
    return unflatten_heads(out, B, H, Nq)

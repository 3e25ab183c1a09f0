"""Edge-list attention with a per-row (segment) softmax: a plain-autograd reference and the fast CSR path."""

from __future__ import annotations

import torch
from torch import Tensor

from .csr import CSRAttentionFunction, row_pointers, sort_key, sparse_kernels_available
from .dropout import keep_multiplier, sample_keep_mask


def _check_edges(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, cols: Tensor, *edge_tensors: Tensor | None) -> None:
    if q.dim() != 2 or k.dim() != 2 or v.dim() != 2:
        raise ValueError(f"q, k, v must be 2-D (rows, d), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[0] != v.shape[0] or q.shape[1] != k.shape[1]:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if rows.dtype != torch.int64 or cols.dtype != torch.int64:
        raise TypeError("rows and cols must be int64")
    if rows.shape != cols.shape or rows.dim() != 1:
        raise ValueError(f"rows and cols must be 1-D of equal length, got {tuple(rows.shape)}, {tuple(cols.shape)}")
    for t in edge_tensors:
        if t is not None and t.shape != rows.shape:
            raise ValueError(f"per-edge tensors must have shape {tuple(rows.shape)}, got {tuple(t.shape)}")
    # The CSR kernels run without invariant checks, so an out-of-range index would read out of bounds. On CPU the
    # check is a cheap O(E) pass; on accelerators it would force a host sync, and the kernels fault loudly there.
    if rows.device.type == "cpu" and rows.numel() > 0:
        if int(rows.min()) < 0 or int(rows.max()) >= q.shape[0]:
            raise IndexError(f"rows out of range [0, {q.shape[0]})")
        if int(cols.min()) < 0 or int(cols.max()) >= k.shape[0]:
            raise IndexError(f"cols out of range [0, {k.shape[0]})")


def _keep_mask(num_edges: int, dropout_p: float, training: bool, device, generator) -> Tensor | None:
    if not training or dropout_p <= 0.0:
        return None
    return sample_keep_mask((num_edges,), dropout_p, device, generator)


def edge_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    cols: Tensor,
    *,
    logit_bias: Tensor | None = None,
    edge_weight: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    sorted_rows: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Gather / scatter implementation of [`edge_attention`] with plain autograd (correctness reference).

    Materialises `(E, d)` gathered rows; use [`edge_attention`] outside tests. Arguments and result are those of
    [`edge_attention`] (`sorted_rows` is accepted for signature parity and has no effect).
    """
    _check_edges(q, k, v, rows, cols, logit_bias, edge_weight)
    keep = _keep_mask(rows.shape[0], dropout_p, training, q.device, generator)
    return edge_attention_reference_with_mask(
        q,
        k,
        v,
        rows,
        cols,
        logit_bias=logit_bias,
        edge_weight=edge_weight,
        scale=scale,
        keep=keep,
        dropout_p=dropout_p,
    )


def edge_attention_reference_with_mask(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    cols: Tensor,
    *,
    logit_bias: Tensor | None,
    edge_weight: Tensor | None,
    scale: float | None,
    keep: Tensor | None,
    dropout_p: float,
) -> Tensor:
    """[`edge_attention_reference`] with an explicit dropout keep-mask `keep` (E,) bool (None = no dropout)."""
    num_rows = q.shape[0]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q[rows] * k[cols]).sum(-1) * scale  # (E,)
    if logit_bias is not None:
        scores = scores + logit_bias
    # Softmax is shift invariant, so the max needs no gradient; -inf (empty / fully masked rows) is replaced.
    rowmax = scores.new_full((num_rows,), float("-inf")).scatter_reduce(0, rows, scores.detach(), "amax")
    rowmax = torch.where(torch.isfinite(rowmax), rowmax, 0.0)
    ex = torch.exp(scores - rowmax[rows])
    den = scores.new_zeros(num_rows).index_add(0, rows, ex)
    probs = ex / torch.where(den > 0, den, 1.0)[rows]  # (E,)
    if keep is not None:
        probs = probs * keep_multiplier(keep, dropout_p, probs.dtype)
    if edge_weight is not None:
        probs = probs * edge_weight
    return v.new_zeros(num_rows, v.shape[-1]).index_add(0, rows, probs[:, None] * v[cols])  # (R, d)


def edge_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    cols: Tensor,
    *,
    logit_bias: Tensor | None = None,
    edge_weight: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    sorted_rows: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Attention restricted to an edge list, softmax over the edges of each query row.

    For edge `e = (rows[e], cols[e])`: `s_e = scale * <q[rows[e]], k[cols[e]]> + logit_bias[e]`, `a_e` = softmax of
    `s` over the edges sharing `rows[e]`, and `out[r] = sum_e dropout(a_e) * edge_weight[e] * v[cols[e]]`.
    Duplicate edges count separately; rows without edges (or whose logits are all -inf) output exact zeros.
    Runs as one CSR autograd Function (SDDMM, segment softmax, SpMM) with a hand-written O(E) backward. fp16/bf16
    inputs (e.g. under autocast) are computed in fp32 and cast back.

    Args:
        q (`torch.Tensor` of shape `(R, d)`): flattened query rows.
        k (`torch.Tensor` of shape `(C, d)`): flattened key rows.
        v (`torch.Tensor` of shape `(C, d)`): flattened value rows.
        rows (`torch.LongTensor` of shape `(E,)`): query row of each edge, in `[0, R)`.
        cols (`torch.LongTensor` of shape `(E,)`): key row of each edge, in `[0, C)`.
        logit_bias (`torch.Tensor` of shape `(E,)`, *optional*): added to the scaled logit (differentiable).
        edge_weight (`torch.Tensor` of shape `(E,)`, *optional*): multiplies the normalised probability after the
            softmax, without renormalisation (differentiable).
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout on the probabilities (before `edge_weight`).
        training (`bool`, *optional*, defaults to `False`): dropout is only applied when `True`.
        sorted_rows (`bool`, *optional*, defaults to `False`): promise that `rows` is non-decreasing (skips a sort).
        generator (`torch.Generator`, *optional*): RNG for the dropout mask.

    Returns:
        `torch.Tensor` of shape `(R, d)` in the dtype of `q`.
    """
    _check_edges(q, k, v, rows, cols, logit_bias, edge_weight)
    keep = _keep_mask(rows.shape[0], dropout_p, training, q.device, generator)
    return edge_attention_with_mask(
        q,
        k,
        v,
        rows,
        cols,
        logit_bias=logit_bias,
        edge_weight=edge_weight,
        scale=scale,
        keep=keep,
        dropout_p=dropout_p,
        sorted_rows=sorted_rows,
    )


def edge_attention_with_mask(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    cols: Tensor,
    *,
    logit_bias: Tensor | None,
    edge_weight: Tensor | None,
    scale: float | None,
    keep: Tensor | None,
    dropout_p: float,
    sorted_rows: bool,
    degree: int | None = None,
    use_sparse: bool | None = None,
) -> Tensor:
    """[`edge_attention`] with an explicit dropout keep-mask and internal knobs.

    Args:
        keep (`torch.BoolTensor` of shape `(E,)` or `None`): dropout keep-mask in the caller's edge order.
        degree (`int`, *optional*): every row has exactly this many edges (requires sorted rows); the segment
            softmax then runs on a `(R, degree)` view instead of scatter/segment reductions.
        use_sparse (`bool`, *optional*): force the CSR kernels (`True`) or the gather/index_add fallback (`False`);
            default: CSR where torch has the kernels for the device and dtype.
    """
    num_rows = q.shape[0]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out_dtype = torch.result_type(q, v)
    compute_dtype = torch.promote_types(torch.promote_types(out_dtype, k.dtype), torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = (t.to(compute_dtype).contiguous() for t in (q, k, v))
        if logit_bias is not None:
            logit_bias = logit_bias.to(compute_dtype)
        if edge_weight is not None:
            edge_weight = edge_weight.to(compute_dtype)
        if not sorted_rows:
            sorted_rows_key, perm = torch.sort(sort_key(rows, num_rows), stable=True)
            # Widening the sorted keys is a sequential pass, cheaper than another random gather of rows.
            rows, cols = sorted_rows_key.to(torch.int64), cols.index_select(0, perm)
            logit_bias = None if logit_bias is None else logit_bias[perm]
            edge_weight = None if edge_weight is None else edge_weight[perm]
            keep = None if keep is None else keep[perm]
        mult = None if keep is None else keep_multiplier(keep, dropout_p, compute_dtype)
        if degree is None:
            crow = row_pointers(rows, num_rows)
        else:
            crow = torch.arange(num_rows + 1, device=rows.device, dtype=rows.dtype) * degree
        if use_sparse is None:
            use_sparse = sparse_kernels_available(q.device, compute_dtype)
        out = CSRAttentionFunction.apply(
            q, k, v, logit_bias, edge_weight, mult, rows, cols, crow, scale, degree, use_sparse
        )
    return out.to(out_dtype)

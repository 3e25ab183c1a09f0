"""Edge-list attention with a per-row (segment) softmax: a plain-autograd reference and the CSR torch path.

The public entry point with backend dispatch is [`attnzoo.kernels.edge_attention`].
"""

from __future__ import annotations

import torch
from torch import Tensor

from .csr import CSRAttentionFunction, row_pointers, sort_key, sparse_kernels_available
from .dropout import keep_multiplier


def check_one_dtype(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise `ValueError` unless q, k and v share one dtype (as SDPA and the Triton kernels require): the result's
    dtype, and whether a backend runs at all, would otherwise depend on the backend."""
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def check_edges(
    q: Tensor, k: Tensor, v: Tensor, rows: Tensor, cols: Tensor, *edge_tensors: Tensor | None, padded: bool = False
) -> None:
    if not (q.dim() == k.dim() == v.dim() and q.dim() in (2, 4)):
        raise ValueError(f"q, k, v must be 2-D (rows, d) or all 4-D (B, H, rows, d), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")  # fmt: skip
    # One width d for q, k and v: the Triton kernel sizes its output and its value tiles by the queries' width.
    if (
        k.shape[:-1] != v.shape[:-1]
        or q.shape[-1] != k.shape[-1]
        or v.shape[-1] != q.shape[-1]
        or (q.dim() == 4 and q.shape[:2] != k.shape[:2])
    ):
        raise ValueError(
            f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: q, k and v must share "
            "their width d (and head-split ones their batch and heads), and k and v their number of rows"
        )
    num_rows, num_cols = q.shape[:-1].numel(), k.shape[:-1].numel()
    check_one_dtype(q, k, v)
    if rows.dtype not in (torch.int32, torch.int64) or cols.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"rows and cols must be int64 or int32, got {rows.dtype} and {cols.dtype}")
    if rows.shape != cols.shape or rows.dim() != 1:
        raise ValueError(f"rows and cols must be 1-D of equal length, got {tuple(rows.shape)}, {tuple(cols.shape)}")
    for t in edge_tensors:
        if t is not None and t.shape != rows.shape:
            raise ValueError(f"per-edge tensors must have shape {tuple(rows.shape)}, got {tuple(t.shape)}")
    # The CSR kernels run without invariant checks, so an out-of-range index would read out of bounds. On CPU the
    # check is a cheap O(E) pass; on accelerators it would force a host sync, and the kernels fault loudly there.
    if rows.device.type == "cpu" and rows.numel() > 0:
        # A padded edge list also holds the row one past the last (its padding edges).
        if int(rows.min()) < 0 or int(rows.max()) >= num_rows + padded:
            raise IndexError(f"rows out of range [0, {num_rows + padded})")
        if int(cols.min()) < 0 or int(cols.max()) >= num_cols:
            raise IndexError(f"cols out of range [0, {num_cols})")


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
    """Gather / scatter implementation of [`edge_attention`] with plain autograd (correctness reference).

    Materialises `(E, d)` gathered rows; `keep` is an explicit dropout keep-mask `(E,)` bool (None = no dropout).
    """
    num_rows = q.shape[0]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    # The truth is computed in fp32 at least (fp64 stays fp64): under autocast q, k, v arrive in bf16 while per-edge
    # weights and biases stay fp32, and a bf16 accumulator could not take their products. Output in v's dtype, as
    # the fast paths give it.
    acc = torch.promote_types(torch.promote_types(q.dtype, v.dtype), torch.float32)
    scores = (q[rows].to(acc) * k[cols].to(acc)).sum(-1) * scale  # (E,)
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
    out = torch.zeros(num_rows, v.shape[-1], dtype=acc, device=v.device)
    return out.index_add(0, rows, probs[:, None].to(acc) * v[cols].to(acc)).to(v.dtype)  # (R, d)


def sort_edges(
    rows: Tensor, cols: Tensor, num_rows: int, *edge_tensors: Tensor | None
) -> tuple[Tensor, Tensor, tuple[Tensor | None, ...]]:
    """Edges sorted by row (stable, so duplicates keep their order) with their per-edge tensors permuted alike."""
    sorted_rows_key, perm = torch.sort(sort_key(rows, num_rows), stable=True)
    # Widening the sorted keys is a sequential pass, cheaper than another random gather of rows.
    permuted = tuple(None if t is None else t[perm] for t in edge_tensors)
    return sorted_rows_key.to(torch.int64), cols.index_select(0, perm), permuted


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
            rows, cols, (logit_bias, edge_weight, keep) = sort_edges(
                rows, cols, num_rows, logit_bias, edge_weight, keep
            )
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

"""Interpolated gathered attention: every query attends to K points at fractional key positions.

Slot `s` of query row `r` reads the two neighbouring keys `c0 = cols0[r, s]`, `c1 = cols1[r, s]` mixed with weights
`(1 - w1, w1)`: `k~ = (1 - w1) k[c0] + w1 k[c1]` and likewise `v~`. Because the mix is linear,
`<q, k~> = (1 - w1) <q, k[c0]> + w1 <q, k[c1]>` and `sum_s p_s v~_s = sum_s p_s (1 - w1) v[c0] + p_s w1 v[c1]`, so the
whole computation runs on a CSR pattern with `2 K` edges per row through the shared SDDMM / SpMM primitives of
`attnzoo.kernels.csr` (no `(R, K, d)` interpolated tensor is ever materialised). The softmax is over the K slots,
not over the 2K edges, so this is not plain edge attention: the autograd Function below combines the edge scores
per slot and carries the gradient with respect to the interpolation weights `w1` (hence to the positions).

Any method that attends to fractional positions (deformable / interpolated sampling) can use
[`interpolated_attention`]; [`interpolated_attention_reference`] is the plain-autograd gather + lerp version.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.csr import CSRPattern, sparse_kernels_available
from ..kernels.dropout import keep_multiplier


def _slot_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis; rows whose logits are all -inf give zeros (never NaN)."""
    rowmax = scores.detach().amax(-1, keepdim=True)
    ex = torch.exp(scores - torch.where(torch.isfinite(rowmax), rowmax, 0.0))
    den = ex.sum(-1, keepdim=True)
    return ex / torch.where(den > 0, den, 1.0)


class InterpolatedAttentionFunction(torch.autograd.Function):
    """CSR forward/backward of interpolated attention over flattened rows.

    Inputs are contiguous, in the compute dtype (fp32/fp64): `q (R, d)`, `k, v (C, d)`, `w1 (R, K)`, `bias (R, K)`
    or None (added to the slot logits; -inf removes a slot), `mult (R, K)` or None (fixed dropout factor), `cols (R,
    K, 2)` flat key rows of both neighbours, `dot_product` (slot logits include `scale * <q, k~>`).
    Saved for backward: q, k, v, w1, the edge scores (R, K, 2) and the slot probabilities (R, K): O(R K) state.
    """

    @staticmethod
    def forward(ctx, q, k, v, w1, bias, mult, cols, scale, dot_product, use_sparse):
        num_rows, num_slots = w1.shape
        rows = torch.arange(num_rows, device=q.device).repeat_interleave(2 * num_slots)  # (E,), sorted
        crow = torch.arange(num_rows + 1, device=q.device) * (2 * num_slots)
        flat_cols = cols.reshape(-1)
        pattern = CSRPattern(rows, flat_cols, crow, num_rows, k.shape[0], 2 * num_slots, use_sparse)
        w0 = 1.0 - w1
        scores = w1.new_zeros(w1.shape) if bias is None else bias
        edge_scores = None
        if dot_product:
            edge_scores = pattern.sddmm(q, k, scale).view(num_rows, num_slots, 2)  # (R, K, 2)
            scores = scores + w0 * edge_scores[..., 0] + w1 * edge_scores[..., 1]
        probs = _slot_softmax(scores)  # (R, K)
        kept = probs if mult is None else probs * mult
        out = pattern.spmm(torch.stack((kept * w0, kept * w1), -1).reshape(-1), v)  # (R, d)
        ctx.save_for_backward(q, k, v, w1, mult, rows, flat_cols, crow, probs, edge_scores)
        ctx.scale, ctx.dot_product, ctx.use_sparse = scale, dot_product, use_sparse
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, w1, mult, rows, cols, crow, probs, edge_scores = ctx.saved_tensors
        num_rows, num_slots = w1.shape
        pattern = CSRPattern(rows, cols, crow, num_rows, k.shape[0], 2 * num_slots, ctx.use_sparse)
        grad_out = grad_out.to(q.dtype).contiguous()
        w0 = 1.0 - w1
        kept = probs if mult is None else probs * mult
        grad_q = grad_k = None
        with torch.autocast(device_type=q.device.type, enabled=False):
            grad_v = pattern.spmm_t(torch.stack((kept * w0, kept * w1), -1).reshape(-1), grad_out)  # (C, d)
            grad_edges = pattern.sddmm(grad_out, v, 1.0).view(num_rows, num_slots, 2)  # <dO, v[c]>, (R, K, 2)
            grad_kept = w0 * grad_edges[..., 0] + w1 * grad_edges[..., 1]  # (R, K)
            # Value path: d v~ / d w1 = v[c1] - v[c0].
            grad_w1 = kept * (grad_edges[..., 1] - grad_edges[..., 0])
            grad_probs = grad_kept if mult is None else grad_kept * mult
            grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-1, keepdim=True))  # (R, K)
            if ctx.dot_product:
                # Score path: d <q, k~> / d w1 = <q, k[c1]> - <q, k[c0]>.
                grad_w1 = grad_w1 + grad_scores * (edge_scores[..., 1] - edge_scores[..., 0])
                grad_edge_scores = torch.stack((grad_scores * w0, grad_scores * w1), -1).reshape(-1) * ctx.scale
                grad_q = pattern.spmm(grad_edge_scores, k)  # (R, d)
                grad_k = pattern.spmm_t(grad_edge_scores, q)  # (C, d)
        grad_bias = grad_scores if ctx.needs_input_grad[4] else None
        return grad_q, grad_k, grad_v, grad_w1, grad_bias, None, None, None, None, None


def _flat_cols(i0: Tensor, i1: Tensor, num_keys: int) -> Tensor:
    B, H = i0.shape[:2]
    offsets = (torch.arange(B * H, device=i0.device) * num_keys).view(B, H, 1, 1)
    return torch.stack((i0 + offsets, i1 + offsets), -1).reshape(-1, i0.shape[-1], 2)  # (R, K, 2)


def interpolated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i0: Tensor,
    i1: Tensor,
    w1: Tensor,
    *,
    logit_bias: Tensor | None = None,
    dot_product: bool = True,
    scale: float | None = None,
    keep: Tensor | None = None,
    dropout_p: float = 0.0,
    use_sparse: bool | None = None,
) -> Tensor:
    """Attention of every query over K interpolated key/value points, softmax over the K points.

    Point `s` of query `n` is `k~ = (1 - w1) k[i0] + w1 k[i1]` (same for `v`); its logit is
    `logit_bias + scale * <q, k~>` (the dot product only when `dot_product`). Runs as one CSR autograd Function with
    an O(B H Nq K) backward; gradients flow to `q`, `k`, `v`, `w1` and `logit_bias`. fp16/bf16 inputs (autocast)
    are computed in fp32 and cast back.

    Args:
        q (`torch.Tensor` of shape `(B, H, Nq, d)`): queries.
        k (`torch.Tensor` of shape `(B, H, Nk, d)`): keys.
        v (`torch.Tensor` of shape `(B, H, Nk, d)`): values.
        i0 (`torch.LongTensor` of shape `(B, H, Nq, K)`): left neighbour of each point, in `[0, Nk)`.
        i1 (`torch.LongTensor` of shape `(B, H, Nq, K)`): right neighbour of each point, in `[0, Nk)`.
        w1 (`torch.Tensor` of shape `(B, H, Nq, K)`): weight of the right neighbour (differentiable).
        logit_bias (`torch.Tensor` of shape `(B, H, Nq, K)`, *optional*): added to the logits; `-inf` drops a point.
        dot_product (`bool`, *optional*, defaults to `True`): include `scale * <q, k~>` in the logits.
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        keep (`torch.BoolTensor` of shape `(B, H, Nq, K)`, *optional*): dropout keep-mask of the points.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout probability `keep` was drawn with.
        use_sparse (`bool`, *optional*): force the CSR kernels or the gather/index_add fallback; default: CSR
            where torch has the kernels for the device and dtype.

    Returns:
        `torch.Tensor` of shape `(B, H, Nq, d)` in the dtype of `q`.
    """
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    out_dtype = torch.result_type(q, v)
    compute_dtype = torch.promote_types(torch.promote_types(out_dtype, k.dtype), torch.float32)
    if use_sparse is None:
        use_sparse = sparse_kernels_available(q.device, compute_dtype)
    with torch.autocast(device_type=q.device.type, enabled=False):
        qf, kf, vf = (t.to(compute_dtype).reshape(-1, d).contiguous() for t in (q, k, v))
        w1f = w1.to(compute_dtype).reshape(-1, w1.shape[-1])
        bias = None if logit_bias is None else logit_bias.to(compute_dtype).reshape(w1f.shape)
        mult = None if keep is None else keep_multiplier(keep, dropout_p, compute_dtype).reshape(w1f.shape)
        out = InterpolatedAttentionFunction.apply(
            qf, kf, vf, w1f, bias, mult, _flat_cols(i0, i1, Nk), scale, dot_product, use_sparse
        )
    return out.view(B, H, Nq, d).to(out_dtype)


def interpolation_matrix(i0: Tensor, i1: Tensor, w1: Tensor, num_keys: int) -> Tensor:
    """Dense interpolation weights `(B, H, Nq, K, Nk)`: `1 - w1` at `i0` plus `w1` at `i1` (differentiable in w1)."""
    zeros = w1.new_zeros(*w1.shape, num_keys)
    return zeros.scatter_add(-1, i0[..., None], (1.0 - w1)[..., None]).scatter_add(-1, i1[..., None], w1[..., None])


def interpolated_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i0: Tensor,
    i1: Tensor,
    w1: Tensor,
    *,
    logit_bias: Tensor | None = None,
    dot_product: bool = True,
    scale: float | None = None,
    keep: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Dense plain-autograd version of [`interpolated_attention`] (correctness reference).

    Builds the dense interpolation matrix `(B, H, Nq, K, Nk)` and multiplies it with `k` and `v`, so it costs
    O(Nq K Nk) memory. Same arguments; returns the output `(B, H, Nq, d)` and the dense attention probabilities
    `(B, H, Nq, Nk)` (after dropout) that the K points put on the keys.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    interp = interpolation_matrix(i0, i1, w1.to(q.dtype), k.shape[2])  # (B, H, Nq, K, Nk)
    scores = torch.zeros_like(w1, dtype=q.dtype) if logit_bias is None else logit_bias.to(q.dtype)
    if dot_product:
        k_points = torch.einsum("bhnsm,bhmd->bhnsd", interp, k)  # (B, H, Nq, K, d)
        scores = scores + torch.einsum("bhnd,bhnsd->bhns", q, k_points) * scale
    probs = _slot_softmax(scores)  # (B, H, Nq, K)
    if keep is not None:
        probs = probs * keep_multiplier(keep, dropout_p, probs.dtype)
    weights = torch.einsum("bhns,bhnsm->bhnm", probs, interp)  # (B, H, Nq, Nk)
    return weights @ v, weights

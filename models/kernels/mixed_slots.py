"""CSR (torch) path of gathered attention whose slots mix several key rows with weights (A²-Former's interpolation).

Slot `s` of query row `r` reads `J` key rows `cols[r, s, :]` mixed with weights `w[r, s, :]`:
`k~ = sum_j w_j k[c_j]` and likewise `v~`. The mix is linear, so `<q, k~> = sum_j w_j <q, k[c_j]>` and
`sum_s p_s v~_s = sum_{s, j} p_s w_j v[c_j]`: the whole computation runs on a CSR pattern with `K J` edges per row
through the shared SDDMM / SpMM primitives of [`attnzoo.kernels.csr`], and no `(R, K, d)` mixed tensor is ever
materialised. The softmax is over the K slots, not over the edges, so this is not plain edge attention: the
Function below combines the edge scores per slot and returns the gradient with respect to the weights (hence, for
A²-Former, to the learned positions).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .csr import CSRPattern


def slot_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis; rows whose logits are all -inf, or that have none, give zeros (never NaN)."""
    if scores.shape[-1] == 0:  # no slot: nothing to normalise (amax has no identity)
        return scores * 1.0
    rowmax = scores.detach().amax(-1, keepdim=True)
    ex = torch.exp(scores - torch.where(torch.isfinite(rowmax), rowmax, 0.0))
    den = ex.sum(-1, keepdim=True)
    return ex / torch.where(den > 0, den, 1.0)


class MixedSlotAttentionFunction(torch.autograd.Function):
    """CSR forward/backward of mixed-slot attention over flattened rows.

    Inputs are contiguous, in the compute dtype (fp32/fp64): `q (R, d)`, `k, v (C, d)`, `weight (R, K, J)`,
    `bias (R, K)` or None (added to the slot logits; -inf removes a slot), `mult (R, K)` or None (fixed dropout
    factor), `cols (R, K, J)` flat key rows, `dot_product` (slot logits include `scale * <q, k~>`).
    Saved for backward: q, k, v, the weights, the edge scores (R, K, J) and the slot probabilities (R, K).
    """

    @staticmethod
    def forward(ctx, q, k, v, weight, bias, mult, cols, scale, dot_product, use_sparse):
        num_rows, num_slots, entries = cols.shape
        degree = num_slots * entries
        rows = torch.arange(num_rows, device=q.device).repeat_interleave(degree)  # (E,), sorted
        crow = torch.arange(num_rows + 1, device=q.device) * degree
        flat_cols = cols.reshape(-1)
        pattern = CSRPattern(rows, flat_cols, crow, num_rows, k.shape[0], degree, use_sparse)
        scores = weight.new_zeros(num_rows, num_slots) if bias is None else bias
        edge_scores = None
        if dot_product:
            edge_scores = pattern.sddmm(q, k, scale).view(num_rows, num_slots, entries)  # (R, K, J)
            scores = scores + (weight * edge_scores).sum(-1)
        probs = slot_softmax(scores)  # (R, K)
        kept = probs if mult is None else probs * mult
        out = pattern.spmm((kept[..., None] * weight).reshape(-1), v)  # (R, d)
        ctx.save_for_backward(q, k, v, weight, mult, rows, flat_cols, crow, probs, edge_scores)
        ctx.scale, ctx.dot_product, ctx.use_sparse = scale, dot_product, use_sparse
        return out

    @staticmethod
    # A hand-written backward: a second derivative through it must fail loudly, not come out wrong or cryptic.
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, weight, mult, rows, cols, crow, probs, edge_scores = ctx.saved_tensors
        num_rows, num_slots, entries = weight.shape
        pattern = CSRPattern(rows, cols, crow, num_rows, k.shape[0], num_slots * entries, ctx.use_sparse)
        grad_out = grad_out.to(q.dtype).contiguous()
        kept = probs if mult is None else probs * mult
        grad_q = grad_k = None
        with torch.autocast(device_type=q.device.type, enabled=False):
            grad_v = pattern.spmm_t((kept[..., None] * weight).reshape(-1), grad_out)  # (C, d)
            grad_edges = pattern.sddmm(grad_out, v, 1.0).view(num_rows, num_slots, entries)  # <dO, v[c]>
            grad_kept = (weight * grad_edges).sum(-1)  # (R, K)
            grad_weight = kept[..., None] * grad_edges  # value path: d v~ / d w_j = v[c_j]
            grad_probs = grad_kept if mult is None else grad_kept * mult
            grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-1, keepdim=True))  # (R, K)
            if ctx.dot_product:
                # Score path: d <q, k~> / d w_j = <q, k[c_j]>.
                grad_weight = grad_weight + grad_scores[..., None] * edge_scores
                grad_edge_scores = (grad_scores[..., None] * weight).reshape(-1) * ctx.scale
                grad_q = pattern.spmm(grad_edge_scores, k)  # (R, d)
                grad_k = pattern.spmm_t(grad_edge_scores, q)  # (C, d)
        grad_bias = grad_scores if ctx.needs_input_grad[4] else None
        grad_weight = grad_weight if ctx.needs_input_grad[3] else None
        return grad_q, grad_k, grad_v, grad_weight, grad_bias, None, None, None, None, None

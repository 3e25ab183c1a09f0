"""Dense reference of interpolated attention: every query attends to K points at fractional key positions.

Point `s` of query `n` reads the two neighbouring keys `i0`, `i1` mixed with weights `(1 - w1, w1)`:
`k~ = (1 - w1) k[i0] + w1 k[i1]` and likewise `v~`. The fast paths ([`attnzoo.kernels.interpolated_attention`])
compute this without materialising any interpolated tensor: on CPU as gathered attention with two weighted entries
per slot (CSR SDDMM / SpMM), on CUDA as one fused Triton kernel per pass that derives the positions from the
offsets. [`interpolated_attention_reference`] builds the dense interpolation matrix instead: the plain-autograd truth,
and the source of the dense attention weights that `output_attentions=True` returns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.dropout import keep_multiplier
from ..kernels.mixed_slots import slot_softmax


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
    """Attention of every query over K interpolated key/value points, softmax over the K points (dense reference).

    Builds the dense interpolation matrix `(B, H, Nq, K, Nk)` and multiplies it with `k` and `v`, so it costs
    O(Nq K Nk) memory.

    Args:
        q (`torch.Tensor` of shape `(B, H, Nq, d)`): queries.
        k, v (`torch.Tensor` of shape `(B, H, Nk, d)`): keys and values.
        i0, i1 (`torch.LongTensor` of shape `(B, H, Nq, K)`): left and right neighbour of each point, in `[0, Nk)`.
        w1 (`torch.Tensor` of shape `(B, H, Nq, K)`): weight of the right neighbour (differentiable).
        logit_bias (`torch.Tensor` of shape `(B, H, Nq, K)`, *optional*): added to the logits; `-inf` drops a point.
        dot_product (`bool`, *optional*, defaults to `True`): include `scale * <q, k~>` in the logits.
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        keep (`torch.BoolTensor` of shape `(B, H, Nq, K)`, *optional*): dropout keep-mask of the points.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout probability `keep` was drawn with.

    Returns:
        The output `(B, H, Nq, d)` and the dense attention probabilities `(B, H, Nq, Nk)` (after dropout) that the K
        points put on the keys.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    interp = interpolation_matrix(i0, i1, w1.to(q.dtype), k.shape[2])  # (B, H, Nq, K, Nk)
    scores = torch.zeros_like(w1, dtype=q.dtype) if logit_bias is None else logit_bias.to(q.dtype)
    if dot_product:
        k_points = torch.einsum("bhnsm,bhmd->bhnsd", interp, k)  # (B, H, Nq, K, d)
        scores = scores + torch.einsum("bhnd,bhnsd->bhns", q, k_points) * scale
    probs = slot_softmax(scores)  # (B, H, Nq, K)
    if keep is not None:
        probs = probs * keep_multiplier(keep, dropout_p, probs.dtype)
    weights = torch.einsum("bhns,bhnsm->bhnm", probs, interp)  # (B, H, Nq, Nk)
    return weights @ v, weights

"""Dense masked attention: the plain reference path every method is tested against, and the global queries' rows
(dense attention over every real key) that every family splices into its output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .dropout import keep_multiplier
from .hashing import grid_keep


def dense_masked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
    training: bool = False,
    return_weights: bool = False,
    logit_bias: Tensor | None = None,
    keep: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Materialised softmax attention with a boolean mask.

    The softmax runs in (at least) fp32 and is cast back to the input dtype. Query rows whose mask has no `True`
    entry get exactly zero weights and output (never NaN, also in backward).

    Args:
        q (`torch.Tensor` of shape `(B, H, Nq, d)`): queries.
        k (`torch.Tensor` of shape `(B, H, Nk, d)`): keys.
        v (`torch.Tensor` of shape `(B, H, Nk, d)`): values.
        mask (`torch.BoolTensor`, *optional*): broadcastable to `(B, H, Nq, Nk)`; `True` means "may attend".
        dropout_p (`float`, *optional*, defaults to 0.0): dropout probability on the attention weights.
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        training (`bool`, *optional*, defaults to `False`): dropout is only applied when `True`.
        return_weights (`bool`, *optional*, defaults to `False`): also return the attention weights.
        logit_bias (`torch.Tensor`, *optional*): broadcastable to `(B, H, Nq, Nk)`; added to the scaled logits
            (differentiable), e.g. SBM's straight-through term.
        keep (`torch.BoolTensor` broadcastable to `(B, H, Nq, Nk)`, *optional*): the dropout keep-mask drawn by the
            caller (in training, instead of `F.dropout`'s own draw), e.g. the global rows' hashed mask.

    Returns:
        `tuple(torch.Tensor, torch.Tensor | None)`: the output of shape `(B, H, Nq, d)` and, if `return_weights`,
        the weights of shape `(B, H, Nq, Nk)` after dropout (as HF's eager attention returns them), else `None`.
    """
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    softmax_dtype = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q, k.transpose(-1, -2)).to(softmax_dtype) * scale  # (B, H, Nq, Nk)
    if logit_bias is not None:
        scores = scores + logit_bias.to(softmax_dtype)
    if mask is not None:
        # finfo.min instead of -inf keeps fully masked rows finite; they are zeroed right after the softmax.
        scores = scores.masked_fill(~mask, torch.finfo(softmax_dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    weights = weights.to(q.dtype)
    if training and dropout_p > 0.0 and keep is not None:
        weights = weights * keep_multiplier(keep, dropout_p, weights.dtype)
    elif training and dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = torch.matmul(weights, v)  # (B, H, Nq, d)
    return out, (weights if return_weights else None)


# ----- global queries (`attnzoo.core.global_tokens`): their rows are dense attention over every real key -----


def global_query_rows(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_valid: Tensor | None,
    g: int,
    *,
    scale: float | None,
    dropout_p: float,
    training: bool,
    return_weights: bool,
    seed: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Dense masked attention of the first `g` queries over every real key.

    With a `seed`, their attention dropout (in training) is the counter hash's ([`global_rows_keep`]), the mask a
    kernel computing these rows draws from the same seed; without one, `F.dropout`'s (no kernel to agree with).

    Args:
        q (`torch.Tensor` of shape `(B, H, N, d)`): queries (only the first `g` rows are read).
        k, v (`torch.Tensor` of shape `(B, H, N, d)`): keys and values.
        key_valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real keys.

    Returns:
        The rows `(B, H, g, d)` and, with `return_weights`, their weights `(B, H, g, N)`.
    """
    mask = None if key_valid is None else key_valid[:, None, None, :]  # (B, 1, 1, N)
    keep = None
    if training and dropout_p > 0.0 and seed is not None:
        keep = global_rows_keep(seed, k.shape[0], k.shape[1], g, k.shape[2], dropout_p)
    return dense_masked_attention(
        q[:, :, :g],
        k,
        v,
        mask,
        dropout_p=dropout_p,
        scale=scale,
        training=training,
        return_weights=return_weights,
        keep=keep,
    )


def global_rows_keep(seed: Tensor, batch: int, heads: int, g: int, num_keys: int, dropout_p: float) -> Tensor:
    """The global rows' attention-dropout keep mask `(B, H, g, Nk)`: the counter hash of `(seed, b * H + h, query,
    key)` (`attnzoo.kernels.hashing.hashed_keep`, which the kernels' `keep_at` computes alike)."""
    return grid_keep(seed, (batch, heads, g, num_keys), dropout_p)


def splice_rows(full: Tensor, rows: Tensor, key_valid: Tensor | None) -> Tensor:
    """`full` with its first `g` query rows replaced by `rows` where the global query is a real token.

    Args:
        full (`torch.Tensor` of shape `(B, H, N, ...)`): the method's output (or weights) for every query.
        rows (`torch.Tensor` of shape `(B, H, g, ...)`): the global rows.
    """
    g = rows.shape[2]
    head = rows.to(full.dtype)
    if key_valid is not None:
        real = key_valid[:, None, :g].reshape(key_valid.shape[0], 1, g, *([1] * (full.dim() - 3)))
        head = torch.where(real, head, full[:, :, :g])
    return torch.cat([head, full[:, :, g:]], dim=2)

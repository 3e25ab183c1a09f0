"""Graph sampling of SBM attention: dense Bernoulli masks and the straight-through estimators that carry the
attention gradient back to the sampled edge probabilities (the fastRG sampler is in `fastrg.py`, the counter hash
both use in `attnzoo.kernels.hashing`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..kernels.constants import scalar
from ..kernels.csr import CSRPattern, row_pointers


class DenseMaskSTE(torch.autograd.Function):
    """Straight-through estimator of a dense sampled mask, fused with the attention input it produces.

    Forward turns `blocked` (float, 1 at pairs that are not attended, 0 elsewhere; in place unless it is a view) into
    what the attention takes and passes the number of sampled edges per `(batch, head)` through. `sampled` says which
    attended pairs were sampled: `None` (all of them), the whole graph `(B, H, Nq, Nk)`, or the graph of the first
    `c < Nk` key columns `(B, H, Nq, c)` (global columns; beyond them every attended pair was sampled).

    - Sampled pairs only (`all_pairs=False`, the published estimator): the output is an additive logit bias (0 on
      attended pairs, the dtype's minimum elsewhere). The gradient reaching a sampled pair (its logit gradient,
      times its logit for the paper's variant, plus the regulariser's gradient through the counts) is clipped to
      `[-clip, clip]` and passed to the edge probability; every other pair gets zero.
    - Every allowed pair (`all_pairs=True`): the output is the 0/1 gate of [`gated_attention`], which gives a
      gradient also on the pairs that were not sampled (what adding key `j` to row `i` would gain, measured as its
      `closed_gradient` says; on a sampled pair it equals the logit gradient). Every pair in `allowed` (`None`:
      all) gets it, treated as above, except the attended pairs that were not sampled (structural edges: window,
      global columns). This is the straight-through estimator `∂L/∂p := ∂L/∂m`, which the official code's autograd
      computes for every pair before it keeps the sampled ones.

    These passes over the `(B, H, Nq, Nk)` pairs dominate the dense backend's cost, so each step is an in-place
    float op or is skipped when it cannot change anything.
    """

    @staticmethod
    def forward(
        ctx,
        probs: Tensor,
        blocked: Tensor,
        sampled: Tensor | None,
        counts: Tensor,
        clip: float,
        logits: tuple[Tensor, Tensor, float] | None,
        all_pairs: bool = False,
        allowed: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        if blocked._is_view():
            # Autograd cannot mark a view dirty in a Function with two outputs: pay for one new tensor instead.
            blocked = blocked.clone()
        else:
            ctx.mark_dirty(blocked)
        # (B, H, Nq, Nk): the gate (1 on attended pairs) or the logit bias (the dtype's minimum on blocked pairs)
        attend = blocked.neg_().add_(1.0) if all_pairs else blocked.mul_(torch.finfo(blocked.dtype).min)
        ctx.whole_graph = sampled is not None and sampled.shape[-1] == attend.shape[-1]
        ctx.all_pairs, ctx.clip, ctx.logits = all_pairs, clip, logits
        # What tells attended from blocked pairs (the output itself), except where the whole sampled graph does.
        # `allowed` bounds only the all-pairs gradient; the sampled pairs are allowed by construction.
        ctx.save_for_backward(
            None if ctx.whole_graph and not all_pairs else attend, sampled, allowed if all_pairs else None
        )
        return attend, counts.clone()

    @staticmethod
    def backward(ctx, grad_attend: Tensor | None, grad_counts: Tensor | None):
        attend, sampled, allowed = ctx.saved_tensors
        owned = True  # whether `grad` is a tensor of ours (in-place edits allowed)
        if grad_attend is None:
            shape = (attend if attend is not None else sampled).shape
            grad = torch.zeros(shape, dtype=torch.float32, device=sampled.device if attend is None else attend.device)
        else:
            grad, owned = grad_attend, False
            if ctx.logits is not None:
                q, k, scale = ctx.logits
                grad, owned = grad * (q @ k.transpose(-1, -2) * scale), True
        if grad_counts is not None:
            grad, owned = grad + grad_counts[..., None, None], True
        # Clipped unconditionally: testing first whether anything exceeds the clip would read the device.
        grad, owned = (grad.clamp_(-ctx.clip, ctx.clip) if owned else grad.clamp(-ctx.clip, ctx.clip)), True

        def zero(where: Tensor, columns: int | None = None) -> None:
            """Zero the gradient where `where` holds (in the first `columns` key columns if given)."""
            nonlocal grad, owned
            if not owned:
                grad, owned = grad.clone(), True
            (grad if columns is None else grad[..., :columns]).masked_fill_(where, 0.0)

        if ctx.all_pairs:
            if allowed is not None:
                zero(~allowed)
            # Attended pairs that were not sampled (structural edges) get nothing.
            if ctx.whole_graph:
                zero((attend != 0) & ~sampled)
            elif sampled is not None:  # the first columns' graph
                zero((attend[..., : sampled.shape[-1]] != 0) & ~sampled, sampled.shape[-1])
        elif ctx.whole_graph:
            zero(~sampled)
        else:
            # Blocked pairs have exactly zero weight, hence zero logit gradient, unless something added to every pair.
            if grad_attend is None or grad_counts is not None:
                zero(attend != 0)
            if sampled is not None:  # the first columns' graph: their attended, unsampled pairs get nothing
                zero(~sampled, sampled.shape[-1])
        return grad, None, None, None, None, None, None, None


def duplicate_bias(duplicate: Tensor | None, cols: Tensor) -> Tensor:
    """The forward value of [`EdgeSTE`]'s bias: 0, and `-inf` at the `duplicate` edges, `(E,)` fp32 (`cols`: the
    edges' columns, for the size and device)."""
    device = cols.device
    if duplicate is None:
        return torch.zeros(cols.shape, dtype=torch.float32, device=device)
    # one op: the constants are made once per device
    return torch.where(duplicate, scalar(-math.inf, torch.float32, device), scalar(0.0, torch.float32, device))


class EdgeSTE(torch.autograd.Function):
    """Straight-through estimator of an edge list: the logit bias `m_e - 1` of every edge, with `m_e = 1` in forward
    (so the bias is 0, and `-inf` at the edges marked `duplicate`: a repeated draw of a pair attends with weight 0).

    The gradient reaching the bias is the gradient of `m_e` (times `grad_scale[e]` when given: the paper variant's
    bias is `logit_e * (m_e - 1)`). The edge probability `p_e = <Q̂[row_e], (K̂ Ŝᵀ)[col_e]>` is never needed in
    forward; backward clips the gradient reaching each sampled edge and sends it to the factors with two sparse
    products over the edge pattern (`dQ̂ = G @ (K̂ Ŝᵀ)`, `d(K̂ Ŝᵀ) = Gᵀ @ Q̂`), so the cost stays linear in the number of
    edges.

    The factors are not saved: `factors` makes them from two tensors (SBM's queries and keys, with the membership
    network's `params`) and backward makes them again and sends their gradient on through that recomputation, so
    nothing of size `N x H x k` (nor the network's activations) is kept for backward. With
    `factors = lambda a, b: (a, b)` the two tensors are `Q̂` and `K̂ Ŝᵀ` themselves.

    The edge list may end in padding (rows equal to the number of rows, past `crow[-1]`); with `triton` the products
    run as Triton kernels that read the row pointers only (no host sync), otherwise torch's sparse kernels run on
    the real edges.

    Args of `apply`: `factors` (a function of two tensors returning `(Q̂, K̂ Ŝᵀ)` flattened to `(R, k)` and
    `(C, k)`), `rows`, `cols` (`(E,)` int64 or int32, row-sorted), `crow` (`(R + 1,)` row pointers), `sampled`
    (`(E,)` bool: the edges whose probability gets a gradient), `duplicate` (`(E,)` bool or `None`), `grad_scale`
    (`(E,)` or `None`), `counted` (`bool`), `clip` (`float`), `triton` (`bool`), the two tensors, then every parameter
    `factors` reads (their gradients leave through this node). Returns the bias `(E,)` in fp32 and, with `counted`,
    also `m_e` of the sampled edges (1 there, 0 elsewhere: the density regulariser's counts), whose gradient reaches
    `m_e` unscaled.
    """

    @staticmethod
    def forward(
        ctx, factors, rows, cols, crow, sampled, duplicate, grad_scale, counted, clip, triton, first, second, *params
    ) -> Tensor | tuple[Tensor, Tensor]:
        # The Triton products need no row of each edge: keep it only for the torch path.
        ctx.save_for_backward(None if triton else rows, cols, crow, sampled, grad_scale, first, second)
        ctx.factors, ctx.params, ctx.clip, ctx.triton = factors, params, clip, triton
        bias = duplicate_bias(duplicate, cols)
        return (bias, sampled.float()) if counted else bias

    @staticmethod
    def backward(ctx, grad_bias: Tensor, grad_counted: Tensor | None = None):
        rows, cols, crow, sampled, grad_scale, first, second = ctx.saved_tensors
        grad_m = grad_bias if grad_scale is None else grad_bias * grad_scale
        if grad_counted is not None:
            grad_m = grad_m + grad_counted
        needs = ctx.needs_input_grad[10:]  # the two tensors, then the parameters
        with torch.enable_grad():
            inputs = [first.detach().requires_grad_(needs[0]), second.detach().requires_grad_(needs[1])]
            q_memb, k_memb_s = ctx.factors(*inputs)
        pattern = edge_pattern(rows, cols, q_memb.shape[0], k_memb_s.shape[0], crow=crow, triton=ctx.triton)
        # The gradient of each sampled edge's probability, clipped: (grad_m * sampled).clamp(-clip, clip), (E,)
        grad_q, grad_k = pattern.spmm_pair(grad_m, k_memb_s.detach(), q_memb.detach(), mask=sampled, clip=ctx.clip)
        wanted = [t for t, needed in zip((*inputs, *ctx.params), needs, strict=True) if needed]
        found = iter(torch.autograd.grad((q_memb, k_memb_s), wanted, (grad_q, grad_k), allow_unused=True))
        grads = [next(found) if needed else None for needed in needs]
        return None, None, None, None, None, None, None, None, None, None, *grads


def edge_pattern(
    rows: Tensor | None,
    cols: Tensor,
    num_rows: int,
    num_cols: int,
    *,
    crow: Tensor | None = None,
    triton: bool = False,
) -> CSRPattern:
    """CSR pattern of row-sorted edges whose tail may be padding (rows equal to `num_rows`): the STE's products and
    the SDDMM of the paper-variant STE. `rows` may be `None` with `triton` when `crow` is given."""
    if crow is None:
        crow = row_pointers(rows, num_rows)
    use_sparse = cols.device.type in ("cpu", "cuda")
    return CSRPattern(rows, cols, crow, num_rows, num_cols, None, use_sparse, padded=True, triton=triton)

"""Graph sampling of SBM attention: dense Bernoulli masks, vectorised fastRG edge lists and the straight-through
estimators that carry the attention gradient back to the sampled edge probabilities."""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.csr import CSRPattern, row_pointers

# Odd 63-bit constants of the counter hash (splitmix64 finaliser); int64 products wrap like uint64 ones.
_MIX1 = -0x40A7B892E31B1A47
_MIX2 = -0x6B2FB644ECCEEE15
_GOLDEN = -0x61C8864680B583EB
_LOW33 = (1 << 33) - 1
_LOW35 = (1 << 35) - 1
_LOW32 = (1 << 32) - 1
#: pairs per head in one CPU block of `counter_uniform` (2 MB of int64 state for 4 heads: cache-resident)
_CPU_BLOCK_PAIRS = 1 << 16


def counter_uniform(seed: int, num_heads: int, rows: Tensor, cols: Tensor) -> Tensor:
    """Uniforms in [0, 1) that depend only on `(seed, head, row position, column position)`.

    Eval-mode Bernoulli sampling uses them instead of a generator stream, so a pair gets the same draw whatever the
    batch size, the padded length or whether the decoder runs incrementally with a cache.

    Args:
        seed (`int`): seed (config seed mixed with the layer and site).
        num_heads (`int`): number of heads `H`.
        rows (`torch.LongTensor` of shape `(n,)`): absolute positions of the queries.
        cols (`torch.LongTensor` of shape `(m,)`): positions of the keys.

    Returns:
        `torch.Tensor` of shape `(H, n, m)` in float32.
    """
    # x = (h + 1) * GOLDEN + i * MIX1 + j * MIX2 + seed (int64, wrapping), then three xor-shift-multiply rounds
    # (logical shifts: the arithmetic `>>` masked to the bits a logical shift keeps). The int64 hash state is 8 bytes
    # per pair and ~10 passes go over it, so it is computed in place, on CPU in blocks of query rows that stay in the
    # cache (one tensor per op over all `(H, n, m)` pairs took 4.6 s per layer at N = 4096 here, blocks 0.35 s); on
    # an accelerator in one block (a launch per op and block).
    heads = torch.arange(num_heads, device=rows.device, dtype=torch.int64)
    row_terms = ((heads + 1) * _GOLDEN + seed)[:, None, None] + (rows.to(torch.int64) * _MIX1)[None, :, None]
    col_terms = (cols.to(torch.int64) * _MIX2)[None, None, :]  # (1, 1, m)
    n, m = rows.numel(), cols.numel()
    out = torch.empty(num_heads, n, m, dtype=torch.float32, device=rows.device)
    step = max(1, _CPU_BLOCK_PAIRS // max(m, 1)) if rows.device.type == "cpu" else max(n, 1)
    state = torch.empty(num_heads, min(step, n), m, dtype=torch.int64, device=rows.device)
    scratch = torch.empty_like(state)
    for start in range(0, n, step):
        x, tmp = state[:, : min(step, n - start)], scratch[:, : min(step, n - start)]
        torch.add(row_terms[:, start : start + step], col_terms, out=x)
        for shift, low, mix in ((31, _LOW33, _MIX1), (29, _LOW35, _MIX2), (32, _LOW32, None)):
            torch.bitwise_right_shift(x, shift, out=tmp)
            x.bitwise_xor_(tmp.bitwise_and_(low))
            if mix is not None:
                x.mul_(mix)
        x.bitwise_right_shift_(40).bitwise_and_((1 << 24) - 1)
        out[:, start : start + step].copy_(x).mul_(1.0 / (1 << 24))
    return out


class DenseMaskSTE(torch.autograd.Function):
    """Straight-through estimator of a dense sampled mask, fused with the attention logit bias it produces.

    Forward: turns `blocked` (float, 1 at pairs that are not attended, 0 elsewhere) in place into the additive
    logit bias (0 on attended pairs, the dtype's minimum elsewhere) and passes the number of sampled edges per
    `(batch, head)` through. `sampled` says which attended pairs were sampled: `None` (all of them), the whole graph
    `(B, H, Nq, Nk)`, or the graph of the first `c < Nk` key columns `(B, H, Nq, c)` (global columns; beyond them
    every attended pair was sampled). Backward: the gradient reaching a sampled pair (its logit gradient, times its
    logit for the paper's variant, plus the regulariser's gradient through the counts) is clipped to `[-clip, clip]`
    and passed to the edge probability; unsampled pairs get zero. These passes over the `(B, H, Nq, Nk)` pairs
    dominate the dense backend's cost, so each step is an in-place float op or is skipped when it cannot change
    anything.
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
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        if blocked._is_view():
            # Autograd cannot mark a view dirty in a Function with two outputs: pay for one new tensor instead.
            bias = blocked * torch.finfo(blocked.dtype).min  # (B, H, Nq, Nk)
        else:
            bias = blocked.mul_(torch.finfo(blocked.dtype).min)
            ctx.mark_dirty(blocked)
        ctx.whole_graph = sampled is not None and sampled.shape[-1] == bias.shape[-1]
        if ctx.whole_graph:
            ctx.save_for_backward(sampled)
        else:
            # The bias is the mask (blocked pairs), plus the few columns' graph where structural pairs were attended.
            ctx.save_for_backward(bias, *(() if sampled is None else (sampled,)))
        ctx.clip, ctx.logits = clip, logits
        return bias, counts.clone()

    @staticmethod
    def backward(ctx, grad_bias: Tensor | None, grad_counts: Tensor | None):
        saved = ctx.saved_tensors
        owned = True  # whether `grad` is a tensor of ours (in-place edits allowed)
        if grad_bias is None:
            grad = torch.zeros(saved[0].shape, dtype=torch.float32, device=saved[0].device)
            needs_mask = True
        else:
            grad, owned = grad_bias, False
            if ctx.logits is not None:
                q, k, scale = ctx.logits
                grad, owned = grad * (q @ k.transpose(-1, -2) * scale), True
            # Blocked pairs have exactly zero weight, hence zero logit gradient: masking is only needed when
            # structural (non-sampled) pairs were attended or the regulariser adds to every pair.
            needs_mask = ctx.whole_graph
        if grad_counts is not None:
            grad, owned = grad + grad_counts[..., None, None], True
            needs_mask = True
        low, high = torch.aminmax(grad)
        if float(low) < -ctx.clip or float(high) > ctx.clip:
            grad, owned = grad.clamp(-ctx.clip, ctx.clip), True
        if needs_mask:
            unsampled = ~saved[0] if ctx.whole_graph else saved[0] != 0
            grad, owned = grad.masked_fill(unsampled, 0.0), True
        if len(saved) == 2:  # the first columns' graph: their attended, unsampled pairs get nothing
            columns = saved[1]
            grad = grad if owned else grad.clone()
            grad[..., : columns.shape[-1]].masked_fill_(~columns, 0.0)
        return grad, None, None, None, None, None


class UnsampledPairsSTE(torch.autograd.Function):
    """Straight-through gradient of the pairs that were *not* sampled (dense backend, `ste_all_pairs=True`).

    Forward passes the attention output and the per-`(batch, head)` edge counts through unchanged; `empty`
    `(B, H, n, 1)` marks the rows without an attended key (the forward already counted them). Backward gives
    every allowed, unsampled pair `(i, j)` the gradient its mask entry would get if the mask gated the softmax
    weights, `∂L/∂m_ij = (e^{s_ij} / Z_i) (∂L/∂o_i · v_j - ∂L/∂o_i · o_i)` with `Z_i` the softmax normaliser over
    the attended keys of row `i` (times the logit `s_ij` for the paper's variant), plus the regulariser's gradient
    through the counts, clipped like the sampled pairs' gradient. On sampled pairs this expression is exactly the
    gradient [`DenseMaskSTE`] passes on, so together they are the plain straight-through estimator `∂L/∂p := ∂L/∂m`
    on every pair. (The official code's autograd computes this same `∂L/∂m` for every pair, since it multiplies the
    softmax weights by the mask and renormalises, and then keeps only the sampled entries, `hardtanh(grad ⊙ M)`.) A row
    without any attended key has no such derivative (its output jumps from 0 to `v_j`): its pairs get only the
    regulariser's gradient. Dropout is not redrawn for unsampled pairs (their gate gradient is the one without it).
    """

    @staticmethod
    def forward(
        ctx,
        out: Tensor,
        counts: Tensor,
        probs: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor,
        unsampled: Tensor,
        empty: Tensor,
        scale: float,
        clip: float,
        paper: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(out, q, k, v, bias, unsampled, empty)
        ctx.scale, ctx.clip, ctx.paper = scale, clip, paper
        return out.view_as(out), counts.view_as(counts)

    @staticmethod
    def backward(ctx, grad_out: Tensor | None, grad_counts: Tensor | None):
        out, q, k, v, bias, unsampled, empty = ctx.saved_tensors
        grad = None
        # Every step below is one pass over the (B, H, n, m) pairs at most, in place where it can be: this backward
        # is the all-pairs estimator's whole price.
        if grad_out is not None:
            B, H, n, _ = q.shape
            m = k.shape[2]
            scores = torch.matmul(q * ctx.scale, k.transpose(-1, -2))  # (B, H, n, m)
            lse = torch.logsumexp(scores + bias, dim=-1, keepdim=True)  # log Z_i over the attended keys
            # ∂L/∂o_i · v_j - ∂L/∂o_i · o_i as one batched product; a row without attended keys gets 0 (its
            # weights below are finite: the clip keeps e^30).
            go = grad_out.masked_fill(empty, 0.0)
            rowdot = (go * out).sum(-1, keepdim=True)  # (B, H, n, 1)
            grad = torch.baddbmm(rowdot.neg().flatten(0, 1), go.flatten(0, 1), v.flatten(0, 1).transpose(-1, -2)).view(
                B, H, n, m
            )
            if ctx.paper:
                grad.mul_(scores)
            # e^{s_ij} / Z_i of an unsampled pair can exceed 1; the clip below bounds what reaches p.
            grad.mul_(scores.sub_(lse).clamp_(max=30.0).exp_())
        if grad_counts is not None:
            reg = grad_counts[..., None, None]
            grad = reg.expand(bias.shape).clone() if grad is None else grad.add_(reg)
        if grad is not None:
            grad = grad.clamp_(-ctx.clip, ctx.clip).mul_(unsampled)
        return grad_out, grad_counts, grad, None, None, None, None, None, None, None, None, None


class EdgeSTE(torch.autograd.Function):
    """Straight-through estimator of an edge list: `m_e = 1` for every edge in forward.

    The edge probability `p_e = <Q̂[row_e], (K̂ Ŝᵀ)[col_e]>` is never needed in forward; backward clips the gradient
    reaching each sampled edge and sends it to the memberships with two sparse products over the edge pattern
    (`dQ̂ = G @ (K̂ Ŝᵀ)`, `d(K̂ Ŝᵀ) = Gᵀ @ Q̂`), so the cost stays linear in the number of edges.
    """

    @staticmethod
    def forward(
        ctx, q_memb: Tensor, k_memb_s: Tensor, rows: Tensor, cols: Tensor, crow: Tensor, sampled: Tensor, clip: float
    ) -> Tensor:
        ctx.save_for_backward(q_memb, k_memb_s, rows, cols, crow, sampled)
        ctx.clip = clip
        return torch.ones(rows.shape, dtype=q_memb.dtype, device=q_memb.device)

    @staticmethod
    def backward(ctx, grad_m: Tensor):
        q_memb, k_memb_s, rows, cols, crow, sampled = ctx.saved_tensors
        grad_p = (grad_m * sampled).clamp_(-ctx.clip, ctx.clip)  # (E,)
        use_sparse = q_memb.device.type in ("cpu", "cuda")
        pattern = CSRPattern(rows, cols, crow, q_memb.shape[0], k_memb_s.shape[0], None, use_sparse)
        grad_q = pattern.spmm(grad_p, k_memb_s) if ctx.needs_input_grad[0] else None
        grad_k = pattern.spmm_t(grad_p, q_memb) if ctx.needs_input_grad[1] else None
        return grad_q, grad_k, None, None, None, None, None


def edge_pattern(rows: Tensor, cols: Tensor, num_rows: int, num_cols: int) -> CSRPattern:
    """CSR pattern of row-sorted edges (used for the SDDMM of the paper-variant STE)."""
    use_sparse = rows.device.type in ("cpu", "cuda")
    return CSRPattern(rows, cols, row_pointers(rows, num_rows), num_rows, num_cols, None, use_sparse)


def _sample_in_rows(
    weights: Tensor, which: Tensor, generator: torch.Generator | None, which_sorted: bool = False
) -> Tensor:
    """For every entry of `which`, draw a column of row `which[e]` of `weights` with probability ∝ its weight.

    All rows are sampled at once by inverse CDF over one global float64 cumulative sum (per-row offsets would be
    swamped in float32). Searching in row order keeps each row's slice of the sum in cache (2-3x faster on CPU);
    the draws themselves do not depend on that order.

    Args:
        weights (`torch.Tensor` of shape `(R, L)`): non-negative weights; every row named in `which` has mass.
        which (`torch.LongTensor` of shape `(E,)`): row of each draw.
        which_sorted (`bool`): `which` is already non-decreasing.

    Returns:
        `torch.LongTensor` of shape `(E,)` with values in `[0, L)`.
    """
    num_rows, length = weights.shape
    cum = weights.to(torch.float64).reshape(-1).cumsum(0)  # (R * L,)
    ends = cum.view(num_rows, length)[:, -1]
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    u = torch.rand(which.shape, dtype=torch.float64, device=weights.device, generator=generator)
    values = starts[which] + u * (ends[which] - starts[which])
    if which_sorted:
        flat = torch.searchsorted(cum, values, right=True)
    else:
        perm = torch.argsort(which.to(torch.int32) if num_rows < 2**31 else which)
        flat = torch.empty_like(which).index_put_((perm,), torch.searchsorted(cum, values[perm], right=True))
    return (flat - which * length).clamp_(0, length - 1)


def _uniform_valid(valid: Tensor | None, batch: Tensor, length: int, generator: torch.Generator | None) -> Tensor:
    """A uniform valid position of sequence `batch[e]` for every entry (valid positions are listed first)."""
    u = torch.rand(batch.shape, dtype=torch.float64, device=batch.device, generator=generator)
    if valid is None:
        return (u * length).long().clamp_(max=length - 1)
    counts = valid.sum(-1)  # (B,)
    positions = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)  # (B, L): valid positions first
    rank = (u * counts[batch]).long().clamp_(max=length - 1)
    return positions[batch, rank]


def fastrg_multigraph(
    q_memb: Tensor, k_memb: Tensor, blocks: Tensor, generator: torch.Generator | None
) -> tuple[Tensor, Tensor, Tensor]:
    """fastRG multigraph of every `(batch, head)`: Poisson edge counts with mean `Σ_ij p_ij`, edge `(i, j)` drawn
    with probability `p_ij / Σ p` (so pair counts are independent Poisson(`p_ij`)); duplicates are kept.

    Returns `(owner, i, j)`, `(E,)` each: the flat `(b*H + h)` index (non-decreasing), query and key of every edge.
    """
    B, H, n, k = q_memb.shape
    m = k_memb.shape[2]
    bh = B * H
    y = q_memb.sum(2).reshape(bh, k)
    z = k_memb.sum(2).reshape(bh, k)
    mass = (y[:, :, None] * blocks.repeat(B, 1, 1) * z[:, None, :]).reshape(bh, k * k).to(torch.float64)
    counts = torch.poisson(mass.sum(-1), generator=generator).to(torch.int64)  # (BH,)
    owner = torch.repeat_interleave(torch.arange(bh, device=q_memb.device), counts)
    block_pair = _sample_in_rows(mass, owner, generator, which_sorted=True)
    u, v = block_pair // k, block_pair % k
    i = _sample_in_rows(q_memb.transpose(2, 3).reshape(bh * k, n), owner * k + u, generator)
    j = _sample_in_rows(k_memb.transpose(2, 3).reshape(bh * k, m), owner * k + v, generator)
    return owner, i, j


def fastrg_edges(
    q_memb: Tensor,
    k_memb: Tensor,
    blocks: Tensor,
    *,
    delta: float,
    query_valid: Tensor | None,
    key_valid: Tensor | None,
    causal: bool,
    query_offset: int,
    structural: Tensor | None,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample SBM graphs of every `(batch, head)` at once with vectorised fastRG (Rohe et al.).

    The number of edges of a head is Poisson with mean `Σ_ij p_ij` (`p = Q̂ Ŝ K̂ᵀ`); each edge draws a block pair
    `(u, v)` ∝ `y_u Ŝ_uv z_v` (column sums `y = Σ_i Q̂_i`, `z = Σ_j K̂_j`), then `i ∝ Q̂[:, u]` and `j ∝ K̂[:, v]`.
    Exploration adds a Poisson(`δ` · valid pairs) set of uniform valid pairs; causal attention drops `j > i`
    (thinning a Poisson process is exact); duplicates are merged, so a pair is present with probability
    `1 - exp(-p_ij)` (the dense backend is exactly `p_ij`). Padded rows of `q_memb`/`k_memb` must be zero.

    Args:
        q_memb (`torch.Tensor` of shape `(B, H, n, k)`): query memberships.
        k_memb (`torch.Tensor` of shape `(B, H, m, k)`): key memberships.
        blocks (`torch.Tensor` of shape `(H, k, k)`): block matrix Ŝ of each head (sums to 1).
        delta (`float`): exploration probability.
        query_valid / key_valid (`torch.BoolTensor` of shape `(B, n)` / `(B, m)`, *optional*): real positions.
        causal (`bool`): drop edges to future keys; query `i` sits at key position `i + query_offset`.
        structural (`torch.LongTensor` of shape `(S,)`, *optional*): linear pair ids `((b*H + h)*n + i)*m + j`
            that are always attended (self loops, window); they carry no probability gradient.
        generator (`torch.Generator`, *optional*): RNG (eval); the global RNG when `None` (training).

    Returns:
        `(rows, cols, sampled)`: row-sorted flat edges `rows = (b*H + h)*n + i`, `cols = (b*H + h)*m + j`
        (`(E,)` each) and `sampled` `(E,)` bool (False for purely structural edges).
    """
    B, H, n, _ = q_memb.shape
    m = k_memb.shape[2]
    bh = B * H
    device = q_memb.device
    owner, i, j = fastrg_multigraph(q_memb, k_memb, blocks, generator)
    if delta > 0:
        n_q = query_valid.sum(-1) if query_valid is not None else torch.full((B,), n, device=device)
        n_k = key_valid.sum(-1) if key_valid is not None else torch.full((B,), m, device=device)
        rate = (delta * n_q.to(torch.float64) * n_k.to(torch.float64)).repeat_interleave(H)  # (BH,)
        explore = torch.poisson(rate, generator=generator).to(torch.int64)
        owner_d = torch.repeat_interleave(torch.arange(bh, device=device), explore)
        i_d = _uniform_valid(query_valid, owner_d // H, n, generator)
        j_d = _uniform_valid(key_valid, owner_d // H, m, generator)
        owner, i, j = torch.cat([owner, owner_d]), torch.cat([i, i_d]), torch.cat([j, j_d])
    if causal:
        keep = j <= i + query_offset
        owner, i, j = owner[keep], i[keep], j[keep]
    ids = (owner * n + i) * m + j
    num_sampled = ids.shape[0]
    if structural is not None:
        ids = torch.cat([ids, structural])
    if bh * n * m < 2**31:
        # Sorting int32 keys is 2-4x faster than int64 on CPU.
        ids = ids.to(torch.int32)
    ids, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    ids = ids.to(torch.int64)
    sampled = torch.zeros(ids.shape, dtype=torch.bool, device=device)
    sampled[inverse[:num_sampled]] = True
    rows = ids // m
    cols = (rows // n) * m + ids % m
    return rows, cols, sampled

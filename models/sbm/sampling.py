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
        low, high = torch.aminmax(grad)
        if float(low) < -ctx.clip or float(high) > ctx.clip:
            grad, owned = grad.clamp(-ctx.clip, ctx.clip), True

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

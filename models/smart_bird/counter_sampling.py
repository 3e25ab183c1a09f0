"""The counter sampler's plain torch reference: the keys the Triton kernel (`attnzoo.kernels.triton.sampling`) draws,
for the same seed, from whole `(B, H, R, N)` tensors.

The law is the literal sampler's (`sample_keys_reference`): head `h` of query `i` keeps the K keys with the largest
`c_ij - E_hij`. Read as arrivals, key `j` arrives at depth `A_j = (c_max - c_ij) + E_hij` below the row's largest
bound, and the K first arrivals are kept. The counter sampler draws the arrivals in two stages, each exact:

1. *Proposals*: a Poisson process in depth at rate `V = next_pow2(L)` (`L`: the example's last real key + 1) whose
   events name a key uniformly from `[0, V)`, so each key is named at rate 1. A key arrives at the first event that
   names it at a depth `x >= c_max - c_ij` (memorylessness), scoring `c_max - x`. Event `p` is Philox of
   `(p, query, head + 2**31, example)`: its first word the gap (`Exp(1) / V`), its second the key
   (`floor(word * V / 2**32)`, exactly uniform since V is a power of two). The stage stops after
   [`proposal_budget`] events, at depth `x_P`; arrivals before it come best first, so a row with K of them is final
   (a flat row, such as an untrained sketch's, after about K events whatever N).
2. *Scan*: a key that has not arrived by `x_P` arrives at `max(c_max - c_ij, x_P) + E'_hij` (memorylessness again),
   i.e. scores `min(c_ij, c_max - x_P) - E'_hij`, below every arrival of stage 1; `E'` is the per-key counter noise
   (`attnzoo.smart_bird.philox.counter_noise_rows`).

The events depend on the example's own length, never on how far its batch pads it, so an example's keys are the
same alone and padded (with `per_example=False`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .philox import counter_noise_rows, philox4x32, uniform_exponential

#: proposals use the upper half of the head word, the per-key noise the lower one (disjoint counters)
PROPOSAL_HEAD = 2**31
_NEG_INF = float("-inf")


def proposal_budget(num_samples: int) -> int:
    """Proposal events per (query, head) before the scan: part of the random stream's definition (the kernel and
    the reference must agree). About K events settle a flat row; peaked rows need the scan whatever the budget."""
    return 4 * num_samples + 16


def example_lengths(key_valid: Tensor | None, batch: int, num_keys: int, device: torch.device) -> Tensor:
    """`(B,)` int64: each example's last real key + 1 (0 without any), read on the device (no host sync)."""
    if key_valid is None:
        return torch.full((batch,), num_keys, dtype=torch.long, device=device)
    return (key_valid * torch.arange(1, num_keys + 1, device=device)).amax(-1)


def next_power_of_two(lengths: Tensor) -> Tensor:
    """The smallest power of two `>= lengths` (1 for 0), elementwise on an int64 tensor."""
    span = torch.ones_like(lengths)
    for _ in range(62):
        span = torch.where(span < lengths, span * 2, span)
    return span


def counter_sample_rows(
    bounds: Tensor,
    c_max: Tensor,
    lengths: Tensor,
    seed: Tensor,
    *,
    num_heads: int,
    num_samples: int,
    start: int,
    per_example: bool,
) -> tuple[Tensor, Tensor]:
    """The counter sampler's keys for query rows `[start, start + R)`, as the kernel draws them.

    Args:
        bounds (`torch.Tensor` of shape `(B, R, N)`): `c = log p` (`score_bounds`), `-inf` at masked keys.
        c_max (`torch.Tensor` of shape `(B, R)`): the bound of each row's largest sketch logit.
        lengths (`torch.LongTensor` of shape `(B,)`): [`example_lengths`].
        seed (`torch.LongTensor` of shape `(1,)`): the counter seed.
        num_heads (`int`): H.
        num_samples (`int`): K (clipped to N).
        start (`int`): first query row of the chunk (its counter index).
        per_example (`bool`): the example index is part of the counters (`False`: example 0's for every example).

    Returns:
        `(idx, valid)` of shape `(B, H, R, min(K, N))`, best first.
    """
    B, R, N = bounds.shape
    H, K, P = num_heads, min(num_samples, N), proposal_budget(min(num_samples, N))
    device = bounds.device
    example = torch.arange(B, device=device) if per_example else torch.zeros(B, dtype=torch.long, device=device)
    example = example[:, None, None]  # (B, 1, 1)
    head = torch.arange(H, device=device)[None, :, None] + PROPOSAL_HEAD  # (1, H, 1)
    query = torch.arange(start, start + R, device=device)[None, None, :]  # (1, 1, R)
    span = next_power_of_two(lengths)[:, None, None]  # (B, 1, 1)
    every_head = bounds[:, None].expand(B, H, R, N)
    top = c_max[:, None]  # (B, 1, R)
    depth = torch.zeros(B, H, R, device=device)
    arrived = torch.full((B, H, R, P), N, dtype=torch.long, device=device)  # N: none (a sink column below)
    arrival = torch.full((B, H, R, P), _NEG_INF, device=device)
    for p in range(P):
        w_gap, w_key, _, _ = philox4x32(seed, torch.full((1, 1, 1), p, device=device), query, head, example)
        depth = depth + uniform_exponential(w_gap) / span.to(torch.float32)
        key = (w_key * span) >> 32  # uniform in [0, V): V divides 2**32
        bound = every_head.gather(-1, key.clamp(max=N - 1)[..., None])[..., 0]
        bound = torch.where(key < lengths[:, None, None], bound, _NEG_INF)
        score = top - depth
        fresh = (arrived[..., :p] != key[..., None]).all(-1)
        accept = (bound >= score) & (bound > _NEG_INF) & fresh
        arrived[..., p] = torch.where(accept, key, N)
        arrival[..., p] = torch.where(accept, score, _NEG_INF)
    # Keys without an arrival score below the depth reached; the arrivals keep their scores (beyond the K-th they
    # rank below it, as the kernel, which stops at K, never sees them).
    cap = top - depth  # (B, H, R)
    noise = counter_noise_rows(seed, B, H, start, start + R, N, per_example)  # (B or 1, H, R, N)
    scores = torch.minimum(every_head, cap[..., None]) - noise
    scores = torch.cat([scores, scores.new_full((B, H, R, 1), _NEG_INF)], -1)  # column N: the sink
    scores.scatter_(-1, arrived, arrival)
    vals, idx = scores[..., :N].topk(K, dim=-1)
    return idx, vals > _NEG_INF

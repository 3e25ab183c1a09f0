"""Attentive token sampling (Smart Bird, Eqs. 2-3): per head and query, the K keys with the largest `s ~ U(0, p)`.

Everything runs in log space: `score_hij = log u_hij + c_ij` with `u ~ U(0, 1)` and the head-independent bound
`c_ij = log p_ij` (for the paper's `p = 1 / log(alpha)^2`, `c = -2 log(-log alpha)`). Top-K of the scores equals
top-K of the paper's `s` (log is monotone), and `log u = -E` with `E ~ Exp(1)` never produces `-inf`.

The literal sampler draws `H x N x N` noise per layer, 4-6x the cost of a whole dense attention layer on CPU.
[`sample_keys`] returns exactly the same law (the same indices for the same noise where noise is given) but draws
noise only where it can matter:

1. *Head*: per query row, the `M` keys with the largest bound (shared by all heads) get explicit noise. Every other
   key's score is `< c_b`, the largest bound outside the head, so if a head's K-th best head score is `>= c_b`
   its top-K is final (the exactness check).
2. *Tail thinning* (rows failing the check; typical when the sketch is flat, e.g. untrained): a threshold
   `theta < c_b` is lowered in rounds. Scores of tail keys in the band `[theta, theta_prev)` are independent with
   probability `1 - exp(-(min(c, theta_prev) - theta))`, bounded by `1 - exp(-(theta_prev - theta))`, so band
   members are found by Bernoulli thinning with geometric gaps (cost ~ expected count, not N), and their scores
   drawn from the truncated exponential. Once `K` known scores are `>= theta`, every unseen score (`< theta`)
   is irrelevant and the top-K is final.
3. *Full fallback* (rare): the remaining rows get fresh noise for every key, *conditioned* on what was already
   revealed (memorylessness of Exp: a key known to score below `t` scores `min(c, t) - E'`), so the result is an
   exact draw from the literal sampler's law, never a biased redraw.

Thinning sizes its tensors from the data (host synchronisations), which costs more than the noise on a GPU. There
the *counter* sampler runs (`attnzoo.smart_bird.counter_sampling`): its randomness is a pure function of a seed and
counters (`attnzoo.smart_bird.philox`), so a Triton kernel (`attnzoo.kernels.triton.sampling`) draws only what it
needs, about K proposal events per row when the sketch is flat and key tiles whose bound can still win otherwise,
and keeps each row's top K on chip: no `(N, N)` tensor and no synchronisation. Its plain torch reference draws the
same numbers into whole tensors, row chunk by chunk.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.global_tokens import append_global_slots
from ..kernels.dispatch import attentive_sampler
from .configuration_smart_bird import SAMPLING_METHODS
from .counter_sampling import counter_sample_rows, example_lengths, proposal_budget

#: exponent `gamma` of `p = (-1 / log alpha) ** gamma` per sampling function (`raw` uses `p = alpha`).
_EXPONENTS = {"squared_inverse_log": 2.0, "inverse_log": 1.0}
#: `-log(alpha)` is clamped here so that `alpha == 1` (a single real key) gives a large finite bound.
_TINY = 1e-30
_NEG_INF = float("-inf")
#: rows whose bound spread (max - mean) is below this skip the head stage (speed only, never exactness).
_FLAT_SPREAD = 0.3
#: thinning rounds before the full fallback; the expected band size grows 4x per round.
_ROUNDS = 3
#: `method="auto"`: the counter sampler where the attention runs Triton kernels or off the CPU, thinning on the CPU.
#: Thinning sizes its tensors from the data (`nonzero`, `int`, `bool` on device values), about ten host syncs per
#: chunk of rows, the probable cause of what an H100 measured with it: 1,950 ms for one forward pass of the whole
#: model at N = 16,384 (2 layers, width 256, bf16; dense SDPA 3.2 ms; the speed-memory study, GPU run of
#: 2026-11-26 on an H100). The literal sampler (the CUDA default before the counter sampler) is a fixed chain of
#: kernels without a sync, but writes `H x N x N` noise per layer: 57.9 ms for the same pass on an H200
#: (`scripts/experiments/speed-memory/results/gpu-2026-11-26-h200/`), about 75 ms per layer at base size.
#: default `chunk_elements` per device type: the literal path's noise chunk is `(B, H, R, N)` fp32, so CUDA takes
#: 256 MB chunks (few kernel launches) and the CPU 16 MB ones (cache-sized). The counter sampler's torch reference
#: holds several int64 words per noise element while it draws them: it takes the small chunks everywhere.
_CHUNK_ELEMENTS_CPU = 2**22
_CHUNK_ELEMENTS_ACCELERATOR = 2**26
#: counter seeds are drawn in `[0, 2**62)` (any int64 is a valid Philox key; this keeps them non-negative)
_SEED_RANGE = 2**62


# The random keys stay fp32 whatever the autocast dtype: bf16 keeps 8 bits of mantissa, so keys would tie often and
# the top-K of `logit - noise` would no longer follow the sampling law.
def _draw_exponential(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> Tensor:
    return torch.empty(shape, device=device, dtype=torch.float32).exponential_(generator=generator)


def _draw_uniform(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> Tensor:
    return torch.rand(shape, device=device, dtype=torch.float32, generator=generator)


def score_bounds(z: Tensor, lse: Tensor, function: str) -> Tensor:
    """Head-independent bound `c = log p` of the sampling score from sketch logits.

    Args:
        z (`torch.Tensor`): masked sketch logits (`-inf` at keys that may not be attended), any shape `(..., n)`.
        lse (`torch.Tensor`): log-sum-exp of the full rows of `z`, broadcastable to `z` (`-inf` for empty rows).
        function (`str`): one of `"squared_inverse_log"`, `"inverse_log"`, `"raw"`, `"random"`.

    Returns:
        `torch.Tensor` like `z`: `-inf` exactly where `z` is `-inf`.
    """
    if function == "random":
        return torch.where(z > _NEG_INF, 0.0, _NEG_INF)
    log_alpha = z - torch.where(torch.isfinite(lse), lse, 0.0)
    if function == "raw":
        return log_alpha
    gamma = _EXPONENTS[function]
    # -log(alpha) = +inf at masked keys gives c = -inf there, as wanted.
    return -gamma * torch.log(torch.clamp(-log_alpha, min=_TINY))


def sketch_logits(q_s: Tensor, k_s: Tensor, key_valid: Tensor | None, start: int, stop: int) -> Tensor:
    """Masked single-head sketch logits of query rows `[start, stop)`: `(B, R, N)` fp32."""
    z = torch.matmul(q_s[:, start:stop], k_s.transpose(1, 2)) * q_s.shape[-1] ** -0.5
    if key_valid is not None:
        z = z.masked_fill(~key_valid[:, None, :], _NEG_INF)
    return z


def sample_keys_reference(bounds: Tensor, num_samples: int, noise: Tensor) -> tuple[Tensor, Tensor]:
    """The literal per-head sampler: top-K of `c - E` over all keys (correctness reference).

    Args:
        bounds (`torch.Tensor` of shape `(B, R, N)`): `c = log p`, `-inf` at keys that may not be attended.
        num_samples (`int`): K (clipped to N).
        noise (`torch.Tensor` of shape `(B, H, R, N)`): `E ~ Exp(1)`, one per head, query and key.

    Returns:
        `(idx, valid)` of shape `(B, H, R, min(K, N))`: key positions and whether the slot holds a real key.
    """
    vals, idx = (bounds[:, None] - noise).topk(min(num_samples, bounds.shape[-1]), dim=-1)
    return idx, vals > _NEG_INF


def resolve_sampling_method(method: str, device: torch.device, backend: str = "fast") -> str:
    """The sampler `method` stands for on `device` under `attention_backend=backend` (`"auto"` resolved).

    `"auto"` is the counter sampler wherever the attention runs the Triton kernels (CUDA; `backend="triton"` under
    the CPU interpreter) or off the CPU, and thinning on the CPU (the fastest there). The law is the same; the random
    stream differs between methods, so two backends draw the same keys only under the same method.

    Raises:
        ValueError: unknown method, or a backend [`~attnzoo.kernels.resolve_backend`] refuses on `device`.
    """
    if method not in SAMPLING_METHODS:
        raise ValueError(f"sample_keys: `method` must be one of {SAMPLING_METHODS}, got {method!r}.")
    if method != "auto":
        return method
    if device.type != "cpu" or attentive_sampler(backend, device) is not None:
        return "counter"
    return "thinning"


def sample_keys(
    q_s: Tensor,
    k_s: Tensor,
    key_valid: Tensor | None,
    *,
    num_heads: int,
    num_samples: int,
    function: str,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
    num_candidates: int | None = None,
    chunk_elements: int | None = None,
    method: str = "auto",
    seed: int | Tensor | None = None,
    per_example: bool = True,
    backend: str = "fast",
    num_global: int = 0,
) -> tuple[Tensor, Tensor]:
    """Independent per-head attentive token sampling from single-head sketch queries and keys.

    Memory stays at `O(chunk_elements)` beyond the output: rows are processed in chunks and no `(H, N, N)` tensor
    is built once `N > 2 * num_candidates` (thinning); the counter sampler's kernel holds key tiles only.

    Args:
        q_s (`torch.Tensor` of shape `(B, N, d)`): sketch queries (detached).
        k_s (`torch.Tensor` of shape `(B, N, d)`): sketch keys (detached).
        key_valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real keys; `None` means all real.
        num_heads (`int`): number of independent samples per query (heads of the main attention).
        num_samples (`int`): keys per query and head (K); `min(K, N)` slots are returned.
        function (`str`): `"squared_inverse_log"`, `"inverse_log"`, `"raw"`, `"random"` or `"topk"` (the K
            largest sketch weights, identical for every head).
        generator (`torch.Generator`, *optional*): source of randomness (the counter sampler draws its seed from
            it, on the inputs' device); `None` uses the global torch RNG.
        noise (`torch.Tensor` of shape `(B, H, N, N)`, *optional*): the literal sampler's `E ~ Exp(1)`; when
            given, the result is identical to [`sample_keys_reference`] with this noise (used by tests).
        num_candidates (`int`, *optional*): head size `M` of the exact fast path (default `max(4 K, min(256, N / 8))`).
        chunk_elements (`int`, *optional*): rows per chunk are chosen so that a chunk's logits (literal path: its
            noise) hold about this many elements; defaults to `2**22` on the CPU and `2**26` on an accelerator.
        method (`str`, *optional*, defaults to `"auto"`): `"thinning"` (the exact fast path above), `"literal"`
            (noise for every key from the torch generator, [`sample_keys_reference`] chunk by chunk), `"counter"`
            (counter noise per (example, head, query, key): the Triton kernel where `backend` runs Triton, else the
            literal sampler on that noise) or `"auto"` ([`resolve_sampling_method`]). The law is the same.
        seed (`int` or `torch.LongTensor` of shape `(1,)`, *optional*): the counter sampler's seed (an `int` in
            `[0, 2**63)`); `None` draws one from `generator` (a device tensor: no host synchronisation).
        per_example (`bool`, *optional*, defaults to `True`): counter sampler only: the example index is part of
            the counter; `False` gives every example the noise of example 0, so its keys depend on it alone.
        backend (`str`, *optional*, defaults to `"fast"`): the attention backend, which picks the counter sampler's
            implementation and the `"auto"` method.
        num_global (`int`, *optional*, defaults to 0): the first `G` positions are global keys, appended to every
            row after the sampled slots as [`~attnzoo.core.global_tokens.append_global_slots`] appends them (as a
            set: a sampled global key is turned off in its sampled slot). The Triton sampler writes them itself.

    Returns:
        `(idx, valid)`: `torch.LongTensor` and `torch.BoolTensor` of shape `(B, H, N, min(K, N) + num_global)`. Slots
        without a real key (fewer than K real keys) have `valid == False`.
    """
    device = q_s.device
    method = resolve_sampling_method(method, device, backend)
    if method == "counter":
        if seed is None and noise is None and function != "topk":
            seed = torch.randint(_SEED_RANGE, (1,), device=device, generator=generator)
        kernel = attentive_sampler(backend, device)
        if kernel is not None:
            # The kernel takes an integer seed as an argument (no tensor built per call) and writes the global slots.
            kw = {"num_heads": num_heads, "num_samples": num_samples, "function": function, "noise": noise}
            budget = proposal_budget(min(num_samples, q_s.shape[1]))
            return kernel(
                q_s, k_s, key_valid, seed=seed, num_proposals=budget, per_example=per_example, num_global=num_global,
                **kw,
            )  # fmt: skip
        if isinstance(seed, int):
            seed = torch.full((1,), seed, dtype=torch.long, device=device)
    # fp32 sketch logits: the law depends on logit differences, and bf16 loses those below 1/256 of the logits.
    q_s, k_s = q_s.float(), k_s.float()
    B, N, _ = q_s.shape
    H, K = num_heads, min(num_samples, N)
    M = num_candidates if num_candidates is not None else max(4 * K, min(256, N // 8))
    if chunk_elements is None:
        on_cpu = device.type == "cpu" or method == "counter"
        chunk_elements = _CHUNK_ELEMENTS_CPU if on_cpu else _CHUNK_ELEMENTS_ACCELERATOR
    idx = torch.empty(B, H, N, K, dtype=torch.long, device=device)
    valid = torch.empty(B, H, N, K, dtype=torch.bool, device=device)
    lengths = example_lengths(key_valid, B, N, device) if method == "counter" else None
    fast = function != "topk" and method == "thinning" and N > 2 * M
    # The literal path holds (B, H, R, N) noise per chunk, the fast path (B, R, N) logits.
    per_row = B * N * (1 if fast or function == "topk" else H)
    rows = max(1, chunk_elements // max(per_row, 1))
    for start in range(0, N, rows):
        stop = min(N, start + rows)
        z = sketch_logits(q_s, k_s, key_valid, start, stop)  # (B, R, N)
        chunk_noise = None if noise is None else noise[:, :, start:stop]
        if function == "topk":
            vals, top = z.topk(K, dim=-1)
            chunk_idx, chunk_valid = top[:, None].expand(B, H, -1, -1), (vals > _NEG_INF)[:, None].expand(B, H, -1, -1)
        elif not fast:
            lse = torch.logsumexp(z, -1, keepdim=True)
            bounds = score_bounds(z, lse, function)
            if chunk_noise is None and method == "counter":
                c_max = score_bounds(z.amax(-1), lse[..., 0], function)
                kw = {"num_heads": H, "num_samples": K, "start": start, "per_example": per_example}
                chunk_idx, chunk_valid = counter_sample_rows(bounds, c_max, lengths, seed, **kw)
            else:
                if chunk_noise is None:
                    chunk_noise = _draw_exponential((B, H, stop - start, N), z.device, generator)
                chunk_idx, chunk_valid = sample_keys_reference(bounds, K, chunk_noise)
        else:
            chunk_idx, chunk_valid = _sample_chunk_fast(z, function, H, K, M, generator, chunk_noise, chunk_elements)
        idx[:, :, start:stop] = chunk_idx
        valid[:, :, start:stop] = chunk_valid
    if num_global:
        idx, valid = append_global_slots(idx, valid, key_valid, num_global, as_set=True)
    return idx, valid


def _sample_chunk_fast(
    z: Tensor,
    function: str,
    H: int,
    K: int,
    M: int,
    generator: torch.Generator | None,
    noise: Tensor | None,
    chunk_elements: int,
) -> tuple[Tensor, Tensor]:
    """Head stage with the exactness check on peaked rows; flat rows and failing triples go to the tail stage."""
    B, R, N = z.shape
    lse = torch.logsumexp(z, -1)  # (B, R)
    real = z > _NEG_INF
    count = real.sum(-1)
    c_max = score_bounds(z.amax(-1), lse, function)  # (B, R), the bound of every key of the row
    z_mean = torch.where(real, z, 0.0).sum(-1) / count.clamp(min=1)
    # A head can only settle a row whose bounds spread over a good part of the noise scale (Exp(1)); on flat rows
    # (e.g. an untrained sketch) its top-M selection would be wasted work, so they go straight to thinning.
    peaked = (c_max - score_bounds(z_mean, lse, function) > _FLAT_SPREAD) & (count > 0)
    flat = ~peaked & (count > 0)
    idx = torch.zeros(B, H, R, K, dtype=torch.long, device=z.device)
    valid = torch.zeros(B, H, R, K, dtype=torch.bool, device=z.device)
    tail = _TailSampler(z, lse, function, K, generator, chunk_elements)
    pb, pr = peaked.nonzero().unbind(1)
    if pb.numel():
        z_top, j_top = z[pb, pr].topk(M + 1, dim=-1)  # (P, M + 1), sorted; the bound is monotone in the logit
        c_top = score_bounds(z_top, lse[pb, pr, None], function)
        j_head, c_head, c_out = j_top[:, :M], c_top[:, :M], c_top[:, M]
        j_head_h = j_head[:, None].expand(-1, H, M)
        if noise is None:
            e_head = _draw_exponential((pb.numel(), H, M), z.device, generator)
        else:
            e_head = noise[pb, :, pr].gather(2, j_head_h)
        s_head = c_head[:, None] - e_head  # (P, H, M)
        vals, pos = s_head.topk(K, dim=-1)
        p_idx, p_valid = torch.gather(j_head_h, 2, pos), vals > _NEG_INF
        # Any key outside the head scores < c_out (strictly: E > 0 almost surely).
        fp, fh = (vals[..., K - 1] < c_out[:, None]).nonzero().unbind(1)
        if fp.numel():
            p_idx[fp, fh], p_valid[fp, fh] = tail.run(pb[fp], fh, pr[fp], s_head[fp, fh], j_head[fp], c_out[fp], noise)
        idx[pb, :, pr], valid[pb, :, pr] = p_idx, p_valid
    fb, fr = flat.nonzero().unbind(1)
    if fb.numel():
        fb, fr = fb.repeat_interleave(H), fr.repeat_interleave(H)
        fh = torch.arange(H, device=z.device).repeat(fb.numel() // H)
        none_s = z.new_empty(fb.numel(), 0)
        none_j = torch.empty(fb.numel(), 0, dtype=torch.long, device=z.device)
        idx[fb, fh, fr], valid[fb, fh, fr] = tail.run(fb, fh, fr, none_s, none_j, c_max[fb, fr], noise)
    return idx, valid


class _TailSampler:
    """Exact completion of the rows whose head stage was inconclusive (thinning rounds, then the full fallback)."""

    def __init__(
        self, z: Tensor, lse: Tensor, function: str, K: int, generator: torch.Generator | None, chunk_elements: int
    ):
        self.z, self.lse, self.function, self.K, self.generator = z, lse, function, K, generator
        self.N = z.shape[-1]
        self.block = max(1, chunk_elements // self.N)

    def run(
        self,
        fb: Tensor,
        fh: Tensor,
        fr: Tensor,
        s_head: Tensor,
        j_head: Tensor,
        c_out: Tensor,
        noise: Tensor | None,
        theta_first: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        F = fb.shape[0]
        idx = torch.empty(F, self.K, dtype=torch.long, device=fb.device)
        valid = torch.empty(F, self.K, dtype=torch.bool, device=fb.device)
        if noise is not None:
            # Test mode: the literal sampler's own noise for the whole row (head noise came from it too).
            for a in range(0, F, self.block):
                sl = slice(a, a + self.block)
                c = score_bounds(self.z[fb[sl], fr[sl]], self.lse[fb[sl], fr[sl], None], self.function)
                vals, idx[sl] = (c - noise[fb[sl], fh[sl], fr[sl]]).topk(self.K, dim=-1)
                valid[sl] = vals > _NEG_INF
            return idx, valid
        # Thinning state is (F, ~G) per round, small next to the (F, N) rows of the fallback: block by the latter.
        for a in range(0, F, self.block):
            sl = slice(a, a + self.block)
            first = None if theta_first is None else theta_first[sl]
            idx[sl], valid[sl] = self._thin(fb[sl], fr[sl], s_head[sl], j_head[sl], c_out[sl], first)
        return idx, valid

    def _bounds_at(self, fb: Tensor, fr: Tensor, cols: Tensor) -> Tensor:
        z = self.z[fb[:, None], fr[:, None], cols]
        return score_bounds(z, self.lse[fb, fr][:, None], self.function)

    def _thin(
        self, fb: Tensor, fr: Tensor, s_head: Tensor, j_head: Tensor, c_out: Tensor, theta_first: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        F, N, K, device, gen = fb.shape[0], self.N, self.K, fb.device, self.generator
        idx = torch.empty(F, K, dtype=torch.long, device=device)
        valid = torch.empty(F, K, dtype=torch.bool, device=device)
        # Keys whose score is already known (head, then accepted tail keys); column N is a sink for "none".
        revealed = torch.zeros(F, N + 1, dtype=torch.bool, device=device).scatter_(1, j_head, True)
        acc_j = torch.empty(F, 0, dtype=torch.long, device=device)  # revealed tail keys (N = none)
        acc_s = torch.empty(F, 0, dtype=torch.float32, device=device)  # their scores (-inf = none)
        theta_prev = c_out.clone()  # every unrevealed tail score is known to be < theta_prev
        part_theta = c_out.clone()  # ... and < part_theta up to column part_pos (an overflowed round)
        part_pos = torch.full((F,), -1, dtype=torch.long, device=device)
        alive = torch.ones(F, dtype=torch.bool, device=device)
        target = 2.0 * K + 8.0
        for rnd in range(_ROUNDS):
            rows = alive.nonzero().squeeze(1)
            if rows.numel() == 0:
                break
            if rnd == 0 and theta_first is not None:
                # The head already holds K scores >= its K-th best: with that threshold one round always settles.
                theta = theta_first[rows]
            elif target > 0.5 * N:
                break
            else:
                theta = theta_prev[rows] + math.log1p(-target / N)  # expected band size <= target
            delta = theta_prev[rows] - theta  # (A,) > 0
            rate = -torch.expm1(-delta)  # per-column bound of the band probability
            expected = float(rate.max()) * N
            G = int(min(N, expected + 6.0 * math.sqrt(expected) + 10.0))
            gaps = torch.floor(_draw_exponential((rows.numel(), G), device, gen) / delta[:, None]) + 1.0
            cols = gaps.cumsum(-1).long() - 1  # (A, G), strictly increasing: geometric gaps
            overflow = cols[:, -1] < N - 1
            in_range = cols < N
            cols = cols.clamp(max=N - 1)
            c = torch.minimum(self._bounds_at(fb[rows], fr[rows], cols), theta_prev[rows, None])
            band = -torch.expm1(-(c - theta[:, None]).clamp(min=0.0))  # P(score in [theta, theta_prev))
            eligible = in_range & ~torch.gather(revealed[rows], 1, cols) & (band > 0)
            accept = eligible & (_draw_uniform(cols.shape, device, gen) * rate[:, None] < band)
            score = c + torch.log1p(-_draw_uniform(cols.shape, device, gen) * band)  # truncated to the band
            new_j = torch.full((F, G), N, dtype=torch.long, device=device)
            new_s = torch.full((F, G), _NEG_INF, dtype=torch.float32, device=device)
            new_j[rows] = torch.where(accept, cols, N)
            new_s[rows] = torch.where(accept, score, _NEG_INF)
            acc_j, acc_s = torch.cat([acc_j, new_j], 1), torch.cat([acc_s, new_s], 1)
            revealed.scatter_(1, new_j, True)
            count = (s_head[rows] >= theta[:, None]).sum(-1) + (acc_s[rows] > _NEG_INF).sum(-1)
            done = (count >= K) & ~overflow
            if bool(done.any()):
                d = rows[done]
                vals, pos = torch.cat([s_head[d], acc_s[d]], 1).topk(K, dim=-1)
                idx[d] = torch.gather(torch.cat([j_head[d], acc_j[d]], 1), 1, pos)
                valid[d] = vals > _NEG_INF
            # Overflowed rows revealed the band only up to their last column: they go to the fallback with it.
            over = rows[overflow]
            part_theta[over], part_pos[over] = theta[overflow], cols[overflow, -1]
            keep = ~(done | overflow)
            theta_prev[rows[keep]] = theta[keep]
            alive[rows[~keep]] = False
            if over.numel():
                self._fallback(
                    over, fb, fr, s_head, j_head, acc_j, acc_s, theta_prev, part_theta, part_pos, idx, valid
                )
            target *= 4.0
        rest = alive.nonzero().squeeze(1)
        if rest.numel():
            self._fallback(rest, fb, fr, s_head, j_head, acc_j, acc_s, theta_prev, part_theta, part_pos, idx, valid)
        return idx, valid

    def _fallback(self, rows, fb, fr, s_head, j_head, acc_j, acc_s, theta_prev, part_theta, part_pos, idx, valid):
        """Full rows with fresh noise, conditioned on the revealed information; writes `idx`/`valid` in place."""
        N, device = self.N, fb.device
        c = score_bounds(self.z[fb[rows], fr[rows]], self.lse[fb[rows], fr[rows], None], self.function)  # (A, N)
        col = torch.arange(N, device=device)
        cap = torch.where(col[None] <= part_pos[rows, None], part_theta[rows, None], theta_prev[rows, None])
        scores = torch.minimum(c, cap) - _draw_exponential(c.shape, device, self.generator)
        scores = torch.cat([scores, scores.new_full((rows.numel(), 1), _NEG_INF)], 1)  # column N: a sink
        scores.scatter_(1, j_head[rows], s_head[rows])
        scores.scatter_(1, acc_j[rows], acc_s[rows])
        vals, idx[rows] = scores[:, :N].topk(self.K, dim=-1)
        valid[rows] = vals > _NEG_INF

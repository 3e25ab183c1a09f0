"""Triton attentive sampler (Smart Bird): every head's top-K keys per query without any `(N, N)` tensor.

The law (`attnzoo.smart_bird.sampling`): head `h` of query `i` keeps the K keys with the largest
`s_hij = c_ij - E_hij`, where `c_ij = log p_ij` is a bound shared by the heads (a function of the d-dimensional sketch
logit `z_ij` and the row's log-sum-exp) and `E_hij ~ Exp(1)`. Equivalently key `j` *arrives* at depth
`A_j = (c_max - c_ij) + E_hij` below the row's largest bound `c_max`, and the K first arrivals are the K keys.

The randomness is counter-based (`attnzoo.smart_bird.philox`): Philox-4x32 of a counter under the seed, so nothing
is drawn before a kernel asks for it, and the torch reference (`attnzoo.smart_bird.counter_sampling`) draws the same
numbers. One program owns `BLOCK_M` query rows of one example:

1. *Pass 1* streams the key tiles once: the row log-sum-exp and largest logit of the sketch (online, as
   FlashAttention's softmax), and the example's length `L` (its last real key + 1).
2. *Proposals* (flat rows: an untrained sketch is nearly flat): Poisson proposals at rate `V = next_pow2(L)` in
   depth, each naming a key uniformly from `[0, V)`, so every key is proposed at rate 1. A key arrives at its first
   proposal at a depth `x >= c_max - c_j` (memorylessness of the proposal process: `A_j - (c_max - c_j) ~ Exp(1)`),
   scoring `c_max - x`. Arrivals come in decreasing score order, so a row whose first K arrivals (or all its real
   keys) come within the `num_proposals` budget is final after about K draws, whatever N. Proposal `p` of
   (example, query, head) is Philox of `(p, query, head + 2**31, example)`.
3. *Scan* (rows still short of K keys after the budget, reached at depth `x_P`): every key that has not arrived
   arrives at `max(c_max - c_j, x_P) + E'_j` (memorylessness again), i.e. scores `min(c_j, c_max - x_P) - E'_j`,
   with `E'_j` Philox of `(key, query, head, example)`. Key tiles stream again; a tile whose best capped bound
   cannot beat a row's K-th score is skipped before any noise is drawn (`s <= bound` because `E' > 0`: exact);
   otherwise its scores are inserted best first into the row's top K kept on chip.
4. The K kept keys are written best first (`torch.topk`'s order), then the `G` global keys (`num_global`) in
   slots `K .. K + G - 1`, as `attnzoo.core.global_tokens.append_global_slots(as_set=True)` appends them: a sampled
   key that is also global is kept in its slot but marked invalid, so every key counts once. Writing them here
   spares the attention the index and validity tensors it would otherwise build and concatenate per call.

The sketch rows are read in their own dtype and layout (bf16 rows of a fused projection: a row stride, unit
stride along the features) and widened to fp32 in registers, so no cast or copy of them runs before the launch.

With given noise (tests: the literal sampler's `E` tensor) or `"topk"` (no noise) there are no proposals and the scan
reads `c - E` (`z`) uncapped. `z` is recomputed from the d-dimensional sketch rows in every pass (d multiply-adds per
pair) instead of being stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: sampling functions, in the kernel's numbering (`FUNCTION`); `"topk"` takes the K largest logits with no noise.
SAMPLER_FUNCTIONS = ("squared_inverse_log", "inverse_log", "raw", "random", "topk")
#: must equal `attnzoo.smart_bird.philox`'s uniform mapping: 24 random bits, `u = ((x >> 8) + 0.5) * 2**-24`.
_UNIFORM_SHIFT = tl.constexpr(8)
_UNIFORM_SCALE = tl.constexpr(2.0**-24)
#: proposals count in the upper half of the head word (must equal `attnzoo.smart_bird.philox.PROPOSAL_HEAD`)
_PROPOSAL_HEAD = tl.constexpr(2**31)
#: `-log(alpha)` is clamped here (as `attnzoo.smart_bird.sampling.score_bounds` does).
_TINY = tl.constexpr(1e-30)
#: query rows per program and keys per tile on the GPU (untuned: to be measured on one)
_BLOCK_M, _BLOCK_N = 16, 64
#: under the CPU interpreter every tile op costs its Python overhead, so fewer, larger tiles (the result is the same)
_INTERPRETED_BLOCK_M, _INTERPRETED_BLOCK_N = 64, 128
#: sketch row dtypes the kernel reads as they are (widened to fp32 in registers)
_ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _sketch_logits(QS, KS, b, rows, row_ok, cols, key_ok, sq_b, sq_n, sk_b, sk_n, scale, DS: tl.constexpr):
    """`z = scale * <q_s[b, rows], k_s[b, cols]>`: (BLOCK_M, BLOCK_N) fp32, `-inf` at keys that are not `key_ok`."""
    z = tl.zeros([rows.shape[0], cols.shape[0]], tl.float32)
    q_base = b * sq_b + rows.to(tl.int64) * sq_n
    k_base = b * sk_b + cols.to(tl.int64) * sk_n
    for d in tl.static_range(DS):
        q_d = tl.load(QS + q_base + d, mask=row_ok, other=0.0).to(tl.float32)
        k_d = tl.load(KS + k_base + d, mask=key_ok, other=0.0).to(tl.float32)
        z += q_d[:, None] * k_d[None, :]
    return tl.where(key_ok[None, :], z * scale, float("-inf"))


@triton.jit
def _bound(z, lse, FUNCTION: tl.constexpr):
    """`c = log p` of logits `z` given the row log-sum-exp (0 for rows without a key), as `score_bounds` computes it;
    `-inf` wherever `z` is. The `"topk"` mode ranks by `z` itself."""
    if FUNCTION == 4:
        c = z
    elif FUNCTION == 3:
        c = tl.where(z > float("-inf"), 0.0, float("-inf"))
    elif FUNCTION == 2:
        c = z - lse
    else:
        gamma = 2.0 if FUNCTION == 0 else 1.0
        # -log(alpha) = +inf at masked keys gives c = -inf there.
        c = -gamma * tl.log(tl.maximum(-(z - lse), _TINY))
    return c


@triton.jit
def _exponential(word):
    """`E ~ Exp(1)` from a uniform 32-bit word: `-log u`, `u = ((word >> 8) + 1/2) / 2**24` in `(0, 1)`."""
    return -tl.log(((word >> _UNIFORM_SHIFT).to(tl.float32) + 0.5) * _UNIFORM_SCALE)


# The seed may arrive as a host integer: it is a value, not a property to compile for (no specialisation on it).
@triton.jit(do_not_specialize=["SEED"])
def _attentive_sample_kernel(
    QS, KS, KEY_VALID, SEED, NOISE, IDX, VALID,
    num_heads, num_keys, num_samples, num_global, num_proposals, scale, example_step,
    sq_b, sq_n, sk_b, sk_n, sn_b, sn_h, sn_r,
    DS: tl.constexpr, FUNCTION: tl.constexpr, HAS_KEY_VALID: tl.constexpr, HAS_NOISE: tl.constexpr,
    PROPOSE: tl.constexpr, SEED_IN_MEMORY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    blocks = tl.cdiv(num_keys, BLOCK_M)
    pid = tl.program_id(0).to(tl.int64)
    b = pid // blocks
    rows = (pid % blocks).to(tl.int32) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    row_ok = rows < num_keys
    lanes = tl.arange(0, BLOCK_N)
    example = (b * example_step).to(tl.uint32)

    # Pass 1: per row the log-sum-exp (the functions of the softmax weight) and the largest sketch logit; the
    # example's length L (proposals). The "topk" mode needs none of them.
    lse = tl.zeros([BLOCK_M], tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    length = tl.max(lanes * 0, 0)
    real = length  # real keys of the example: a row that has them all needs nothing more
    if FUNCTION < 4:
        row_sum = tl.zeros([BLOCK_M], tl.float32)
        for start in range(0, num_keys, BLOCK_N):
            cols = start + lanes
            key_ok = cols < num_keys
            if HAS_KEY_VALID:
                key_ok = key_ok & (tl.load(KEY_VALID + b * num_keys + cols, mask=key_ok, other=0) != 0)
            z = _sketch_logits(QS, KS, b, rows, row_ok, cols, key_ok, sq_b, sq_n, sk_b, sk_n, scale, DS)
            new_max = tl.maximum(row_max, tl.max(z, 1))
            if FUNCTION < 3:
                # A row that has seen only -inf keeps a finite shift, so exp(-inf - shift) = 0 and never NaN.
                shift = tl.where(new_max == float("-inf"), 0.0, new_max)
                row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(z - shift[:, None]), 1)
            row_max = new_max
            if PROPOSE:
                length = tl.maximum(length, tl.max(tl.where(key_ok, cols + 1, 0), 0))
                real += tl.sum(key_ok.to(tl.int32), 0)
        if FUNCTION < 3:
            # Rows without a real key: lse 0 (score_bounds' convention), their bounds are -inf anyway.
            lse = tl.where(row_sum > 0.0, row_max + tl.log(tl.where(row_sum > 0.0, row_sum, 1.0)), 0.0)
    c_max = _bound(row_max, lse, FUNCTION)  # the bound is monotone in z: the row's largest bound
    span = length * 0 + 1  # V = next_pow2(L): proposals name keys in [0, V), rate V per unit depth
    while span < length:
        span = span * 2

    # Philox's key words (the seed is a placeholder, never used, when no noise is drawn). A constexpr branch, not a
    # conditional expression: only the taken side is compiled (a host integer has no `tl.load`).
    if SEED_IN_MEMORY:  # noqa: SIM108
        seed = tl.load(SEED).to(tl.uint64)
    else:
        seed = SEED.to(tl.uint64)
    key_lo, key_hi = (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    slots = tl.arange(0, BLOCK_K)
    real_slot = slots < num_samples  # slots past K hold +inf: never the smallest, never written
    wanted = tl.minimum(real, num_samples) if PROPOSE else num_samples  # keys a row can still take
    num_slots = num_samples + num_global  # the output row: K sampled slots, then the global keys
    out_rows = (b * num_heads * num_keys + rows).to(tl.int64) * num_slots
    for h in range(num_heads):
        kept = tl.where(real_slot[None, :], float("-inf"), float("inf")) + tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        kept_key = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
        count = tl.zeros([BLOCK_M], tl.int32)  # keys kept by proposals (the first slots, best first)
        cap = tl.full([BLOCK_M], float("inf"), tl.float32)  # the scan's bounds are capped here
        if PROPOSE:
            depth = tl.zeros([BLOCK_M], tl.float32)
            live = row_ok & (c_max > float("-inf"))
            p = 0
            while tl.max((live & (count < wanted) & (p < num_proposals)).to(tl.int32), 0) > 0:
                word = rows.to(tl.uint32) * 0
                w_gap, w_key, _, _ = tl.philox_impl(
                    word + p, rows.to(tl.uint32), word + h + _PROPOSAL_HEAD, word + example, key_lo, key_hi
                )
                depth = depth + _exponential(w_gap) / span.to(tl.float32)
                key = tl.math.umulhi(w_key, span.to(tl.uint32)).to(tl.int32)  # uniform in [0, V)
                key_ok = row_ok & (key < length)
                if HAS_KEY_VALID:
                    key_ok = key_ok & (tl.load(KEY_VALID + b * num_keys + key, mask=key_ok, other=0) != 0)
                z = tl.zeros([BLOCK_M], tl.float32)
                for d in tl.static_range(DS):
                    q_d = tl.load(QS + b * sq_b + rows.to(tl.int64) * sq_n + d, mask=row_ok, other=0.0)
                    k_d = tl.load(KS + b * sk_b + key.to(tl.int64) * sk_n + d, mask=key_ok, other=0.0)
                    z += q_d.to(tl.float32) * k_d.to(tl.float32)
                bound = _bound(tl.where(key_ok, z * scale, float("-inf")), lse, FUNCTION)
                score = c_max - depth  # the arrival's score, if it is one
                filled = (slots[None, :] < count[:, None]) & (kept_key == key[:, None])
                accept = live & (count < wanted) & (bound >= score) & (bound > float("-inf"))
                accept = accept & (tl.sum(filled.to(tl.int32), 1) == 0)  # a key arrives once
                put = accept[:, None] & (slots[None, :] == count[:, None])
                kept = tl.where(put, score[:, None], kept)
                kept_key = tl.where(put, key[:, None], kept_key)
                count += accept.to(tl.int32)
                p += 1
            cap = c_max - depth  # x_P: every key that has not arrived scores below it
        tau = tl.min(kept, 1)  # the K-th best score so far (-inf until K keys are kept)
        if tl.max((row_ok & (count < wanted)).to(tl.int32), 0) > 0:
            for start in range(0, num_keys, BLOCK_N):
                cols = start + lanes
                key_ok = cols < num_keys
                if HAS_KEY_VALID:
                    key_ok = key_ok & (tl.load(KEY_VALID + b * num_keys + cols, mask=key_ok, other=0) != 0)
                z = _sketch_logits(QS, KS, b, rows, row_ok, cols, key_ok, sq_b, sq_n, sk_b, sk_n, scale, DS)
                # The bound is monotone in z: the tile's best bound per row is the bound of its largest logit.
                if tl.max((tl.minimum(_bound(tl.max(z, 1), lse, FUNCTION), cap) > tau).to(tl.int32), 0) > 0:
                    c = tl.minimum(_bound(z, lse[:, None], FUNCTION), cap[:, None])
                    if FUNCTION == 4:
                        score = c
                    elif HAS_NOISE:  # test mode: the literal sampler's noise tensor
                        n_ptr = NOISE + b * sn_b + h * sn_h + rows[:, None].to(tl.int64) * sn_r + cols[None, :]
                        score = c - tl.load(n_ptr, mask=row_ok[:, None] & key_ok[None, :], other=1.0)
                    else:
                        word = tl.broadcast_to(cols[None, :], [BLOCK_M, BLOCK_N]).to(tl.uint32)
                        query = tl.broadcast_to(rows[:, None], [BLOCK_M, BLOCK_N]).to(tl.uint32)
                        zero = word * 0
                        w_noise, _, _, _ = tl.philox_impl(word, query, zero + h, zero + example, key_lo, key_hi)
                        score = c - _exponential(w_noise)
                    # Insert the tile's candidates best first, each replacing the smallest kept score while it is
                    # larger: a row takes at most K of them (the (K+1)-th would have to beat K of its own tile's
                    # better scores), plus as many skipped keys that arrived as proposals.
                    candidates = tl.sum((score > tau[:, None]).to(tl.int32), 1)
                    for _ in range(tl.max(tl.minimum(candidates, num_samples + count), 0)):
                        best, lane = tl.max(score, 1, return_indices=True)
                        tau, slot = tl.min(kept, 1, return_indices=True)
                        replace = best > tau
                        if PROPOSE:  # a key that arrived as a proposal keeps that (higher) score
                            known = (kept_key == (start + lane)[:, None]) & (kept > float("-inf")) & real_slot[None, :]
                            replace = replace & (tl.sum(known.to(tl.int32), 1) == 0)
                        replace = replace[:, None] & (slots[None, :] == slot[:, None])
                        kept = tl.where(replace, best[:, None], kept)
                        kept_key = tl.where(replace, (start + lane)[:, None], kept_key)
                        score = tl.where(lanes[None, :] == lane[:, None], float("-inf"), score)
                    tau = tl.min(kept, 1)
        # Write the kept keys best first; slots without a real key (-inf) are invalid, their key is arbitrary. A
        # global key (< num_global) is invalid here: its own slot below holds it.
        ranked = tl.where(real_slot[None, :], kept, float("-inf"))
        out = out_rows + h * num_keys * num_slots
        for r in range(0, num_samples):
            best, pick = tl.max(ranked, 1, return_indices=True)
            picked = slots[None, :] == pick[:, None]
            key = tl.sum(tl.where(picked, kept_key, 0), 1)
            tl.store(IDX + out + r, key.to(tl.int64), mask=row_ok)
            tl.store(VALID + out + r, (best > float("-inf")) & (key >= num_global), mask=row_ok)
            ranked = tl.where(picked, float("-inf"), ranked)  # written: out of the ranking
        for j in range(0, num_global):
            real_global = row_ok
            if HAS_KEY_VALID:
                real_global = tl.load(KEY_VALID + b * num_keys + j + rows * 0, mask=row_ok, other=0) != 0
            tl.store(IDX + out + num_samples + j, (rows * 0 + j).to(tl.int64), mask=row_ok)
            tl.store(VALID + out + num_samples + j, real_global, mask=row_ok)


def attentive_sample_triton(
    q_s: Tensor,
    k_s: Tensor,
    key_valid: Tensor | None,
    *,
    num_heads: int,
    num_samples: int,
    function: str,
    seed: Tensor | int | None,
    num_proposals: int = 0,
    per_example: bool = True,
    noise: Tensor | None = None,
    num_global: int = 0,
) -> tuple[Tensor, Tensor]:
    """Every head's `min(K, N)` sampled keys per query, best first, then the `num_global` global keys.

    Args:
        q_s (`torch.Tensor` of shape `(B, N, d)`): sketch queries, fp32, bf16 or fp16, read in their own dtype and
            layout as long as the features are contiguous (fp32 arithmetic in the kernel: the keys are those of the
            fp32 rows).
        k_s (`torch.Tensor` of shape `(B, N, d)`): sketch keys, as `q_s`.
        key_valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real keys; `None` means all real.
        num_heads (`int`): independent samples per query (H).
        num_samples (`int`): keys per query and head (K), clipped to N.
        function (`str`): one of [`SAMPLER_FUNCTIONS`].
        seed (`torch.LongTensor` of shape `(1,)` or `int`, *optional*): the counter noise's seed: a tensor on the
            inputs' device (read by the kernel, so a seed drawn on the device never waits for it) or a host integer
            in `[0, 2**63)` (a kernel argument: no tensor to build); unused with `noise` or `"topk"`.
        num_proposals (`int`, *optional*, defaults to 0): proposal budget per (query, head) before the scan; part of
            the random stream's definition (the torch reference must use the same).
        per_example (`bool`, *optional*, defaults to `True`): the example index is part of the noise counter; with
            `False` every example draws the noise of example 0 (its keys then do not depend on its batch).
        noise (`torch.Tensor` broadcastable to `(B, H, N, N)`, *optional*): the literal sampler's `E` instead of the
            counter noise (tests: the result is then `sample_keys_reference`'s for this noise).
        num_global (`int`, *optional*, defaults to 0): global keys `0 .. G - 1` appended to every row as
            `append_global_slots(as_set=True)` appends them (at most N).

    Returns:
        `(idx, valid)`: `torch.LongTensor` and `torch.BoolTensor` of shape `(B, H, N, min(K, N) + num_global)`.
    """
    if function not in SAMPLER_FUNCTIONS:
        raise ValueError(f"attentive_sample_triton: `function` must be one of {SAMPLER_FUNCTIONS}, got {function!r}.")
    B, N, DS = q_s.shape
    if k_s.shape != q_s.shape:
        raise ValueError(f"q_s and k_s must both be (B, N, d), got {tuple(q_s.shape)} and {tuple(k_s.shape)}.")
    if not 0 <= num_global <= N:
        raise ValueError(f"attentive_sample_triton: `num_global` must be in [0, N = {N}], got {num_global}.")
    H, K = num_heads, min(num_samples, N)
    idx = torch.empty(B, H, N, K + num_global, dtype=torch.long, device=q_s.device)
    valid = torch.empty(idx.shape, dtype=torch.bool, device=q_s.device)
    if idx.numel() == 0:
        return idx, valid
    # fp32 / bf16 / fp16 rows are widened in the kernel; a row layout with strided features is copied once.
    q_s, k_s = (t if t.dtype in _ROW_DTYPES else t.float() for t in (q_s, k_s))
    q_s, k_s = (t if t.stride(-1) == 1 or DS == 1 else t.contiguous() for t in (q_s, k_s))
    needs_seed = noise is None and function != "topk"
    seed_in_memory = isinstance(seed, Tensor)
    if needs_seed and seed_in_memory and (seed.shape != (1,) or seed.dtype != torch.int64):
        raise ValueError("attentive_sample_triton: a tensor `seed` must be int64 of shape (1,).")
    if needs_seed and not seed_in_memory and not (isinstance(seed, int) and 0 <= seed < 2**63):
        raise ValueError(f"attentive_sample_triton: `seed` must be an int64 tensor or an int in [0, 2**63) to draw "
                         f"noise, got {seed!r}.")  # fmt: skip
    strides = (0, 0, 0)
    if noise is not None:
        noise = noise.float().expand(B, H, N, N)
        if noise.stride(-1) != 1:
            noise = noise.contiguous()
        strides = noise.stride()[:3]
    key_valid = None if key_valid is None else key_valid.contiguous().view(torch.uint8)
    interpreted = type(_attentive_sample_kernel).__name__ == "InterpretedFunction"
    block_m, block_n = (_INTERPRETED_BLOCK_M, _INTERPRETED_BLOCK_N) if interpreted else (_BLOCK_M, _BLOCK_N)
    grid = (B * triton.cdiv(N, block_m),)
    # Absent optional inputs still need a pointer argument; the constexpr flags keep the kernel from reading them.
    key_pointer = q_s if key_valid is None else key_valid
    seed_argument = seed if needs_seed else 0
    row_strides = (q_s.stride(0), q_s.stride(1), k_s.stride(0), k_s.stride(1))
    _attentive_sample_kernel[grid](
        q_s, k_s, key_pointer, seed_argument, q_s if noise is None else noise, idx, valid,
        H, N, K, num_global, num_proposals, DS**-0.5, int(per_example), *row_strides, *strides,
        DS=DS, FUNCTION=SAMPLER_FUNCTIONS.index(function), HAS_KEY_VALID=key_valid is not None,
        HAS_NOISE=noise is not None, PROPOSE=needs_seed and num_proposals > 0,
        SEED_IN_MEMORY=needs_seed and seed_in_memory, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=max(2, triton.next_power_of_2(K)),
    )  # fmt: skip
    return idx, valid

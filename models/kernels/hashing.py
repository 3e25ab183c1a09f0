"""The counter hash shared by the torch code and the Triton kernels (`kernels/triton/hashing.py` computes the same
bits): random numbers that are a function of a seed and a position, so that a kernel can regenerate them instead of
reading a stored mask, and a draw does not depend on shapes or on how many numbers were drawn before it."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Odd 63-bit constants of the counter hash (splitmix64 finaliser); int64 products wrap like uint64 ones.
_MIX1 = -0x40A7B892E31B1A47
_MIX2 = -0x6B2FB644ECCEEE15
_GOLDEN = -0x61C8864680B583EB
_LOW33 = (1 << 33) - 1
_LOW35 = (1 << 35) - 1
_LOW32 = (1 << 32) - 1
#: uniforms of [`counter_uniform`] are multiples of this (24 bits)
_UNIFORM_BITS = 24
#: pairs per head in one CPU block of `counter_uniform` (2 MB of int64 state for 4 heads: cache-resident)
_CPU_BLOCK_PAIRS = 1 << 16


#: The finaliser's rounds: `x ^= x >>> shift; x *= mix` (`>>>`: the arithmetic `>>` masked to the `low` bits a
#: logical shift keeps).
_ROUNDS = ((31, _LOW33, _MIX1), (29, _LOW35, _MIX2), (32, _LOW32, None))


def mix_bits_(x: Tensor, scratch: Tensor) -> Tensor:
    """The counter hash's three xor-shift-multiply rounds, in place on an int64 state (`scratch`: same shape)."""
    for shift, low, mix in _ROUNDS:
        torch.bitwise_right_shift(x, shift, out=scratch)
        x.bitwise_xor_(scratch.bitwise_and_(low))
        if mix is not None:
            x.mul_(mix)
    return x


def keep_decisions(seed: Tensor, head: Tensor, row: Tensor, col: Tensor, threshold: int) -> Tensor:
    """[`hashed_keep`]'s decisions at flat head `head`, query `row` and key `col` (integer tensors, broadcast
    together) against `threshold` ([`keep_threshold`]), computed out of place: the form a traced function takes
    (FlexAttention's `score_mod`, compiled into its kernel on CUDA), with the same bits as the in-place hash."""
    x = seed + (head.to(torch.int64) + 1) * _GOLDEN + row.to(torch.int64) * _MIX1 + col.to(torch.int64) * _MIX2
    for shift, low, mix in _ROUNDS:
        x = x ^ ((x >> shift) & low)
        if mix is not None:
            x = x * mix
    return ((x >> 40) & ((1 << _UNIFORM_BITS) - 1)) >= threshold


def counter_uniform(seed: int | Tensor, num_heads: int, rows: Tensor, cols: Tensor) -> Tensor:
    """Uniforms in [0, 1) that depend only on `(seed, head, row position, column position)`.

    SBM's eval-mode Bernoulli sampling uses them instead of a generator stream, so a pair gets the same draw whatever
    the batch size, the padded length or whether the decoder runs incrementally with a cache; the global rows'
    attention dropout ([`hashed_keep`]) uses them so that a Triton kernel can draw the same mask from the same hash
    (`kernels/triton/hashing.py`) without storing it.

    Args:
        seed (`int` or `torch.LongTensor` of shape `()`): seed (SBM: the config seed mixed with the layer and site;
            dropout: a draw of the call, on the device, so that no host sync reads it).
        num_heads (`int`): number of heads `H` (or of (batch, head) pairs).
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
        mix_bits_(x, tmp)
        x.bitwise_right_shift_(40).bitwise_and_((1 << 24) - 1)
        out[:, start : start + step].copy_(x).mul_(1.0 / (1 << 24))
    return out


def keep_threshold(dropout_p: float) -> int:
    """The integer `t` with `u >= dropout_p` exactly when the 24-bit integer of uniform `u` is at least `t` (what the
    kernels compare, so that both sides decide every entry alike)."""
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")
    return min(math.ceil(dropout_p * (1 << _UNIFORM_BITS)), 1 << _UNIFORM_BITS)


def hashed_keep(seed: Tensor, num_heads: int, rows: Tensor, cols: Tensor, dropout_p: float) -> Tensor:
    """Attention-dropout keep mask `(num_heads, n, m)` bool from the counter hash: entry `(h, i, j)` is kept with
    probability `1 - dropout_p` (to 2^-24), independently of the others, as a function of `(seed, h, rows[i],
    cols[j])` only."""
    threshold = keep_threshold(dropout_p) / (1 << _UNIFORM_BITS)  # exact in fp32: a multiple of 2^-24
    return counter_uniform(seed, num_heads, rows, cols) >= threshold


def grid_keep(seed: Tensor, shape: tuple[int, ...], dropout_p: float) -> Tensor:
    """Attention-dropout keep mask of shape `(B, H, n, width)` bool: entry `(b, h, i, s)` is the counter hash of
    `(seed, b * H + h, i, s)`, as a kernel computes it from the (head, query, slot) it reads."""
    B, H, n, width = shape
    rows = torch.arange(n, device=seed.device)
    columns = torch.arange(width, device=seed.device)
    return hashed_keep(seed, B * H, rows, columns, dropout_p).view(B, H, n, width)


def position_keep(seed: Tensor, num: int, dropout_p: float) -> Tensor:
    """Attention-dropout keep mask `(num,)` bool of a list of entries (an edge list), one decision per position: the
    counter hash of `(seed, head 0, row 0, position)`, as a kernel computes it from the position it reads."""
    positions = torch.arange(num, device=seed.device)
    return hashed_keep(seed, 1, positions[:1] * 0, positions, dropout_p).view(num)


def seed_or_draw(
    seed: Tensor | None, name: str, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """`seed` (`ValueError` naming the argument `name` unless it is a `()` int64 tensor), or a fresh [`draw_seed`]."""
    if seed is None:
        return draw_seed(device, generator)
    if seed.dtype != torch.int64 or seed.dim() != 0:
        raise ValueError(f"{name} must be a () int64 tensor, got {seed.dtype} of shape {tuple(seed.shape)}")
    return seed


def draw_seed(device: torch.device, generator: torch.Generator | None = None) -> Tensor:
    """A fresh hash seed `()` int64 on `device` from the (default) generator: one op, no host sync."""
    return torch.randint(1 << 62, (), device=device, dtype=torch.int64, generator=generator)


def draw_seeds(count: int, device: torch.device, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
    """`count` fresh hash seeds, `()` int64 each, from one draw (one op; the seeds are views of it)."""
    return torch.randint(1 << 62, (count,), device=device, dtype=torch.int64, generator=generator).unbind()

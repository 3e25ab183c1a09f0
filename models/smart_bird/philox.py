"""Counter-based exponential noise in torch: the plain reference of the noise the Triton sampler draws in-kernel.

The counter sampler gives every (example, head, query, key) its own `E ~ Exp(1)` as a pure function of a 64-bit seed
and the four indices: Philox-4x32 with 10 rounds (the generator `tl.philox` implements; Salmon et al., SC 2011) on
the counter `(key, query, head, example)` under the key `(seed mod 2**32, seed // 2**32)`, whose first output word
`x` becomes `u = (floor(x / 2**8) + 1/2) / 2**24` in `(0, 1)` (exact in fp32) and `E = -log u`. Nothing has to be
stored or drawn in order: a kernel draws a pair's noise only where it can matter, and this module draws any block of
it for the reference sampler and the tests.

Unsigned 32-bit words are held in int64 tensors: the product of two words is below 2**64, so int64 multiplication
(which wraps modulo 2**64) keeps its low and high words exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Philox-4x32 round multipliers and Weyl key increments (the generator's published constants).
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_WORD = 0xFFFFFFFF
ROUNDS = 10
#: 24 random bits per uniform: `(x >> 8) + 0.5` is an integer plus a half below 2**24, exact in fp32.
UNIFORM_SHIFT = 8
UNIFORM_SCALE = 2.0**-24


def philox4x32(seed: Tensor, c0: Tensor, c1: Tensor, c2: Tensor, c3: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox-4x32-10 of the counter `(c0, c1, c2, c3)` under a 64-bit key.

    Args:
        seed (`torch.LongTensor`): the key, broadcastable to the counters; its low word is the first key word.
        c0, c1, c2, c3 (`torch.LongTensor`): counter words in `[0, 2**32)`, broadcastable to one shape.

    Returns:
        The four output words, int64 tensors of the broadcast shape with values in `[0, 2**32)`.
    """
    k0, k1 = seed & _WORD, (seed >> 32) & _WORD
    for _ in range(ROUNDS):
        p0, p2 = _ROUND_A * c0, _ROUND_B * c2  # full 64-bit products (modulo 2**64 in int64: exact bits)
        c0, c1, c2, c3 = ((p2 >> 32) & _WORD) ^ c1 ^ k0, p2 & _WORD, ((p0 >> 32) & _WORD) ^ c3 ^ k1, p0 & _WORD
        k0, k1 = (k0 + _KEY_A) & _WORD, (k1 + _KEY_B) & _WORD
    return c0, c1, c2, c3


def uniform_exponential(word: Tensor) -> Tensor:
    """`E ~ Exp(1)` in fp32 from uniform 32-bit words (int64 tensor): `-log u`, values in `(0, 17.33]`."""
    return -torch.log(((word >> UNIFORM_SHIFT).to(torch.float32) + 0.5) * UNIFORM_SCALE)


def counter_exponential(seed: Tensor, example: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
    """`E ~ Exp(1)` of every `(example, head, query, key)` the index tensors broadcast to, in fp32.

    Args:
        seed (`torch.LongTensor` of shape `(1,)`): the 64-bit seed (any int64 value).
        example, head, query, key (`torch.LongTensor`): non-negative indices below `2**32`, broadcastable.

    Returns:
        `torch.FloatTensor` of the broadcast shape, values in `(0, 17.33]`.
    """
    word, _, _, _ = philox4x32(seed, key, query, head, example)
    return uniform_exponential(word)


def counter_noise_rows(
    seed: Tensor, batch: int, heads: int, start: int, stop: int, num_keys: int, per_example: bool
) -> Tensor:
    """The noise of query rows `[start, stop)` for every head and key: `(B, H, R, N)` fp32 (`B = 1` broadcast over
    the batch when `per_example` is False, i.e. every example draws the noise of example 0)."""
    device = seed.device
    example = torch.arange(batch if per_example else 1, device=device)[:, None, None, None]
    head = torch.arange(heads, device=device)[None, :, None, None]
    query = torch.arange(start, stop, device=device)[None, None, :, None]
    key = torch.arange(num_keys, device=device)[None, None, None, :]
    return counter_exponential(seed, example, head, query, key)

"""Block-sparse attention through FlexAttention (`torch.nn.attention.flex_attention`).

A family states its pattern as tiles: for every tile of `q_block` queries, the tiles of `kv_block` keys it touches,
split into *full* tiles (every pair attended: no mask is evaluated there) and *partial* tiles (a `mask_mod(b, h, q,
kv)` decides every pair). FlexAttention then computes only the listed tiles, in one fused kernel forward and one
backward, saving nothing but q, k, v, the output and the log-sum-exp (as SDPA's FlashAttention does).

- [`block_mask_from_tiles`]: the tile classification of every head -> the ordered tile lists of a `BlockMask`, built
  once per pattern by the family and cached;
- [`with_mask_mod`]: the same tile lists with another `mask_mod` (e.g. one that reads this batch's key validity),
  without copying any tensor;
- [`flex_block_attention`]: the call. On CUDA it runs the compiled kernel; elsewhere torch's eager implementation
  (materialised scores, forward only: torch refuses FlexAttention's backward on CPU), which the CPU tests use;
- [`PositionPermutation`]: reorders the sequence of every head by an index table (one `index_select`; its backward is
  the inverse table, not an atomic scatter), for patterns that are block-sparse only in another order.

Only the API that torch 2.11 and 2.13 share is used: `BlockMask.from_kv_blocks` with `BLOCK_SIZE`, `mask_mod` and
`seq_lengths`, and `flex_attention(q, k, v, score_mod=..., block_mask=..., scale=..., return_aux=...)` with
`AuxRequest(lse=True)`.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention
from torch.utils.checkpoint import checkpoint

from .hashing import keep_decisions, keep_threshold

#: `mask_mod(b, h, q_idx, kv_idx) -> bool tensor`: whether query `q_idx` of head `h` attends to key `kv_idx`.
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
#: `score_mod(score, b, h, q_idx, kv_idx) -> score`: the logit FlexAttention uses for a pair.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def _ordered(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """`(H, Q, K)` bool tiles -> `(1, H, Q)` counts and `(1, H, Q, K)` indices, the listed tiles first, ascending."""
    counts = tiles.sum(-1, dtype=torch.int32)
    # A stable descending sort of the 0/1 flags lists the marked tiles first, in ascending order (the layout
    # `create_block_mask` produces).
    indices = torch.sort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).indices.to(torch.int32)
    return counts[None], indices[None]


def block_mask_from_tiles(
    partial: Tensor,
    full: Tensor | None,
    *,
    q_block: int,
    kv_block: int,
    seq_lengths: tuple[int, int],
    mask_mod: MaskMod,
) -> BlockMask:
    """A `BlockMask` (batch dimension 1, broadcast over the batch) from the tile classification of every head.

    Args:
        partial (`torch.BoolTensor` of shape `(H, ceil(Nq / q_block), ceil(Nk / kv_block))`): tiles where `mask_mod`
            decides each pair.
        full (`torch.BoolTensor` of the same shape, *optional*): tiles whose every pair is attended (disjoint from
            `partial`); `None` sends every tile through `mask_mod`.
        q_block (`int`): queries per tile.
        kv_block (`int`): keys per tile.
        seq_lengths (`tuple[int, int]`): `(Nq, Nk)`.
        mask_mod (`Callable`): the pair rule of the partial tiles.

    Returns:
        `BlockMask` on the device of `partial`.
    """
    if full is not None and (partial & full).any():
        raise ValueError("block_mask_from_tiles: a tile cannot be both partial and full.")
    kv_num_blocks, kv_indices = _ordered(partial)
    full_num_blocks, full_indices = _ordered(full) if full is not None else (None, None)
    return BlockMask.from_kv_blocks(
        kv_num_blocks=kv_num_blocks,
        kv_indices=kv_indices,
        full_kv_num_blocks=full_num_blocks,
        full_kv_indices=full_indices,
        BLOCK_SIZE=(q_block, kv_block),
        mask_mod=mask_mod,
        seq_lengths=seq_lengths,
    )


def with_mask_mod(block_mask: BlockMask, mask_mod: MaskMod) -> BlockMask:
    """`block_mask` (same tile tensors, not copied) with another `mask_mod`; the tiles must still cover it."""
    out = copy.copy(block_mask)
    out.mask_mod = mask_mod
    return out


def _attention(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, scale: float) -> Tensor:
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale)


def _kept_attention(
    q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, scale: float, score_mod: ScoreMod
) -> tuple[Tensor, Tensor]:
    lse = AuxRequest(lse=True)
    out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, return_aux=lse)
    return out, aux.lse


def _log_sum_exp(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, scale: float) -> Tensor:
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, return_aux=AuxRequest(lse=True))[1].lse


@functools.cache
def _compiled(call: Callable) -> Callable:
    # FlexAttention is a fused kernel only when compiled; eagerly it materialises every score. Compiled with
    # dynamo's automatic dynamic shapes: a second sequence length recompiles once for all lengths, where static
    # shapes would recompile per length until dynamo's limit and then run eagerly. Each of the three calls is its own
    # function, so that each has its own cache (and recompile limit) rather than sharing FlexAttention's.
    return torch.compile(call)


def _flex_call(call: Callable, *args) -> Tensor | tuple[Tensor, Tensor]:
    """`call(q, k, v, ...)` ([`_attention`], [`_kept_attention`], [`_log_sum_exp`]): compiled on CUDA; elsewhere
    torch's eager FlexAttention (materialised scores, forward only), which the CPU tests use."""
    if torch.compiler.is_compiling():
        return call(*args)  # inside a compiled model: its graph takes the call in, as FlexAttention expects
    if args[0].device.type == "cuda":
        return _compiled(call)(*args)
    with warnings.catch_warnings():
        # Off CUDA this path only serves the CPU checks; torch's note that it is unfused is expected here.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return call(*args)


def dropout_score_mod(keep_seed: Tensor, num_heads: int, dropout_p: float) -> ScoreMod:
    """`score_mod(score, b, h, q, kv)` that gives `-inf` to the entries attention dropout drops: the counter hash of
    `(keep_seed, b * num_heads + h, q, kv)` ([`~attnzoo.kernels.hashing.keep_decisions`]); compiled into
    FlexAttention's kernel on CUDA, where nothing is stored for it."""
    threshold = keep_threshold(dropout_p)

    def kept_scores(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return torch.where(keep_decisions(keep_seed, b * num_heads + h, q_idx, kv_idx, threshold), score, -math.inf)

    return kept_scores


def flex_block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_mask: BlockMask,
    *,
    scale: float,
    dropout_p: float = 0.0,
    keep_seed: Tensor | None = None,
) -> Tensor:
    """Softmax attention over the pairs of `block_mask` (rows without any pair output zeros).

    With `keep_seed`, attention dropout: entry `(b, h, i, j)` of the probabilities is dropped, and the others scaled
    by `1 / (1 - dropout_p)`, by the counter hash of `(keep_seed, b * H + h, i, j)`
    (`kernels.hashing.keep_decisions`, the decisions of `hashed_keep`). FlexAttention has no dropout (a `score_mod`
    acts before the softmax, dropout after it), so it takes two calls: the softmax over the kept entries (a
    `score_mod` gives the dropped ones `-inf`) and the log-sum-exp over all of them; the kept entries' output scaled
    by their share of the full normaliser, `exp(lse_kept - lse_all) / (1 - p)`, is the dropped-out attention. Both
    calls are fused kernels (no mask stored: the hash is recomputed in backward), and autograd differentiates through
    the two log-sum-exps.

    Args:
        q, k, v (`torch.Tensor` of shape `(B, H, N, d)`): queries, keys and values of one dtype.
        block_mask (`BlockMask`): the tiles and the pair rule (batch dimension 1 or `B`, `H` heads).
        scale (`float`): logit scale.
        dropout_p (`float`, *optional*, defaults to 0.0): the dropout probability, with `keep_seed`.
        keep_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the dropout mask (`None`: no
            dropout).

    Returns:
        `torch.Tensor` of shape `(B, H, N, d)`.
    """
    if keep_seed is None or dropout_p == 0.0:
        return _flex_call(_attention, q, k, v, block_mask, scale)
    if dropout_p >= 1.0:
        return _flex_call(_attention, q, k, v, block_mask, scale) * 0.0  # everything dropped, as F.dropout gives
    kept_scores = dropout_score_mod(keep_seed, q.shape[1], dropout_p)
    out, kept_lse = _flex_call(_kept_attention, q, k, v, block_mask, scale, kept_scores)  # lse: (B, H, N) fp32
    # Only the second call's log-sum-exp is used, but its backward needs its output: recomputed there rather than
    # kept (one more forward of the kernel per step, for dense attention's memory).
    all_lse = checkpoint(_flex_call, _log_sum_exp, q, k, v, block_mask, scale, use_reentrant=False)
    # A row without any pair has both log-sum-exps -inf: the clamp keeps its factor 0 (and its gradients finite).
    shift = all_lse.clamp_min(torch.finfo(all_lse.dtype).min).add_(math.log1p(-dropout_p))  # lse_all + log(1 - p)
    factor = (kept_lse - shift).exp_()  # (B, H, N): the kept share of the row's weight, over 1 - p
    return out * factor.unsqueeze(-1).to(out.dtype)


class PositionPermutation:
    """Per-head permutations of the sequence, `out[b, h, n] = x[b, h, table[h, n]]`, with the flat row indices of
    the two memory layouts computed once (so that applying one is a single `index_select`).

    Args:
        table (`torch.LongTensor` of shape `(H, N)`): every row a permutation of `range(N)`.
    """

    def __init__(self, table: Tensor):
        heads, length = table.shape
        steps = torch.arange(length, device=table.device).expand_as(table)
        inverse = torch.empty_like(table).scatter_(1, table, steps)
        head = torch.arange(heads, device=table.device)[:, None]
        #: `(H, N)` source position of every output position, and the inverse permutations
        self.table, self.inverse = table, inverse
        # Flat row of (h, n): n * H + h when x is laid out (B, N, H, d) (the head split's view), h * N + n when it is
        # (B, H, N, d) contiguous; [forward, inverse] for each.
        self._by_position = [(t * heads + head).T.reshape(-1) for t in (table, inverse)]
        self._by_head = [(t + head * length).reshape(-1) for t in (table, inverse)]

    def apply(self, x: Tensor) -> Tensor:
        """`x` `(B, H, N, d)` permuted (differentiable; the backward applies the inverse)."""
        return _Permute.apply(x, *self._by_position, *self._by_head)

    def undo(self, x: Tensor) -> Tensor:
        """The inverse of [`apply`]."""
        return _Permute.apply(x, *self._by_position[::-1], *self._by_head[::-1])


def _gather_rows(x: Tensor, by_position: Tensor, by_head: Tensor) -> Tensor:
    # One index_select over the rows in the order memory holds them; other layouts are made contiguous first.
    batch, heads, length, dim = x.shape
    if x.transpose(1, 2).is_contiguous():
        rows = x.transpose(1, 2).reshape(batch, length * heads, dim).index_select(1, by_position)
        return rows.view(batch, length, heads, dim).transpose(1, 2)
    return x.reshape(batch, heads * length, dim).index_select(1, by_head).view(batch, heads, length, dim)


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(x: Tensor, by_position: Tensor, back_by_position: Tensor, by_head: Tensor, back_by_head: Tensor):
        return _gather_rows(x, by_position, by_head)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[2], inputs[4])

    @staticmethod
    def backward(ctx, grad: Tensor):
        # A permutation's adjoint is its inverse: one more gather, where index_select's own backward would zero-fill
        # and scatter-add.
        back_by_position, back_by_head = ctx.saved_tensors
        return _gather_rows(grad, back_by_position, back_by_head), None, None, None, None

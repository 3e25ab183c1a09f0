"""Masking helpers: HF `attention_mask` -> boolean key validity, and dense boolean attention masks."""

from __future__ import annotations

import torch


def key_valid_from_attention_mask(attention_mask: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
    """Turn an HF `attention_mask` of shape `(B, N)` (1 = real token, 0 = padding) into a boolean `(B, N)` mask.

    Returns `None` when there is no mask or every position is real, so dense paths can skip masking entirely.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(
            f"`attention_mask` must have shape (batch, sequence_length) with 1 for real tokens and 0 for padding, "
            f"got a tensor of shape {tuple(attention_mask.shape)}."
        )
    if tuple(attention_mask.shape) != (batch, length):
        raise ValueError(
            f"`attention_mask` has shape {tuple(attention_mask.shape)} but the inputs have shape {(batch, length)}."
        )
    key_valid = attention_mask.bool()
    # One host sync per forward (not per layer) lets unpadded batches take the mask-free SDPA path.
    if bool(key_valid.all()):
        return None
    return key_valid


def causal_bool_mask(query_len: int, key_len: int, query_offset: int, device: torch.device) -> torch.Tensor:
    """`(Nq, Nk)` boolean mask, True where key j <= query i + offset."""
    q_pos = torch.arange(query_len, device=device).unsqueeze(-1) + query_offset
    k_pos = torch.arange(key_len, device=device).unsqueeze(0)
    return k_pos <= q_pos


def attention_bool_mask(
    key_valid: torch.Tensor | None,
    query_len: int,
    key_len: int,
    causal: bool,
    query_offset: int = 0,
    device: torch.device | None = None,
    kernel_is_causal: bool = True,
) -> torch.Tensor | None:
    """Dense boolean mask `(B or 1, 1, Nq, Nk)` (True = may attend), or `None` when nothing is masked.

    For causal attention without padding `None` is returned only when the kernel's own causal flag is equivalent
    (aligned queries and keys, or a single query that may see every cached key). A kernel without such a flag
    (`kernel_is_causal=False`, e.g. the reference `dense_masked_attention`) gets causality in the mask whenever
    there is more than one query.
    """
    needs_causal = causal and query_len > 1 and (query_len != key_len or not kernel_is_causal)
    if key_valid is None and not needs_causal:
        return None
    device = key_valid.device if key_valid is not None else device
    mask = None
    if key_valid is not None:
        mask = key_valid[:, None, None, :]  # (B, 1, 1, Nk)
    if causal and query_len > 1:
        cm = causal_bool_mask(query_len, key_len, query_offset, device)[None, None]
        mask = cm if mask is None else mask & cm
    if mask is not None and mask.shape[-2] != query_len:
        mask = mask.expand(-1, -1, query_len, -1)
    return mask

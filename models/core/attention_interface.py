"""Dense attention through transformers' attention interface, so `attn_implementation` picks the kernel.

`config._attn_implementation` names an entry of `transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS` ("sdpa",
"flash_attention_2", "flex_attention", or one registered with `AttentionInterface.register`), or "eager", the
plain implementation below; the lookup is the one BERT and BART make. Every dense attention of the zoo (the dense
family, decoder self- and cross-attention, SBM's dense sites) computes through :func:`interface_attention`; the
sparse attentions of the methods run their own kernels and ignore the choice.

Each kernel gets the mask in the form it takes: a boolean `(B, 1, Nq, Nk)` mask (eager, SDPA and registered
kernels), a block mask (flex attention) or the `(B, Nk)` key-padding mask (flash
attention, with its causal flag). Rows without any key to attend to come out as zeros whatever the kernel.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

#: what a config without a model (a bare `ZooConfig`) runs: the implementation transformers picks by default
DEFAULT_IMPLEMENTATION = "sdpa"


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention (`attn_implementation="eager"`), in the interface's calling convention.

    Args:
        query, key, value (`torch.Tensor` of shape `(B, H, N, d)`): head-split inputs.
        attention_mask (`torch.Tensor`, *optional*): boolean (True = may attend) or additive float mask,
            broadcastable to `(B, H, Nq, Nk)`.

    Returns:
        The output `(B, Nq, H, d)` and the probabilities `(B, H, Nq, Nk)`.
    """
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scaling  # (B, H, Nq, Nk), softmax in fp32
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(torch.float32).min)
        else:
            scores = scores + attention_mask.float()
    probs = scores.softmax(-1).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def implementation_of(module: nn.Module) -> str:
    """The attention implementation `module.config` selects (SDPA for a config that no model has set)."""
    return getattr(module.config, "_attn_implementation", None) or DEFAULT_IMPLEMENTATION


def takes_causal_flag(implementation: str) -> bool:
    """Whether the kernel of `implementation` applies causality itself (SDPA's and flash attention's `is_causal`);
    the others read it from the mask."""
    return implementation == "sdpa" or implementation.startswith("flash_attention")


def interface_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_valid: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Dense attention with the kernel `module.config._attn_implementation` selects.

    Args:
        module (`nn.Module`): the calling attention (`config`, `scaling`, `dropout`, `is_causal`, `training`).
        query, key, value (`torch.Tensor` of shape `(B, H, N, d)`): head-split inputs.
        key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): real keys (`None`: all real).
        mask (`torch.BoolTensor` broadcastable to `(B, 1, Nq, Nk)`, *optional*): the full boolean mask (padding and
            causality, see `attention_bool_mask`); `None` when nothing is masked beyond the aligned causal flag,
            which only a kernel that [`takes_causal_flag`] may leave out of the mask.

    Returns:
        `torch.Tensor` of shape `(B, H, Nq, d)`.
    """
    implementation = implementation_of(module)
    function = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    causal = module.is_causal and query.shape[2] > 1
    # The mask carries causality where there is one; without a mask the kernel's causal flag does it.
    kernel_mask, kernel_causal = mask, causal and mask is None
    if implementation.startswith("flash_attention"):
        # Flash attention unpads with the key-padding mask and applies causality itself (bottom-right aligned, as
        # queries after a KV cache are).
        kernel_mask, kernel_causal = (None if key_valid is None else key_valid.to(torch.int32)), causal
    elif implementation == "flex_attention" and mask is not None:
        # Flex attention takes the mask as a block mask (one row per example, blocks without any key skipped).
        full = mask.expand(query.shape[0], 1, query.shape[2], key.shape[2])
        kernel_mask = create_block_mask(
            lambda b, h, q, k: full[b, 0, q, k], full.shape[0], None, full.shape[2], full.shape[3], query.device
        )
    out, _ = function(
        module,
        query,
        key,
        value,
        kernel_mask,
        dropout=module.dropout if module.training else 0.0,
        scaling=module.scaling,
        is_causal=kernel_causal,
    )
    out = out.transpose(1, 2)  # (B, Nq, H, d) -> (B, H, Nq, d)
    if mask is not None:
        # Kernels disagree on rows without any valid key (NaN, uniform weights over padding): make them zeros.
        out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return out

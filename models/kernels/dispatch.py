"""Which implementation computes an attention primitive, decided in one place for every family.

A family calls one function per primitive and passes its `config.attention_backend`:

- [`gathered_attention`]: every query attends to its own K slots (Smart Bird's sampled keys, A²-Former's
  interpolated points as two weighted entries per slot);
- [`edge_attention`]: attention along an edge list with a per-row softmax (SBM's sampled graphs, FSAT's predicted
  edges, Sparse Transformer's merged strided pattern);
- [`dense_attention`]: masked softmax attention over every key (the dense family, dense fallbacks);
- [`interpolated_attention`]: every query attends to K points at fractional positions offset from itself, each
  read from its two neighbouring keys (A²-Former); the selection is part of the primitive, so that the Triton
  implementation computes it inside the kernel;
- [`key_slot_attention`]: every key names its queries in fixed slots, with Gaussian confidences and separate softmax
  groups (FSAT's predicted and exploration edges and its global keys);
- [`uses_flex_attention`]: whether a family's block-sparse pattern goes to FlexAttention ([`attnzoo.kernels.flex`]).

The backend name and the device pick the implementation:

- `"reference"`: plain autograd (gather / einsum, dense masked softmax), on any device: the truth the others are
  tested against.
- `"fast"` (default): on CUDA the Triton kernels when `triton` imports and q, k, v share a dtype among fp32, bf16 and
  fp16; otherwise (CPU, fp64, no triton) the torch paths: CSR SDDMM / SpMM Functions and SDPA.
- `"triton"`: the Triton kernels. On CUDA they compile; on CPU they run under Triton's interpreter when
  `TRITON_INTERPRET=1` was set before they were first imported (slow: for tests), and are refused otherwise.

Dense attention has no Triton kernel of its own: its fast and Triton implementations are
`F.scaled_dot_product_attention` (FlashAttention / memory-efficient kernels on CUDA). Triton is an optional
dependency (`pip install attnzoo[gpu]`); nothing here imports it before a Triton implementation is asked for.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

from .dense import dense_masked_attention
from .dropout import call_dropout
from .edgelist import check_edges, edge_attention_reference_with_mask, edge_attention_with_mask
from .gathered import check_gathered, gathered_attention_reference_with_mask, gathered_attention_with_mask
from .global_rows import check_global_rows, replace_global_rows, row_settings
from .hashing import grid_keep, position_keep
from .interpolated import check_interpolated, interpolated_attention_torch
from .key_slots import check_key_slots, key_slot_attention_torch

#: Values of `ZooConfig.attention_backend`.
ATTENTION_BACKENDS = ("fast", "reference", "triton")
#: dtypes the Triton kernels take (fp32 accumulation inside); anything else stays on the torch paths.
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: the narrowest heads inductor's CUDA FlexAttention compiles ([`uses_flex_attention`])
_FLEX_MIN_HEAD_DIM = 16


@functools.cache
def triton_installed() -> bool:
    """Whether the optional `triton` package can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a blocked import (`sys.modules["triton"] = None`) counts as absent
        return False


@functools.cache
def _load_triton_kernels() -> ModuleType | str:
    """attnzoo's Triton kernel module, or why it cannot be imported (a broken triton install; remote code copied to
    the Hub without it)."""
    try:
        return importlib.import_module(".triton", __package__)
    except ImportError as err:
        return f"{type(err).__name__}: {err}"


def _triton_kernels() -> ModuleType:
    kernels = _load_triton_kernels()
    if isinstance(kernels, str):
        raise ValueError(f"attention_backend='triton': attnzoo's Triton kernels cannot be imported ({kernels}).")
    return kernels


def resolve_backend(backend: str, device: torch.device, *dtypes: torch.dtype) -> str:
    """The implementation (`"reference"`, `"torch"` or `"triton"`) that runs `backend` for tensors on `device`.

    Args:
        backend (`str`): one of [`ATTENTION_BACKENDS`].
        device (`torch.device`): device of the inputs.
        dtypes (`torch.dtype`): dtypes of q, k and v (the Triton kernels need one dtype among [`TRITON_DTYPES`]).

    Raises:
        ValueError: unknown backend, or `"triton"` where it cannot run (not installed, CPU without the interpreter,
            another device type, fp64 inputs).
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"`attention_backend` must be one of {ATTENTION_BACKENDS}, got {backend!r}.")
    if backend == "reference":
        return "reference"
    triton_dtypes = len(set(dtypes)) <= 1 and all(d in TRITON_DTYPES for d in dtypes)
    if backend == "fast":
        usable = device.type == "cuda" and triton_dtypes and triton_installed()
        return "triton" if usable and not isinstance(_load_triton_kernels(), str) else "torch"
    if not triton_installed():
        raise ValueError(
            "attention_backend='triton' needs the optional dependency triton (`pip install attnzoo[gpu]`); "
            "use 'fast' for the torch kernels."
        )
    kernels = _triton_kernels()
    if device.type == "cpu":
        if not kernels.interpreted():  # built for the interpreter (TRITON_INTERPRET=1, "true", ... at first import)
            raise ValueError(
                "attention_backend='triton' on CPU runs the Triton kernels under Triton's interpreter, which needs "
                "TRITON_INTERPRET=1 in the environment before attnzoo's Triton kernels are first imported (it is "
                "slow: for tests). Use 'fast' for the CPU kernels, or a CUDA device."
            )
    elif device.type != "cuda":
        raise ValueError(f"attention_backend='triton' runs on CUDA (or on CPU under the interpreter), not {device}.")
    if not triton_dtypes:
        raise ValueError(
            f"attention_backend='triton' takes q, k, v of one dtype among {TRITON_DTYPES}, "
            f"got {sorted(map(str, dtypes))}."
        )
    return "triton"


def attentive_sampler(backend: str, device: torch.device) -> Callable[..., tuple[Tensor, Tensor]] | None:
    """Smart Bird's fused attentive sampler (`attentive_sample_triton`) where `backend` runs the Triton kernels on
    `device`, else `None`: the caller then runs its torch sampler (`attnzoo.smart_bird.sampling`).

    Raises:
        ValueError: as [`resolve_backend`] (e.g. `"triton"` on CPU without the interpreter).
    """
    if resolve_backend(backend, device, torch.float32) != "triton":
        return None
    return _triton_kernels().attentive_sample_triton


def fastrg_sampler(backend: str, device: torch.device) -> tuple[Callable[..., Tensor], Callable[..., tuple]] | None:
    """SBM's fused fastRG sampler where `backend` runs the Triton kernels on `device`: its two steps around the sort,
    `(fastrg_pair_ids_triton, fastrg_edge_list_triton)`, else `None` (the caller runs its torch reference,
    `attnzoo.sbm.fastrg`; both give the same graph).

    Raises:
        ValueError: as [`resolve_backend`] (e.g. `"triton"` on CPU without the interpreter).
    """
    if resolve_backend(backend, device, torch.float32) != "triton":
        return None
    kernels = _triton_kernels()
    return kernels.fastrg_pair_ids_triton, kernels.fastrg_edge_list_triton


def _method_kernels(backend: str, device: torch.device, dtype: torch.dtype) -> ModuleType | None:
    """attnzoo's Triton kernel module where `backend` runs the Triton kernels for a method's own `dtype` tensors on
    `device`, else `None`: outside the attention primitives, inputs in another dtype (fp64) fall back to the
    method's torch code rather than being refused."""
    if backend == "reference" or dtype not in TRITON_DTYPES or resolve_backend(backend, device, dtype) != "triton":
        return None
    return _triton_kernels()


def fsat_index_slots(backend: str, device: torch.device, dtype: torch.dtype) -> Callable[..., tuple] | None:
    """FSAT's fused index prediction and slot selection (`fsat_index_slots_triton`) where `backend` runs the Triton
    kernels for a `dtype` pooled cross on `device`, else `None`: the caller then runs its torch reference
    (`FSATAttention.predict_indices` and `select_slots`)."""
    kernels = _method_kernels(backend, device, dtype)
    return None if kernels is None else kernels.fsat_index_slots_triton


def fsat_pooling_kernels(backend: str, device: torch.device, dtype: torch.dtype) -> ModuleType | None:
    """The Triton kernels of FSAT's pooled cross between its transforms (`attnzoo.kernels.triton.fsat_pooling`) where
    `backend` runs the Triton kernels for `dtype` feature maps on `device`, else `None` (the torch code)."""
    kernels = _method_kernels(backend, device, dtype)
    return None if kernels is None else kernels.fsat_pooling


def sbm_selection_kernels(
    backend: str, device: torch.device, dtype: torch.dtype, head_dim: int, num_clusters: int
) -> ModuleType | None:
    """SBM's fused membership network and block matrix (`attnzoo.kernels.triton.memberships`) where `backend` runs
    the Triton kernels for `dtype` parameters on `device` and the kernels take the head size and number of clusters,
    else `None`: the caller then runs its torch reference (`SBMAttention.selection`)."""
    kernels = _method_kernels(backend, device, dtype)
    if kernels is None or not kernels.memberships.membership_kernels_support(head_dim, num_clusters):
        return None
    return kernels.memberships


def uses_flex_attention(backend: str, device: torch.device, *dtypes: torch.dtype, head_dim: int) -> bool:
    """Whether a block-sparse pattern runs through FlexAttention ([`attnzoo.kernels.flex`]) rather than the
    primitives below: with `"fast"` on CUDA where the Triton kernels could run (FlexAttention compiles to Triton)
    and the heads are wide enough for its CUDA kernels.

    `"triton"` keeps attnzoo's own Triton kernels (so that the two fast paths can be compared), and the CPU keeps the
    torch paths: torch has no FlexAttention backward there.

    Args:
        backend (`str`): one of [`ATTENTION_BACKENDS`].
        device (`torch.device`): device of the inputs.
        dtypes (`torch.dtype`): dtypes of q, k and v.
        head_dim (`int`): the smaller of the query/key and the value head sizes.
    """
    implementation = resolve_backend(backend, device, *dtypes)  # validates the name
    # Inductor's CUDA FlexAttention multiplies head-dim tiles with tl.dot, which needs at least 16 columns (it raises
    # NotImplementedError below that): narrower heads keep the primitives.
    return backend == "fast" and implementation == "triton" and head_dim >= _FLEX_MIN_HEAD_DIM


def gathered_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    valid: Tensor | None = None,
    *,
    weight: Tensor | None = None,
    logit_bias: Tensor | None = None,
    dot_product: bool = True,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    keep: Tensor | None = None,
    global_rows: int = 0,
    key_valid: Tensor | None = None,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
    backend: str = "fast",
) -> Tensor:
    """Each query attends to its own `K` slots; a slot is one key row or a weighted mix of `J` key rows.

    Slot `s` of query `n` reads `k~ = sum_j weight[n, s, j] k[idx[n, s, j]]` (likewise `v~`; one entry of weight 1
    when `idx` is `(B, H, Nq, K)` and `weight` is None). Its logit is `logit_bias[n, s] + scale * <q_n, k~>` (the dot
    product only when `dot_product`), the softmax runs over the valid slots, dropout multiplies the probabilities
    and `out_n = sum_s p_s v~_s`. Duplicate indices count separately; rows without a valid slot (or whose logits are
    all -inf) output exact zeros. Gradients reach q, k, v, `weight` and `logit_bias`. q, k and v share one dtype
    (`ValueError` otherwise, as in SDPA); half-precision inputs are accumulated in fp32 and the result has their dtype.

    Args:
        q (`torch.Tensor` of shape `(B, H, Nq, d)`): queries.
        k (`torch.Tensor` of shape `(B, H, Nk, d)`): keys.
        v (`torch.Tensor` of shape `(B, H, Nk, d)`): values.
        idx (`torch.LongTensor` of shape `(B, H, Nq, K)` or `(B, H, Nq, K, J)`): key positions in `[0, Nk)` (any
            value in invalid slots).
        valid (`torch.BoolTensor` of shape `(B, H, Nq, K)`, *optional*): slot validity, `None` means all valid.
        weight (`torch.Tensor` of the shape of `idx`, *optional*): mixing weights of the entries (required when
            `idx` has `J` entries per slot).
        logit_bias (`torch.Tensor` broadcastable to `(B, H, Nq, K)`, *optional*): added to the slot logits.
        dot_product (`bool`, *optional*, defaults to `True`): include `scale * <q, k~>` in the logits.
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout on the probabilities.
        training (`bool`, *optional*, defaults to `False`): apply dropout, with a mask hashed from `keep_seed` when
            `keep` is None (`kernels.dropout`: the Triton kernels regenerate it, the others materialise it).
        keep (`torch.BoolTensor` of shape `(B, H, Nq, K)`, *optional*): dropout keep-mask drawn by the caller;
            `dropout_p` must be the probability it was drawn with.
        global_rows (`int`, *optional*, defaults to 0): replace the rows of the first `global_rows` queries that are
            real tokens by dense softmax attention over every real key, as [`edge_attention`] does (the Triton
            kernels compute up to 16 of them, with the dot product, in programs of their own). Encoder
            self-attention only (query `i` is key `i`).
        key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): the real keys, for `global_rows` (`None`:
            every key is real).
        global_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the global rows' dropout mask
            in training (drawn from the default generator when `None`), so that backends can be compared.
        keep_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the slots' dropout mask in
            training (`kernels.hashing.grid_keep`; drawn from the default generator when `None`).
        backend (`str`, *optional*, defaults to `"fast"`): `"fast"`, `"reference"` or `"triton"` (module docstring).

    Returns:
        `torch.Tensor` of shape `(B, H, Nq, d)` in the dtype of the inputs.
    """
    check_gathered(q, k, v, idx, valid, weight, logit_bias)
    check_global_rows(q, k, global_rows, key_valid)
    implementation = resolve_backend(backend, q.device, q.dtype, k.dtype, v.dtype)
    keep, keep_seed, seed = call_dropout(
        keep, keep_seed, global_seed, global_rows=global_rows, dropout_p=dropout_p, training=training,
        fused=implementation == "triton", materialise=lambda seed: grid_keep(seed, tuple(idx.shape[:4]), dropout_p),
        device=q.device,
    )  # fmt: skip
    kwargs = {"scale": scale, "keep": keep, "dropout_p": dropout_p, "weight": weight, "logit_bias": logit_bias}
    kwargs["dot_product"] = dot_product
    if implementation == "triton":
        return _triton_kernels().gathered_attention_triton(
            q, k, v, idx, valid, global_rows=global_rows, key_valid=key_valid, global_seed=seed, keep_seed=keep_seed,
            **kwargs,
        )  # fmt: skip
    if implementation == "reference":
        out = gathered_attention_reference_with_mask(q, k, v, idx, valid, **kwargs)
    else:
        out = gathered_attention_with_mask(q, k, v, idx, valid, **kwargs)
    if global_rows:
        out = replace_global_rows(out, q, k, v, key_valid, global_rows, **row_settings(scale, dropout_p, seed))
    return out


def gathered_attention_reference(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, valid: Tensor | None = None, **kwargs):
    """[`gathered_attention`] with `backend="reference"` (`torch.gather` + einsum, plain autograd)."""
    return gathered_attention(q, k, v, idx, valid, backend="reference", **kwargs)


def interpolated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    point_logits: Tensor | None = None,
    key_valid: Tensor | None = None,
    causal: bool = False,
    query_offset: int = 0,
    position_bound: str = "clamp",
    num_global: int = 0,
    global_rows: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    keep: Tensor | None = None,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
    backend: str = "fast",
) -> tuple[Tensor, Tensor]:
    """Attention of every query over K points at fractional key positions `query + offset`, plus `g` global keys.

    The semantics are those of [`attnzoo.kernels.interpolated`] (bounded positions, two real neighbours per point
    across holes of the mask, softmax over the K + g slots). The reference and CPU implementations materialise the
    selection and run gathered attention; the Triton one computes positions, neighbours and weights inside the
    kernel from the offsets and returns the offsets' gradient from its backward.

    Args:
        q (`torch.Tensor` of shape `(B, H, Nq, d)`): queries.
        k, v (`torch.Tensor` of shape `(B, H, Nk, d)`): keys and values.
        offsets (`torch.Tensor` of shape `(B, H, Nq, K)`): offsets in tokens of the K points (differentiable; fp32
            for the Triton kernels, since fp16 / bf16 cannot hold fractional positions beyond 256).
        point_logits (`torch.Tensor` of shape `(B, H, Nq, K)`, *optional*): learned slot logits replacing
            `scale * <q, k~>` (A²-Former's linear weights; a global slot's logit is 0).
        key_valid (`torch.BoolTensor` of shape `(B, Nk)`, *optional*): real keys (padding and holes).
        causal (`bool`, *optional*, defaults to `False`): points never pass the query itself.
        query_offset (`int`, *optional*, defaults to 0): absolute index of the first query (cached keys before it).
        position_bound (`str`, *optional*, defaults to `"clamp"`): `"clamp"` or `"reflect"` at the span's ends.
        num_global (`int`, *optional*, defaults to 0): the first `g` keys are extra slots of every query.
        global_rows (`bool`, *optional*, defaults to `False`): also replace the rows of the real global queries (the
            first `g`: not causal, `query_offset` 0) by dense attention over every real key, as
            `ZooAttention.with_global_rows` does; the Triton implementation computes them in its kernels (their
            dropout mask in training is the counter hash of `global_seed`, regenerated there).
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout on the slot probabilities (and the global rows).
        training (`bool`, *optional*, defaults to `False`): apply dropout, with a mask hashed from `keep_seed` when
            `keep` is None (`kernels.dropout`); dropout on the global rows.
        keep (`torch.BoolTensor` of shape `(B, H, Nq, K + g)`, *optional*): dropout keep-mask drawn by the caller.
        global_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the global rows' dropout mask
            in training (drawn from the default generator when `None`), so that backends can be compared.
        keep_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the slots' dropout mask in
            training (`kernels.hashing.grid_keep` over the K + g slots; drawn when `None`).
        backend (`str`, *optional*, defaults to `"fast"`): `"fast"`, `"reference"` or `"triton"` (module docstring).

    Returns:
        The output `(B, H, Nq, d)` in the dtype of the inputs, and the density `(B, H)` (float): distinct keys with
        weight per query over the sample's real keys, averaged over its real queries that have a key.
    """
    check_interpolated(
        q, k, v, offsets, point_logits, key_valid, num_global, position_bound, query_offset, keep, causal, global_rows
    )
    implementation = resolve_backend(backend, q.device, q.dtype, k.dtype, v.dtype)
    shape = (*offsets.shape[:3], offsets.shape[3] + num_global)
    keep, keep_seed, seed = call_dropout(
        keep, keep_seed, global_seed, global_rows=global_rows, dropout_p=dropout_p, training=training,
        fused=implementation == "triton", materialise=lambda seed: grid_keep(seed, shape, dropout_p), device=q.device,
    )  # fmt: skip
    kwargs = {
        "point_logits": point_logits,
        "key_valid": key_valid,
        "causal": causal,
        "query_offset": query_offset,
        "position_bound": position_bound,
        "num_global": num_global,
        "global_rows": global_rows,
        "scale": scale,
        "keep": keep,
        "dropout_p": dropout_p,
        "global_seed": seed,
    }
    if implementation == "triton":
        return _triton_kernels().interpolated_attention_triton(q, k, v, offsets, keep_seed=keep_seed, **kwargs)
    return interpolated_attention_torch(q, k, v, offsets, reference=implementation == "reference", **kwargs)


def edge_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    cols: Tensor,
    *,
    logit_bias: Tensor | None = None,
    edge_weight: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    keep: Tensor | None = None,
    sorted_rows: bool = False,
    padded: bool = False,
    crow: Tensor | None = None,
    generator: torch.Generator | None = None,
    global_rows: int = 0,
    key_valid: Tensor | None = None,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
    backend: str = "fast",
) -> Tensor:
    """Attention restricted to an edge list, softmax over the edges of each query row.

    For edge `e = (rows[e], cols[e])`: `s_e = scale * <q[rows[e]], k[cols[e]]> + logit_bias[e]`, `a_e` = softmax of
    `s` over the edges sharing `rows[e]`, and `out[r] = sum_e dropout(a_e) * edge_weight[e] * v[cols[e]]`.
    Duplicate edges count separately; rows without edges (or whose logits are all -inf) output exact zeros.
    q, k and v share one dtype (`ValueError` otherwise, as in SDPA); half-precision inputs are accumulated in fp32 and
    the result has their dtype.

    Args:
        q (`torch.Tensor` of shape `(R, d)` or `(B, H, n, d)`): flattened query rows, or head-split queries whose
            flat row `(b H + h) n + i` the edges name (the Triton kernel reads these in place, in any dense layout:
            no copy of a head-split view of the projections).
        k (`torch.Tensor` of shape `(C, d)` or `(B, H, m, d)`): key rows, flat or head-split as q.
        v (`torch.Tensor` of shape `(C, d)` or `(B, H, m, d)`): value rows, as k.
        rows (`torch.LongTensor` of shape `(E,)`): query row of each edge, in `[0, R)` (int64, or int32).
        cols (`torch.LongTensor` of shape `(E,)`): key row of each edge, in `[0, C)` (int64, or int32).
        logit_bias (`torch.Tensor` of shape `(E,)`, *optional*): added to the scaled logit (differentiable).
        edge_weight (`torch.Tensor` of shape `(E,)`, *optional*): multiplies the normalised probability after the
            softmax, without renormalisation (differentiable).
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout on the probabilities (before `edge_weight`).
        training (`bool`, *optional*, defaults to `False`): apply dropout, with a mask hashed from `keep_seed` when
            `keep` is None (`kernels.dropout`).
        keep (`torch.BoolTensor` of shape `(E,)`, *optional*): dropout keep-mask drawn by the caller.
        sorted_rows (`bool`, *optional*, defaults to `False`): promise that `rows` is non-decreasing (skips a sort).
        padded (`bool`, *optional*, defaults to `False`): edges whose row is `R` (one past the last) are padding and
            ignored, so that a caller can keep an edge list of a size fixed in advance. The Triton kernel never reads
            them (its row pointers end before them: no host sync); the other implementations drop them first.
        crow (`torch.LongTensor` of shape `(R + 1,)`, *optional*): the row pointers of the sorted `rows` (`crow[r]`:
            the edges of the rows below `r`), when the caller has them: the Triton kernel reads them instead of
            searching `rows` for them. Requires `sorted_rows`.
        generator (`torch.Generator`, *optional*): RNG for the dropout masks' seeds.
        global_rows (`int`, *optional*, defaults to 0): replace the rows of the first `global_rows` queries of every
            (batch, head) that are real tokens by dense softmax attention over every real key
            (`ZooAttention.with_global_rows`, as part of the primitive: the Triton kernels compute up to 16 of them
            in their own programs, with no op around them). Head-split encoder self-attention only (query `i` is key
            `i`). The rows' gradient reaches only them: a replaced row's edges get none. In training their dropout
            mask is the counter hash of `global_seed` (`kernels.global_rows`), which the kernels regenerate.
        key_valid (`torch.BoolTensor` of shape `(B, m)`, *optional*): the real keys, for `global_rows` (`None`:
            every key is real).
        global_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the global rows' dropout mask
            in training (drawn from `generator` or the default one when `None`), so that backends can be compared.
        keep_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the edges' dropout mask in
            training, a decision per position in the list (`kernels.hashing.position_keep`; drawn from `generator`
            or the default one when `None`): the Triton kernels regenerate it (with `sorted_rows`) instead of
            storing a mask per edge.
        backend (`str`, *optional*, defaults to `"fast"`): `"fast"`, `"reference"` or `"triton"` (module docstring).

    Returns:
        `torch.Tensor` of q's shape, in the dtype of the inputs.
    """
    check_edges(q, k, v, rows, cols, logit_bias, edge_weight, keep, padded=padded)
    check_global_rows(q, k, global_rows, key_valid)
    num_rows = q.shape[:-1].numel()
    if crow is not None and (not sorted_rows or crow.shape != (num_rows + 1,)):
        raise ValueError(f"crow must come with sorted_rows=True and have shape ({num_rows + 1},), got "
                         f"sorted_rows={sorted_rows} and {tuple(crow.shape)}")  # fmt: skip
    implementation = resolve_backend(backend, q.device, q.dtype, k.dtype, v.dtype)
    # The kernels hash each edge's position in the list they read: the caller's, when it is sorted; otherwise the
    # mask of the caller's order (padding included) is made first and sorted with the edges.
    keep, hashed, seed = call_dropout(
        keep, keep_seed, global_seed, global_rows=global_rows, dropout_p=dropout_p, training=training,
        fused=implementation == "triton" and sorted_rows,
        materialise=lambda seed: position_keep(seed, rows.shape[0], dropout_p), device=q.device, generator=generator,
    )  # fmt: skip
    if implementation == "triton":
        return _triton_kernels().edge_attention_triton(
            q, k, v, rows, cols, logit_bias=logit_bias, edge_weight=edge_weight, scale=scale, keep=keep,
            dropout_p=dropout_p, sorted_rows=sorted_rows, crow=crow, global_rows=global_rows, key_valid=key_valid,
            global_seed=seed, keep_seed=hashed,
        )  # fmt: skip
    heads = q, k, v
    # The torch implementations take flat rows and index with int64 (no-ops for flat rows and int64 indices).
    flat_q, flat_k, flat_v = (t.reshape(-1, t.shape[-1]) for t in heads)
    rows, cols = rows.long(), cols.long()
    if padded:
        # Boolean compaction (a host sync on an accelerator, which only the Triton path needs to avoid).
        real = rows < num_rows
        rows, cols = rows[real], cols[real]
        logit_bias, edge_weight, keep = (None if t is None else t[real] for t in (logit_bias, edge_weight, keep))
    kwargs = {"logit_bias": logit_bias, "edge_weight": edge_weight, "scale": scale, "keep": keep}
    kwargs["dropout_p"] = dropout_p
    if implementation == "reference":
        out = edge_attention_reference_with_mask(flat_q, flat_k, flat_v, rows, cols, **kwargs)
    else:
        out = edge_attention_with_mask(flat_q, flat_k, flat_v, rows, cols, sorted_rows=sorted_rows, **kwargs)
    out = out.view(q.shape)
    if global_rows:
        out = replace_global_rows(out, *heads, key_valid, global_rows, **row_settings(scale, dropout_p, seed))
    return out


def edge_attention_reference(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, cols: Tensor, **kwargs) -> Tensor:
    """[`edge_attention`] with `backend="reference"` (gather / scatter, plain autograd)."""
    return edge_attention(q, k, v, rows, cols, backend="reference", **kwargs)


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    logit_bias: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    backend: str = "fast",
) -> Tensor:
    """Softmax attention over every key, with an optional boolean mask and additive logit bias.

    Query rows whose mask has no `True` entry output exact zeros (never NaN). The reference is
    [`dense_masked_attention`] (materialised, fp32 softmax); the fast and Triton implementations are
    `F.scaled_dot_product_attention`.

    Args:
        q (`torch.Tensor` of shape `(B, H, Nq, d)`): queries.
        k, v (`torch.Tensor` of shape `(B, H, Nk, d)`): keys and values.
        mask (`torch.BoolTensor` broadcastable to `(B, H, Nq, Nk)`, *optional*): `True` means "may attend".
        logit_bias (`torch.Tensor` broadcastable to `(B, H, Nq, Nk)`, *optional*): added to the scaled logits.
        is_causal (`bool`, *optional*, defaults to `False`): aligned causal attention (only without `mask`; a
            causal mask with padding or a query offset belongs in `mask`).
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout on the attention probabilities.
        training (`bool`, *optional*, defaults to `False`): dropout only when `True`.
        backend (`str`, *optional*, defaults to `"fast"`): `"fast"`, `"reference"` or `"triton"`.

    Returns:
        `torch.Tensor` of shape `(B, H, Nq, d)`.
    """
    if is_causal and mask is not None:
        raise ValueError("dense_attention: pass the causal structure inside `mask` when a mask is given.")
    causal = is_causal and q.shape[2] > 1
    reference = resolve_backend(backend, q.device, q.dtype, k.dtype, v.dtype) == "reference"
    if causal and (reference or logit_bias is not None):
        # The reference has no causal flag, and SDPA takes none beside an explicit mask (with a bias that needs a
        # gradient it refuses the pair): causality goes into the mask.
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        causal = False
    if reference:
        out, _ = dense_masked_attention(
            q, k, v, mask, dropout_p=dropout_p, scale=scale, training=training, logit_bias=logit_bias
        )
        return out
    attn_mask = mask
    if logit_bias is not None:
        attn_mask = logit_bias.to(q.dtype)
        if mask is not None:
            # The dtype's minimum, not -inf: a fully masked row stays finite (then zeroed below), also in backward.
            attn_mask = attn_mask.masked_fill(~mask, torch.finfo(attn_mask.dtype).min)
    dropout_p = dropout_p if training else 0.0
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal, scale=scale
    )
    if mask is not None:
        # SDPA's treatment of rows without any valid key varies across backends: make them exact zeros.
        out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return out


def key_slot_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    query: Tensor,
    mean: Tensor,
    *,
    num_graph_slots: int,
    variance: float,
    normalized: bool = False,
    truncate: bool = False,
    num_global: int = 0,
    global_softmax: str = "own",
    key_valid: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    slot_keep: Tensor | None = None,
    global_keep: Tensor | None = None,
    global_rows: bool = False,
    global_seed: Tensor | None = None,
    keep_seed: Tensor | None = None,
    backend: str = "fast",
) -> tuple[Tensor, Tensor]:
    """Attention along edges that each key names in fixed slots, with Gaussian confidences (FSAT).

    Slot `s` of key `j` is the edge `(query[b, h, j, s] -> j)` (none when -1) with the confidence
    `rho = exp(-(i - mean)^2 / (2 variance))` (over `sqrt(2 pi variance)` when `normalized`; its gradient reaches
    `mean` only, clipped to `(-inf, 0]` with `truncate`). Slots `s < num_graph_slots` are the graph's, the others
    exploration; the first `num_global` keys are global: every real query reads the real ones with confidence 1,
    and their own slots are ignored. Each query has one
    softmax per group (graph, exploration, and the global keys with `global_softmax="own"`, else they join the
    graph's) and outputs the sum over its groups of `dropout(softmax)_e * rho_e * v_j`. Duplicate edges count
    separately; a query without an edge outputs zeros. No implementation syncs the host with the device but the
    CPU paths (the reference and the CSR kernels compact the live slots). Semantics: [`attnzoo.kernels.key_slots`].

    Args:
        q, k, v (`torch.Tensor` of shape `(B, H, N, d)`): queries, keys and values of one dtype.
        query (`torch.IntTensor` of shape `(B, H, N, S)`): query position of every slot of every key, -1 when the
            slot is dropped.
        mean (`torch.Tensor` of shape `(B, H, N, S)`): the prediction each slot's confidence is centred on
            (differentiable, fp32).
        num_graph_slots (`int`): the first slots of each key that belong to the graph's softmax.
        variance (`float`): the confidences' variance.
        normalized (`bool`, *optional*, defaults to `False`): divide the confidences by `sqrt(2 pi variance)`.
        truncate (`bool`, *optional*, defaults to `False`): keep only the non-positive part of their gradient.
        num_global (`int`, *optional*, defaults to 0): the first `g` keys are read by every real query (their slots
            are ignored).
        global_softmax (`str`, *optional*, defaults to `"own"`): `"own"` or `"shared"` (with the graph).
        key_valid (`torch.BoolTensor` of shape `(B, N)`, *optional*): real tokens (for the global edges; the slots
            must already leave out padding).
        scale (`float`, *optional*): logit scale, defaults to `d ** -0.5`.
        dropout_p (`float`, *optional*, defaults to 0.0): dropout on the probabilities (before the confidences).
        training (`bool`, *optional*, defaults to `False`): apply dropout, with masks hashed from `keep_seed` where
            they are not given (`kernels.dropout`).
        slot_keep (`torch.BoolTensor` of shape `(B, H, N, S)`, *optional*): dropout keep-mask of the slots.
        global_keep (`torch.BoolTensor` of shape `(B, H, N, num_global)`, *optional*): keep-mask of the global
            edges, per query.
        global_rows (`bool`, *optional*, defaults to `False`): also replace the rows of the real global queries (the
            first `num_global`; a padded global position keeps its row) by dense softmax attention over every real
            key, scale `scale`, as `ZooAttention.with_global_rows` does (in training their dropout mask is the
            counter hash of `global_seed`); the method's output at a replaced row then gets no gradient. The Triton
            implementation computes them in its kernels (outside them beyond 16 global tokens).
        global_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the global rows' dropout mask
            in training (drawn from the default generator when `None`), so that backends can be compared.
        keep_seed (`torch.LongTensor` of shape `()`, *optional*): the hash seed of the slots' and global edges'
            dropout masks in training: `kernels.hashing.grid_keep` over `(B, H, N, S + g)`, slot `s` of key `j` at
            `(j, s)` and the global key `t` of query `i` at `(i, S + t)` (drawn when `None`).
        backend (`str`, *optional*, defaults to `"fast"`): `"fast"`, `"reference"` or `"triton"` (module docstring).

    Returns:
        The output `(B, H, N, d)` in the dtype of q, and the number of distinct `(query, key)` pairs joined by an
        edge `(B, H)` (float).
    """
    check_key_slots(
        q, k, v, query, mean, key_valid, num_graph_slots, num_global, global_softmax, slot_keep, global_keep,
        global_rows,
    )  # fmt: skip
    implementation = resolve_backend(backend, q.device, q.dtype, k.dtype, v.dtype)
    slots = query.shape[-1]
    shape = (*query.shape[:3], slots + num_global)
    given = slot_keep is not None or global_keep is not None
    if given and keep_seed is not None:
        raise ValueError("a dropout mask comes as keep or as keep_seed, not both")
    # Both masks hashed from one seed (the Triton kernels regenerate them), unless the caller gave one of them.
    full, keep_seed, seed = call_dropout(
        None, keep_seed, global_seed, global_rows=global_rows, dropout_p=dropout_p, training=training,
        fused=implementation == "triton" and not given, materialise=lambda seed: grid_keep(seed, shape, dropout_p),
        device=q.device,
    )  # fmt: skip
    if full is not None:
        slot_keep = full[..., :slots] if slot_keep is None else slot_keep
        if num_global and global_keep is None:
            global_keep = full[..., slots:]
    kwargs = {
        "num_graph_slots": num_graph_slots,
        "num_global": num_global,
        "global_softmax": global_softmax,
        "key_valid": key_valid,
        "variance": variance,
        "normalized": normalized,
        "truncate": truncate,
        "scale": scale,
        "slot_keep": slot_keep,
        "global_keep": global_keep,
        "dropout_p": dropout_p,
        "global_rows": global_rows,
        "global_seed": seed,
    }
    if implementation == "triton":
        return _triton_kernels().key_slot_attention_triton(q, k, v, query, mean, keep_seed=keep_seed, **kwargs)
    return key_slot_attention_torch(q, k, v, query, mean, reference=implementation == "reference", **kwargs)

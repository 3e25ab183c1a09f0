"""Smart Bird's sketch: a single-head, low-dimensional Transformer owned by the encoder, and its own task loss.

The sketch runs once per encoder forward, before the main layers. Each main layer `l` receives the (detached)
queries and keys of sketch layer `min(l, L_s - 1)`, from which its attention samples keys. The sketch learns only
from its own task loss (the paper's attention-pooling classifier, or an equally cheap LM loss for MLM and seq2seq),
returned through the encoder output's `aux_loss`; sampling is not differentiable, so no main-loss gradient reaches it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import ForSequenceClassificationLoss

from ..core.attention import ZooAttention
from ..core.positions import apply_rotary, build_position_embeddings
from ..core.stacks import Encoder
from .configuration_smart_bird import SmartBirdConfig

#: sketch tasks, one per head: the labels each head receives define the sketch's loss
SKETCH_TASKS = ("classification", "masked_lm", "seq2seq")
#: SDPA's FlashAttention and memory-efficient kernels on CUDA take head sizes that are multiples of 8 (bf16, fp16);
#: any other size falls back to the math kernel, which builds the whole (N, N) score matrix.
SDPA_HEAD_ALIGNMENT = 8


def _zeros(rows: int, like: torch.Tensor) -> torch.Tensor:
    """`(rows, *like.shape[1:])` zeros of `like`'s dtype and device, as a broadcast view of one cached element: the
    padding of a weight costs no kernel once the first call on that device made the element."""
    # A compiled graph folds the constant (and dynamo would trace past the cache anyway).
    compiling = torch.compiler.is_compiling()
    zero = like.new_zeros(()) if compiling else _zero_element(like.dtype, like.device)
    return zero.expand(rows, *like.shape[1:])


@functools.cache
def _zero_element(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=dtype, device=device)


def aligned_projection(x: torch.Tensor, layers: tuple[nn.Linear, ...], pad: int) -> torch.Tensor:
    """The outputs of `layers` (each `d -> d`) in one matrix product, each zero-padded by `pad` features.

    The padded weight and bias are one `cat` each (the zeros are a broadcast view, see [`_zeros`]), so the layers
    keep their parameters (names, shapes, checkpoints) and the head size SDPA needs comes out of the product itself
    instead of three pads of q, k and v and their backward.

    Args:
        x (`torch.Tensor` of shape `(B, N, d_in)`): the inputs.
        layers (`tuple[nn.Linear, ...]`): `P` linear layers `d_in -> d` with biases.
        pad (`int`): zero features after each output.

    Returns:
        `torch.Tensor` of shape `(B, N, P, d + pad)`: its `[..., p, :d]` is `layers[p](x)`, its `[..., p, d:]` zeros.
    """
    weights, biases = [], []
    for layer in layers:
        weights += [layer.weight, _zeros(pad, layer.weight)]
        biases += [layer.bias, _zeros(pad, layer.bias)]
    d = layers[0].out_features
    out = F.linear(x, torch.cat(weights), torch.cat(biases))  # (B, N, P (d + pad))
    return out.view(*x.shape[:-1], len(layers), d + pad)


def aligned_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.scaled_dot_product_attention` with the head size zero-padded to a multiple of [`SDPA_HEAD_ALIGNMENT`].

    Exact: zero coordinates add nothing to `<q, k>`, the scale stays `d ** -0.5` of the real size `d`, and the
    padded value coordinates are outputs of zero that are cut off again (their gradient is cut off with them).

    Args:
        q, k, v (`torch.Tensor` of shape `(B, heads, N, d)`): queries, keys and values.
        attn_mask (`torch.BoolTensor` broadcastable to `(B, heads, N, N)`, *optional*): `True` means "may attend".

    Returns:
        `torch.Tensor` of shape `(B, heads, N, d)`.
    """
    d = q.shape[-1]
    pad = -d % SDPA_HEAD_ALIGNMENT
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=d**-0.5)
    return out[..., :d] if pad else out


class SketchLayer(nn.Module):
    """Post-norm Transformer layer of width `sketch_hidden_size` with a single attention head.

    Its own attention runs through SDPA (O(N) memory: its head size padded to a multiple of 8, by the projection
    itself, [`aligned_projection`], or with rotary positions after the rotation, [`aligned_attention`]); the layer
    also returns its queries and keys, from which the main layer's sampler recomputes the sketch weights without
    gradient (strided views of the projection's output: the sampler reads them as they are).
    """

    def __init__(self, config: SmartBirdConfig):
        super().__init__()
        d = config.sketch_hidden_size
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.output = nn.Linear(d, d)
        self.attention_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(d, config.sketch_intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.ffn_output = nn.Linear(config.sketch_intermediate_size, d)
        self.ffn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.rotary = config.position_embedding_type == "rotary"

    def forward(
        self, x: torch.Tensor, key_valid: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, d = x.shape
        mask = None if key_valid is None else key_valid[:, None, None, :]  # (B, 1, 1, N)
        pad = -d % SDPA_HEAD_ALIGNMENT
        if self.rotary:
            # The returned q and k are the rotated ones: the sampler's sketch weights must be the sketch's own. The
            # rotation pairs the real features, so the padding comes after it.
            q, k, v = self.query(x), self.key(x), self.value(x)  # (B, N, d)
            q, k = apply_rotary(q[:, None]).squeeze(1), apply_rotary(k[:, None]).squeeze(1)
            attn = aligned_attention(q[:, None], k[:, None], v[:, None], mask)  # (B, 1, N, d)
        else:
            qkv = aligned_projection(x, (self.query, self.key, self.value), pad)  # (B, N, 3, d + pad)
            # One unbind (its backward is one stack, where three selections would each zero-fill a full gradient)
            q, k, v = qkv[:, None].unbind(3)  # (B, 1, N, d + pad) views, zeros past d
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=d**-0.5)[..., :d]
            q, k = q[:, 0, :, :d], k[:, 0, :, :d]  # (B, N, d)
        if key_valid is not None:
            # A sample without any real token has no valid key: make its rows zeros rather than backend-dependent.
            attn = attn.masked_fill(~key_valid.any(-1)[:, None, None, None], 0.0)
        # (B N, d): a strided view, which the output projection reads in one matrix product (no copy)
        x = self.attention_norm(x + self.output(attn.reshape(B * N, d)).view(B, N, d))
        x = self.ffn_norm(x + self.ffn_output(self.act(self.intermediate(x))))
        return x, q, k


class SketchNetwork(nn.Module):
    """The tiny Transformer: input projection of the (detached) main token embeddings, positions, layers, heads.

    The sketch's token embeddings are `input_proj(main_embedding)`: the paper initialised the sketch embeddings as
    the PCA of the main (GloVe) embeddings, which is exactly this projection with the principal axes as weights
    (see [`init_sketch_from_main_embeddings`]). It also keeps `inputs_embeds`, `resize_token_embeddings` and
    vocabulary changes consistent without a second vocabulary-sized table.
    """

    def __init__(self, config: SmartBirdConfig):
        super().__init__()
        d = config.sketch_hidden_size
        self.input_proj = nn.Linear(config.hidden_size, d)
        # Learned or fixed, as the main encoder's (`position_embedding_type`).
        self.position_embeddings = build_position_embeddings(config, d)
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(SketchLayer(config) for _ in range(config.sketch_layers))
        # Attention pooling (the paper's sketch head) and the classifier of the classification task.
        self.pool_proj = nn.Linear(d, d)
        self.pool_score = nn.Linear(d, 1)
        self.classifier = nn.Linear(d, config.num_labels)

    def set_task(self, task: str | None, frozen: bool = False) -> None:
        """Make trainable exactly the parameters the sketch loss of `task` reaches (none for `None` or `frozen`).

        Parameters a task never uses (e.g. the classifier under the masked-LM loss) stay frozen, so every trainable
        parameter receives a gradient (DDP without `find_unused_parameters`).
        """
        self.requires_grad_(task is not None and not frozen)
        if task is None or frozen:
            return
        unused = {
            "classification": (),
            "masked_lm": ("pool_proj", "pool_score", "classifier"),
            "seq2seq": ("classifier",),
        }
        for name in unused[task]:
            getattr(self, name).requires_grad_(False)

    def forward(
        self, token_embeds: torch.Tensor, key_valid: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Returns the last hidden states `(B, N, d)` and every layer's `(queries, keys)`, each `(B, N, d)`."""
        if position_ids is None:
            position_ids = torch.arange(token_embeds.shape[1], device=token_embeds.device)[None]
        x = self.input_proj(token_embeds)  # (B, N, d)
        if self.position_embeddings is not None:  # rotary positions: the sketch layers rotate q and k instead
            x = x + self.position_embeddings(position_ids).to(x.dtype)
        x = self.LayerNorm(x)
        qk = []
        for layer in self.layers:
            x, q, k = layer(x, key_valid)
            qk.append((q, k))
        return x, qk

    def pool(self, hidden: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        """Additive attention pooling over real tokens: `(B, N, d) -> (B, d)`."""
        scores = self.pool_score(torch.tanh(self.pool_proj(hidden))).squeeze(-1).float()  # (B, N)
        if key_valid is not None:
            scores = scores.masked_fill(~key_valid, torch.finfo(torch.float32).min)
        return torch.einsum("bn,bnd->bd", scores.softmax(-1).to(hidden.dtype), hidden)

    def loss(
        self,
        task: str,
        labels: torch.Tensor,
        hidden: torch.Tensor,
        key_valid: torch.Tensor | None,
        word_embeddings: torch.Tensor,
        config: SmartBirdConfig,
    ) -> torch.Tensor:
        """The sketch's own task loss for the labels of the head that runs it."""
        if task == "classification":
            return ForSequenceClassificationLoss(labels, self.classifier(self.pool(hidden, key_valid)), config)
        # LM tasks share the input projection as output embeddings (rank-d logits, no vocabulary-sized parameter).
        sketch_vocab = self.input_proj(word_embeddings.detach())  # (V, d)
        if task == "masked_lm":
            target = labels != -100
            logits = hidden[target].float() @ sketch_vocab.float().t()  # (T, V): only at labelled positions
            return F.cross_entropy(logits, labels[target]) if logits.shape[0] else hidden.sum() * 0.0
        # seq2seq: a bag-of-target-words loss of the pooled source sketch (which source tokens matter).
        log_probs = (self.pool(hidden, key_valid).float() @ sketch_vocab.float().t()).log_softmax(-1)  # (B, V)
        target = labels != -100
        picked = log_probs.gather(1, labels.clamp(min=0))  # (B, T)
        return -(picked * target).sum() / target.sum().clamp(min=1)


class SmartBirdEncoder(Encoder):
    """The zoo's encoder plus the sketch network, which it runs first and hands to every layer's attention.

    Heads pass their labels through [`sketch_targets`]; the encoder then adds `sketch_loss_weight *` the sketch
    loss to its output's `aux_loss` (unless the sketch is frozen). A bare encoder (no head) keeps the sketch frozen.
    """

    def __init__(self, config: SmartBirdConfig, attention_class: type[ZooAttention]):
        super().__init__(config, attention_class)
        self.sketch = SketchNetwork(config)
        # The bare encoder has no labels to train the sketch with; a head claims it (`SketchTaskMixin`).
        self.sketch.set_task(None)
        self._targets: tuple[str, torch.Tensor] | None = None

    @contextlib.contextmanager
    def sketch_targets(self, task: str, labels: torch.Tensor | None) -> Iterator[None]:
        """Within the block, forwards compute the sketch loss of `task` for `labels` (nothing if `None`)."""
        if task not in SKETCH_TASKS:
            raise ValueError(f"sketch task must be one of {SKETCH_TASKS}, got {task!r}.")
        self._targets = None if labels is None else (task, labels)
        try:
            yield
        finally:
            self._targets = None

    def prepare_layers(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        key_valid: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Run the sketch, hand each layer's attention its sketch queries/keys, and return the sketch loss."""
        word_embeddings = self.embeddings.word_embeddings
        tokens = inputs_embeds if inputs_embeds is not None else word_embeddings(input_ids)
        hidden, qk = self.sketch(tokens.detach(), key_valid, position_ids)
        for i, layer in enumerate(self.layers):
            q_s, k_s = qk[min(i, len(qk) - 1)]
            # Kept until the next forward (not cleared): gradient checkpointing re-runs the layer in backward.
            layer.attention.sketch = (q_s.detach(), k_s.detach())
        if self._targets is None or self.config.sketch_freeze:
            return None
        task, labels = self._targets
        loss = self.sketch.loss(task, labels, hidden, key_valid, word_embeddings.weight, self.config)
        return self.config.sketch_loss_weight * loss


class SketchTaskMixin:
    """Head mixin: the head's labels are the sketch's targets (through the core heads' `encoder_label_scope`), so
    every head keeps the core's explicit `forward` signature."""

    #: the sketch loss this head trains with (one of `SKETCH_TASKS`)
    sketch_task: ClassVar[str] = "classification"

    def __init__(self, config: SmartBirdConfig):
        super().__init__(config)
        self.model.encoder.sketch.set_task(self.sketch_task, frozen=config.sketch_freeze)

    def encoder_label_scope(self, labels: torch.Tensor | None) -> contextlib.AbstractContextManager:
        """The head's labels become the sketch's training targets while the encoder runs."""
        return self.model.encoder.sketch_targets(self.sketch_task, labels)


@torch.no_grad()
def init_sketch_from_main_embeddings(encoder: SmartBirdEncoder) -> None:
    """Set the sketch's token embeddings to the PCA of the main token embeddings (as the paper did with GloVe).

    After the call, `sketch.input_proj(e)` gives the coordinates of `e` on the `sketch_hidden_size` leading
    principal axes of the (centred) main embedding matrix. Call it after loading/initialising main embeddings.
    """
    weight = encoder.embeddings.word_embeddings.weight.float()  # (V, D)
    mean = weight.mean(0)
    d = encoder.sketch.input_proj.out_features
    _, _, v = torch.linalg.svd(weight - mean, full_matrices=False)  # rows of v: principal axes
    axes = v[:d]  # (d, D)
    proj = encoder.sketch.input_proj
    proj.weight.copy_(axes.to(proj.weight.dtype))
    proj.bias.copy_((-(axes @ mean)).to(proj.bias.dtype))

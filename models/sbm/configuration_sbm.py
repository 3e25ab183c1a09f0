"""Configuration of the SBM-Transformer family (Cho et al., NeurIPS 2022)."""

# No `from __future__ import annotations`: huggingface_hub's @strict checks field types only when the annotations
# are real types, not strings.

from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict

from ..core.configuration import SparseZooConfig

SAMPLING_BACKENDS = ("bernoulli", "fastrg", "auto")
STE_VARIANTS = ("official", "paper")
STE_UNSAMPLED = ("opening", "derivative")


@strict
class SBMConfig(SparseZooConfig):
    r"""
    Configuration of SBM-Transformer: every attention head samples its own bipartite graph from a stochastic block
    model whose memberships are predicted from the queries and keys, and attends only over the sampled edges. The
    fields below come on top of [`~attnzoo.core.SparseZooConfig`], whose Args list documents the shared fields.

    SBM attention is used in the encoder, in decoder causal self-attention and in cross-attention (SBM samples
    bipartite graphs natively); `sbm_in_decoder` and `sbm_in_cross_attention` fall back to dense attention per site.

    Args:
        num_clusters (`int`, *optional*, defaults to 128):
            Number of clusters `k` of the block model (cluster embeddings per head of shape `(k, head_dim)`).
        exploration_delta (`float`, *optional*, defaults to 0.01):
            Exploration probability `δ` added to every edge probability, so that every valid pair can be sampled and
            receive a gradient.
        exploration_at_eval (`bool`, *optional*, defaults to `True`):
            Keep `δ` in eval mode (the official code does; the paper describes it for training only).
        sparsity_weight (`float`, *optional*, defaults to 0.0):
            `λ` of the mask-density regulariser: each SBM layer returns `λ * mean_head_density / num_layers` as its
            auxiliary loss, so the encoder's total is `λ` times the density averaged over heads and layers.
        ste_variant (`str`, *optional*, defaults to `"official"`):
            Straight-through estimator of the mask gradient. `"official"` (the authors' code): a sampled edge's
            probability receives the gradient of that edge's attention logit. `"paper"` (Eq. 9): the mask
            multiplies the logits, so it receives the logit gradient times the logit.
        ste_clip (`float`, *optional*, defaults to 1.0):
            Clip (hardtanh) applied to the gradient of each edge probability that receives one.
        ste_all_pairs (`bool`, *optional*):
            Also give the pairs that were *not* sampled a straight-through gradient: what adding key `j` to row `i`
            would gain if the mask gated the softmax weights (`ste_unsampled_gradient` says how it is measured;
            times the logit for the `"paper"` variant), so the loss sees the cost of a missing edge. The official
            code computes a gradient for every pair and keeps the sampled ones only (`grad ⊙ M`), as does the paper;
            without the unsampled pairs the density collapsed to `δ` in 3 of 5 seeds of the repeated-token task
            at N = 64, with them in none (the sbm-synthetic study). `None` (default): on wherever a layer samples its
            graph densely (the Bernoulli backend, also when `"auto"` picks it), since it scores every pair (the
            attention then runs as [`~attnzoo.kernels.gated_attention`], whose backward gives every pair's gate
            gradient); fastRG graphs use the paper's estimator. `False`: the paper's estimator alone. `True`
            requires `sampling_backend="bernoulli"`.
        ste_unsampled_gradient (`str`, *optional*, defaults to `"opening"`):
            What `ste_all_pairs` gives a pair that was not sampled. `"opening"`: the first-order change of the loss
            if its edge were added, `e^{s_ij} / (Z_i + e^{s_ij}) (∂L/∂o_i · v_j - ∂L/∂o_i · o_i)` with `Z_i` over
            the row's attended keys: its weight is the one the key would get, at most 1, like a sampled edge's.
            `"derivative"`: the derivative of the pair's gate at 0, whose weight `e^{s_ij} / Z_i` has no bound
            (attnzoo 0.2, and what checkpoints saved before this field load with): for a key that outscores the
            row's sampled ones it saturates the clip, and summed over every unsampled pair of every row (mean
            pooling sends a gradient to every row) it grew the gradient norm to the hundreds and stalled short-input
            training under gradient clipping. See [`~attnzoo.kernels.gated_attention`].
        shared_membership_mlp (`bool`, *optional*, defaults to `True`):
            One membership MLP per layer shared by all heads and by queries and keys (official code); `False` gives
            each head its own MLP (paper text).
        membership_logit_bias (`float`, *optional*, defaults to 0.0):
            Constant added to the membership logits before the sigmoid. 0 is the paper's model (initial density
            about 25%); a negative value starts the model sparse, e.g. -2.6 gives about 1.5% initial density. Used
            to time models at the low densities that training with `λ > 0` reaches.
        add_self_loops (`bool`, *optional*, defaults to `False`):
            Always let every query attend to its own position (self-attention only). The universality proof uses
            them; the paper's experiments do not.
        local_window (`int`, *optional*, defaults to 0):
            Width of a local window added to the sampled graph in self-attention (query `i` also attends to `j` with
            `|i - j| <= local_window // 2`). 0 disables it; the paper's GLUE models use 64. Window edges carry no
            probability gradient and are not counted by the regulariser.
        sampling_backend (`str`, *optional*, defaults to `"bernoulli"`):
            `"bernoulli"`: dense exact Bernoulli sampling of every pair and dense masked attention (what the official
            code ran; O(N²) memory). `"fastrg"`: vectorised fastRG sampling of an edge list (Poisson edge counts,
            duplicates merged) and edge-list attention, linear in the number of edges. `"auto"`: fastRG when the
            expected density is below `auto_density_threshold`, Bernoulli otherwise (decided per call). In eval,
            encoder sites sample each example on its own (its graph never depends on its batch), and decoder sites
            (causal self- and cross-attention) draw every pair from its own seeded uniform, with fastRG's law
            `1 - exp(-p)` under `"fastrg"`, so `generate()` gives the same graph with and without the cache.
        auto_density_threshold (`float`, *optional*, defaults to 0.02):
            Expected density under which `"auto"` picks fastRG.
        sample_at_eval (`bool`, *optional*, defaults to `True`):
            Sample graphs in eval mode too (official code; the paper reports test-time densities of sampled
            graphs). `False` attends over the most likely graph (pairs with probability >= 0.5) in eval.
        sampling_seed (`int`, *optional*, defaults to 0):
            Seed of eval-mode sampling, combined with the layer index, so evaluation is deterministic. Training
            draws from the global torch RNG (reproducible with `set_seed`, replayed by gradient checkpointing).
        sbm_in_decoder (`bool`, *optional*, defaults to `True`):
            Use SBM attention in the decoder's causal self-attention of `SBMForConditionalGeneration` (dense
            otherwise).
        sbm_in_cross_attention (`bool`, *optional*, defaults to `True`):
            Use SBM attention in the decoder's cross-attention (dense otherwise).

    Example:

    ```python
    >>> import attnzoo
    >>> from transformers import AutoModelForSequenceClassification
    >>> config = attnzoo.SBMConfig(vocab_size=8000, hidden_size=128, num_clusters=64, sparsity_weight=1e-2)
    >>> model = AutoModelForSequenceClassification.from_config(config)
    ```
    """

    model_type = "sbm"
    method_sites: ClassVar[tuple[str, ...]] = ("encoder", "decoder", "cross_attention")

    num_clusters: int = 128
    exploration_delta: float | int = 0.01
    exploration_at_eval: bool = True
    sparsity_weight: float | int = 0.0
    ste_variant: str = "official"
    ste_clip: float | int = 1.0
    ste_all_pairs: bool | None = None
    ste_unsampled_gradient: str = "opening"
    shared_membership_mlp: bool = True
    membership_logit_bias: float | int = 0.0
    add_self_loops: bool = False
    local_window: int = 0
    sampling_backend: str = "bernoulli"
    auto_density_threshold: float | int = 0.02
    sample_at_eval: bool = True
    sampling_seed: int = 0
    sbm_in_decoder: bool = True
    sbm_in_cross_attention: bool = True

    # Checkpoints saved before `ste_unsampled_gradient` existed were trained with the gate's derivative.
    values_before_the_field: ClassVar[dict[str, Any]] = {
        **SparseZooConfig.values_before_the_field,
        "ste_unsampled_gradient": "derivative",
    }

    def check_zoo_fields(self) -> None:
        super().check_zoo_fields()
        if self.num_clusters < 1:
            raise ValueError(f"`num_clusters` must be a positive integer, got {self.num_clusters}.")
        if not 0.0 <= self.exploration_delta <= 1.0:
            raise ValueError(f"`exploration_delta` must be in [0, 1], got {self.exploration_delta}.")
        if self.sparsity_weight < 0:
            raise ValueError(f"`sparsity_weight` must be >= 0, got {self.sparsity_weight}.")
        if self.ste_variant not in STE_VARIANTS:
            raise ValueError(f"`ste_variant` must be one of {STE_VARIANTS}, got {self.ste_variant!r}.")
        if self.ste_unsampled_gradient not in STE_UNSAMPLED:
            raise ValueError(
                f"`ste_unsampled_gradient` must be one of {STE_UNSAMPLED}, got {self.ste_unsampled_gradient!r}."
            )
        if self.ste_clip <= 0:
            raise ValueError(f"`ste_clip` must be positive, got {self.ste_clip}.")
        if self.ste_all_pairs is True and self.sampling_backend != "bernoulli":
            raise ValueError(
                "`ste_all_pairs=True` needs `sampling_backend='bernoulli'` (it scores every pair), got "
                f"{self.sampling_backend!r}."
            )
        if self.local_window < 0:
            raise ValueError(f"`local_window` must be >= 0 (0 disables it), got {self.local_window}.")
        if self.sampling_backend not in SAMPLING_BACKENDS:
            raise ValueError(f"`sampling_backend` must be one of {SAMPLING_BACKENDS}, got {self.sampling_backend!r}.")
        if not 0.0 < self.auto_density_threshold <= 1.0:
            raise ValueError(f"`auto_density_threshold` must be in (0, 1], got {self.auto_density_threshold}.")

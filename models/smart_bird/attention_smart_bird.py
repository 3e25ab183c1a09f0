"""Smart Bird attention: per-head attentive token sampling from the sketch, then gathered sparse attention."""

from __future__ import annotations

import torch

from ..core.attention import AttentionOutput, ZooAttention
from ..core.global_tokens import append_global_slots
from ..kernels import gathered_attention, resolve_backend
from .configuration_smart_bird import SmartBirdConfig
from .sampling import resolve_sampling_method, sample_keys


def sampled_length(key_valid: torch.Tensor) -> int:
    """Length an example's keys are sampled over in eval: up to its last real token (`key_valid`: `(N,)` bool)."""
    real = key_valid.nonzero()
    return int(real[-1]) + 1 if real.numel() else 0


class SmartBirdAttention(ZooAttention):
    """Encoder self-attention over `num_samples` keys per query and head, sampled from the sketch's attention.

    Selection: the encoder hands this module its sketch layer's queries and keys (`self.sketch`, set before every
    forward); [`~attnzoo.smart_bird.sampling.sample_keys`] draws each head's keys independently (exactly the
    paper's law, without an `H x N x N` noise tensor: thinning on the CPU, the counter sampler's Triton kernel where
    the attention runs Triton, `config.sampling_method`). Compute: [`~attnzoo.kernels.gathered_attention`] on the
    selected keys, whose implementation `attention_backend` picks (reference, CPU CSR path or Triton); with
    `output_attentions=True`, the dense masked reference over the same keys returns the weights.

    Training draws from the global torch RNG (gradient checkpointing restores it, so the re-run selects the same
    keys); eval draws, for every sample separately, from a generator seeded with `sampling_seed + layer_idx` (so a
    text's keys do not depend on the rest of its batch; the counter sampler gives every example the same counters
    under that seed instead), or takes the top-K sketch weights (`eval_sampling="topk"`).
    Used on its own, without a sketch, every real key has the same sketch weight. The auxiliary loss of the family
    is the sketch network's, added by the encoder.
    """

    supports_causal = False
    supports_cross_attention = False
    is_stochastic = True
    has_aux_loss = True
    supports_global_tokens = True

    def __init__(self, config: SmartBirdConfig, **kwargs):
        super().__init__(config, **kwargs)
        #: `(queries, keys)` of the sketch layer, each `(B, N, sketch_hidden_size)`, set by the encoder
        self.sketch: tuple[torch.Tensor, torch.Tensor] | None = None

    def select(
        self, q: torch.Tensor, key_valid: torch.Tensor | None, num_global: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample each head's keys, then append the `num_global` global keys (as a set, see
        [`~attnzoo.core.global_tokens.append_global_slots`]): `(idx, valid)` of shape `(B, H, N, min(K, N) + g)`."""
        B, H, N, _ = q.shape
        sketch = self.sketch
        if sketch is None or sketch[0].shape[:2] != (B, N):
            flat = q.new_zeros(B, N, 1, dtype=torch.float32)
            sketch = (flat, flat)
        function = self.config.sampling_function
        seeded = not self.training and self.config.eval_sampling == "sample"
        if not self.training and self.config.eval_sampling == "topk":
            function = "topk"
        method = resolve_sampling_method(self.config.sampling_method, q.device, self.config.attention_backend)
        with torch.no_grad(), torch.autocast(device_type=q.device.type, enabled=False):
            if method == "counter":
                # Counter noise is a function of (seed, example, head, query, key): in eval every example takes the
                # counters of example 0 under the layer's seed, so its keys depend neither on the rest of the batch
                # nor on its padding, in one call for the whole batch (no per-example loop, no length sync).
                seed = self.config.sampling_seed + self.layer_idx if seeded else None
                return self._sample(sketch, key_valid, H, function, None, method, seed, not seeded, num_global)
            if not seeded:
                return self._sample(sketch, key_valid, H, function, None, method, num_global=num_global)
            # Eval: every example draws from its own generator with the same seed, over its own length (up to its
            # last real token), so its keys depend neither on the rest of the batch nor on how far the batch pads it.
            idx = torch.zeros(B, H, N, min(self.config.num_samples, N), dtype=torch.long, device=q.device)
            valid = torch.zeros(idx.shape, dtype=torch.bool, device=q.device)
            for b in range(B):
                length = N if key_valid is None else sampled_length(key_valid[b])
                if length == 0:  # no real token: no key to sample
                    continue
                part_idx, part_valid = self._sample(
                    (sketch[0][b : b + 1, :length], sketch[1][b : b + 1, :length]),
                    None if key_valid is None else key_valid[b : b + 1, :length],
                    H,
                    function,
                    torch.Generator(device=q.device).manual_seed(self.config.sampling_seed + self.layer_idx),
                    method,
                )  # (1, H, length, min(K, length)); the padded rows past `length` attend to nothing
                idx[b, :, :length, : part_idx.shape[-1]] = part_idx[0]
                valid[b, :, :length, : part_idx.shape[-1]] = part_valid[0]
            if num_global:
                idx, valid = append_global_slots(idx, valid, key_valid, num_global, as_set=True)
            return idx, valid

    def _sample(
        self, sketch, key_valid, num_heads, function, generator, method, seed=None, per_example=True, num_global=0
    ):
        return sample_keys(
            sketch[0].detach(),
            sketch[1].detach(),
            key_valid,
            num_heads=num_heads,
            num_samples=self.config.num_samples,
            function=function,
            generator=generator,
            method=method,
            seed=seed,
            per_example=per_example,
            backend=self.config.attention_backend,
            num_global=num_global,
        )

    # A compiler boundary: the gathered kernel's custom autograd Function breaks dynamo's automatic-dynamic shapes
    # pass (IndexError in torch 2.13), so under `torch.compile` this attention runs eagerly (one graph break per
    # layer) and the rest of the model is compiled.
    @torch.compiler.disable
    def attend(self, q, k, v, key_valid, *, query_offset=0, output_attentions=False):
        # A sampled key that is also global is kept once (as the global slot), so the keys stay distinct.
        idx, valid = self.select(q, key_valid, self.global_positions(k.shape[2]))  # (B, H, N, K + g)
        density = self._density(valid, key_valid)
        if output_attentions:
            # Valid keys are distinct per row; unused slots (valid False) may repeat one of them, so their writes are
            # added, never overwrite a sampled key.
            counts = torch.zeros(*q.shape[:3], k.shape[2], dtype=torch.int32, device=q.device)
            mask = counts.scatter_add_(3, idx, valid.to(torch.int32)) > 0
            out = self.dense_reference(q, k, v, mask, output_attentions)
            out.density = density
            return out
        # The Triton kernels compute the global queries' dense rows in their own programs (no op around them).
        global_rows = 0
        if resolve_backend(self.config.attention_backend, q.device, q.dtype, k.dtype, v.dtype) == "triton":
            global_rows = self.kernel_global_rows(q.shape[2], k.shape[2], query_offset)
        out = gathered_attention(
            q, k, v, idx, valid, scale=self.scaling, dropout_p=self.dropout, training=self.training,
            global_rows=global_rows, key_valid=key_valid, backend=self.config.attention_backend,
        )  # fmt: skip
        return AttentionOutput(hidden_states=out, density=density, global_rows_done=global_rows > 0)

    @staticmethod
    def _density(valid: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        """`(B, H)`: attended pairs over the example's valid (real query, real key) pairs."""
        N = valid.shape[2]
        if key_valid is None:
            return torch.sum(valid, (2, 3), dtype=torch.float32) / (N * N)  # counted in fp32: one reduction
        attended = torch.sum(valid & key_valid[:, None, :, None], (2, 3), dtype=torch.float32)
        pairs = torch.sum(key_valid, -1, dtype=torch.float32).square().clamp_(min=1.0)  # (B,)
        return attended / pairs[:, None]

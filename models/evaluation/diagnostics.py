"""Measurements that explain how a family reads a long input (the why behind the long-input table).

- [`cls_receptive_field`]: which input positions can change the pooled token's final state at all, found by
  autograd in fp64 (the positions whose embedding gradient is above round-off), in eval mode.
- [`gradient_norms`]: gradient norm of each encoder layer's parameters after one training step's backward.
- [`padding_attention_share`]: share of attention probability that lands on padded keys (must be 0).
- [`global_read_weight`]: how much weight a real query puts on the global keys (the channel through which a summary
  of the input reaches every position).
- [`diagnose`]: all four for freshly initialised classifiers on a few validation examples (`scripts/run_long_eval.py
  --diagnose`), and [`diagnostics_markdown`] for the table.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import torch

from .runner import ModelSize, RunSpec, build_classifier, collate
from .tasks import TaskData

#: A position reaches an output when its input gradient, computed in fp64, is above this fraction of the largest.
#: Real paths through two untrained layers can be ~1e-7 of it; FSAT's pooled cross is an FFT whose round-off leaks
#: gradients to positions that no antidiagonal of the output pairs (exact zeros in exact arithmetic): ~1e-9 of the
#: largest in fp32, ~1e-16 in fp64.
REACH_TOLERANCE = 1e-11


def reached_positions(grad: torch.Tensor) -> torch.Tensor:
    """`(B, N)` True where the fp64 input gradient `grad` `(B, N, D)` of one output per example is not round-off."""
    if grad.dtype != torch.float64:
        raise ValueError(f"reach needs an fp64 gradient (fp32 round-off reaches 1e-9), got {grad.dtype}")
    norms = grad.abs().sum(-1)  # (B, N)
    return norms > REACH_TOLERANCE * norms.amax(-1, keepdim=True)


def cls_receptive_field(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[int]:
    """Number of real positions that reach the first token's last hidden state, per example.

    Computed on an fp64 copy of the encoder on the CPU (the GPU kernels need not support fp64), so that round-off
    stays far below every real path.

    Args:
        model: a `<Prefix>Model` or a head whose `base_model` is one (put in eval mode here).
        input_ids / attention_mask: `(B, N)`.
    """
    model.base_model.eval()
    base = copy.deepcopy(model.base_model).to("cpu", torch.float64)
    input_ids, attention_mask = input_ids.cpu(), attention_mask.cpu()
    embeddings = base.get_input_embeddings()(input_ids).detach().requires_grad_(True)  # (B, N, D)
    hidden = base(inputs_embeds=embeddings, attention_mask=attention_mask).last_hidden_state  # (B, N, D)
    # Summing over the batch keeps examples separate: example b's CLS state depends on example b's inputs only.
    (grad,) = torch.autograd.grad(hidden[:, 0].pow(2).sum(), embeddings)
    reached = reached_positions(grad) & attention_mask.bool()  # (B, N)
    return reached.sum(-1).tolist()


_ENCODER_LAYER = re.compile(r"(^|\.)encoder\.layers\.(\d+)\.")


def gradient_norms(model: torch.nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of the embeddings, of each encoder layer, of Smart Bird's sketch network (its own
    layers, embeddings and classifier: `"sketch"`) and of the rest (the head), after `backward()`."""
    groups: dict[str, list[torch.Tensor]] = {}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        layer = _ENCODER_LAYER.search(name)
        if ".encoder.sketch." in f".{name}":
            key = "sketch"
        elif layer is not None:
            key = f"layer {layer[2]}"
        elif ".encoder.embeddings." in f".{name}":
            key = "embeddings"
        else:
            key = "head"
        groups.setdefault(key, []).append(param.grad.detach().float().pow(2).sum())
    return {key: float(torch.stack(parts).sum().sqrt()) for key, parts in sorted(groups.items())}


@torch.no_grad()
def eval_attentions(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Every layer's attention weights `(B, H, N, N)`, applied to the values, in eval mode."""
    model.eval()
    return model.base_model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True).attentions


def padding_shares(attentions: Sequence[torch.Tensor], attention_mask: torch.Tensor) -> list[float]:
    """Per layer of `attentions`, the largest share of any real query's attention that falls on padded keys."""
    padded = ~attention_mask.bool()  # (B, N)
    real_query = attention_mask.bool()[:, None, :, None]  # (B, 1, N, 1)
    shares: list[float] = []
    for weights in attentions:  # (B, H, N, N)
        on_padding = (weights * padded[:, None, None, :]).sum(-1, keepdim=True)  # (B, H, N, 1)
        shares.append(float(on_padding.masked_fill(~real_query, 0).max()))
    return shares


def global_reads(attentions: Sequence[torch.Tensor], attention_mask: torch.Tensor, g: int) -> list[float]:
    """Per layer of `attentions`, the mean weight that the real queries after the first `g` put on the first `g`
    keys."""
    queries = attention_mask.bool().clone()  # (B, N)
    queries[:, :g] = False
    reads: list[float] = []
    for weights in attentions:  # (B, H, N, N)
        on_global = weights[..., :g].sum(-1).transpose(1, 2)  # (B, N, H)
        reads.append(float(on_global[queries].mean()))
    return reads


def global_keys_of(model: torch.nn.Module) -> int:
    """The global keys `global_read_weight` measures: `num_global_tokens`, or the first token without any."""
    return max(getattr(model.config, "num_global_tokens", 0), 1)


def padding_attention_share(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> list[float]:
    """Per layer, the largest share of any real query's attention that falls on padded keys (eval mode)."""
    return padding_shares(eval_attentions(model, input_ids, attention_mask), attention_mask)


def global_read_weight(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[float]:
    """Per layer, the mean weight that the real non-global queries put on the global keys (eval mode).

    The global keys are the first `num_global_tokens` positions; a family without any (the dense one) is measured on
    the first token. The weights are those applied to the values: FSAT's carry its confidences and, with
    `global_key_softmax="own"`, the global keys' own softmax, so they need not sum to 1 over a row.
    """
    return global_reads(eval_attentions(model, input_ids, attention_mask), attention_mask, global_keys_of(model))


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """The config fields that set how far a family reads (for the diagnostics table)."""
    config = model.config
    keys = (
        "classifier_pooling",
        "num_global_tokens",
        "num_sample_points",
        "offset_bias_init",
        "num_samples",
        "sketch_hidden_size",
        "sparse_pattern",
        "sparse_stride",
        "sparse_head_assignment",
        "num_dominant_indices",
        "num_random_indices",
        "index_scale",
        "index_prior",
        "global_key_softmax",
        "num_clusters",
        "sampling_backend",
    )
    return {k: getattr(config, k) for k in keys if hasattr(config, k)}


def diagnose(
    task: TaskData, specs: Sequence[RunSpec], size: ModelSize, examples: int = 4, seed: int = 0
) -> list[dict[str, Any]]:
    """The measurements of every spec's classifier at initialisation, on the `examples` longest validation examples
    (the ones a long-input method is for).

    Returns:
        One JSON-able record per spec: the pooled token's receptive field per example (real positions that reach it
        after the last layer), the real lengths, the per-layer padding share and global read weight, the gradient
        norms of one training step's backward (dropout on), and the config fields that set how far the family reads.
    """
    longest = sorted(range(len(task.validation)), key=lambda i: (-len(task.validation[i][0]), i))[:examples]
    batch = collate([task.validation[i] for i in longest])
    records = []
    for spec in specs:
        if spec.length != task.length:
            raise ValueError(f"The task is encoded at length {task.length}, the spec asks for {spec.length}.")
        torch.manual_seed(seed)
        model = build_classifier(task, spec, size)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        reach = cls_receptive_field(model, **inputs)
        # One eval forward for both attention measurements (the weights are N x N per layer and head).
        attentions = eval_attentions(model, **inputs)
        padding = padding_shares(attentions, inputs["attention_mask"])
        global_read = global_reads(attentions, inputs["attention_mask"], global_keys_of(model))
        del attentions
        model.train()
        model(**batch).loss.backward()
        records.append(
            {
                "task": task.name,
                "label": spec.label,
                "length": spec.length,
                "config": describe(model),
                "real_tokens": batch["attention_mask"].sum(-1).tolist(),
                "receptive_field": reach,
                "padding_share": padding,
                "global_read": global_read,
                "gradient_norms": gradient_norms(model),
            }
        )
    return records


def diagnostics_markdown(records: Sequence[dict]) -> str:
    """One row per record: how much of each example the first token can see, and where the gradient goes."""
    lines = [
        "| task | model | length | pooling | first token reaches (real tokens, mean over examples) | share | "
        "largest padding share | global read per layer | gradient norm per layer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        reach, real = sum(r["receptive_field"]), sum(r["real_tokens"])
        layers = ", ".join(f"{k}: {v:.2g}" for k, v in r["gradient_norms"].items() if k.startswith("layer"))
        # Records written before the global read was measured have none.
        reads = " / ".join(f"{v:.2g}" for v in r.get("global_read", [])) or "–"
        lines.append(
            f"| {r['task']} | {r['label']} | {r['length']} | {r['config'].get('classifier_pooling', 'cls')} | "
            f"{reach / len(r['real_tokens']):.0f} of "
            f"{real / len(r['real_tokens']):.0f} | {reach / max(real, 1):.1%} | {max(r['padding_share']):.1g} | "
            f"{reads} | {layers} |"
        )
    return "\n".join(lines) + "\n"

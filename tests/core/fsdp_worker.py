"""Worker of `test_fsdp.py`, started by `torchrun --nproc_per_node 2`: FSDP2 training of every family on CPU (gloo).

accelerate (1.15) turns `Trainer(fsdp=...)` into FSDP only on accelerators; on a CPU-only machine Trainer silently
falls back to DDP. So on CPU this worker shards the model with torch's FSDP2 (`fully_shard`, every encoder layer
and the root) and trains it with a plain loop, which is what `Trainer(fsdp="full_shard", fsdp_config={"fsdp_version":
2})` does on GPUs. For every family named on the command line: train the masked-LM model a few steps, evaluate it
sharded, gather the full state dict, save it with `save_pretrained` on rank 0, reload it with `from_pretrained` and
compare; the results go to `<output_dir>/<family>.json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForMaskedLM

import attnzoo  # noqa: F401  (registers the families)
from source_checkout import load_config


def _batch(vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def train_family(name: str, output_dir: Path, mesh) -> None:
    rank = dist.get_rank()
    config = load_config(name, "tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = sum(p.requires_grad for p in model.parameters())  # Smart Bird freezes sketch parts its task never uses
    for layer in model.model.encoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    losses = []
    for step in range(3):
        torch.manual_seed(step)  # the same training-time samples on both ranks
        loss = model(**_batch(config.vocab_size, seed=10 * step + rank)).loss  # each rank its own data
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    model.eval()
    probe = _batch(config.vocab_size, seed=99)
    probe.pop("labels")
    with torch.no_grad():
        sharded_logits = model(**probe).logits  # every rank runs the sharded forward (all-gathers)
    full_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        checkpoint = output_dir / name
        plain = AutoModelForMaskedLM.from_config(config)
        plain.load_state_dict(full_state)
        plain.save_pretrained(checkpoint)
        reloaded = AutoModelForMaskedLM.from_pretrained(checkpoint).eval()
        with torch.no_grad():
            logits = reloaded(**probe).logits
        changed = sum(not torch.equal(p, initial[n]) for n, p in reloaded.named_parameters())
        result = {
            "family": name,
            "world_size": dist.get_world_size(),
            "sharded_parameters": all(type(p).__name__ == "DTensor" for p in model.parameters()),
            "losses": losses,
            "max_abs_difference": float((logits - sharded_logits).abs().max()),
            "parameters_changed": changed,
            "trainable_parameters": trainable,
        }
        (output_dir / f"{name}.json").write_text(json.dumps(result))
    dist.barrier()


def main() -> None:
    output_dir, families = Path(sys.argv[1]), sys.argv[2:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    try:
        for name in families:
            train_family(name, output_dir, mesh)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

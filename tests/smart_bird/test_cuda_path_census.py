"""Smart Bird on the CUDA code path, counted op by op: its sampler and sketch add no device synchronisation and no
`(N, N)` tensor, and the sketch's SDPA runs at a head size SDPA's fast CUDA kernels take.

The code path is `attention_backend="triton"`, which on a CPU runs the CUDA branches with the Triton kernels under
Triton's interpreter (`tests/conftest.py`); the launches are stubbed (counted, no program runs: the counts do not
depend on what the kernels compute). The counting is `attnzoo.benchmarking`'s `OpRecorder` and `cuda_code_path`
(without its `CUDA_BRANCHES` steering: Smart Bird picks its sampler from `attention_backend` itself).

Run as a program, it prints the census of one encoder layer at base width before and after issue 49 (the literal
sampler with 2**26-element noise chunks and the sketch's SDPA at head size 4, as CUDA ran them, against the counter
sampler and the aligned sketch attention), and dense's:

    PYTHONPATH=<the checkout's attnzoo> python tests/smart_bird/test_cuda_path_census.py --length 1024
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

if __name__ == "__main__":  # as a program: the CUDA code path on a CPU needs the interpreter before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attnzoo.benchmarking.proxies import cuda_code_path  # noqa: E402
from attnzoo.benchmarking.recorder import Counts, OpRecorder  # noqa: E402
from attnzoo.dense_transformer import DenseTransformerConfig, DenseTransformerModel  # noqa: E402
from attnzoo.smart_bird import SmartBirdConfig, SmartBirdModel, sampling, sketch  # noqa: E402


@dataclass
class Census:
    """One run's counts (`OpRecorder`'s, every scope added up) and the bytes autograd saved for backward."""

    counts: Counts
    saved_bytes: int

    @property
    def num_syncs(self) -> int:
        return sum(self.counts.syncs.values())

    @property
    def sdpa_head_dims(self) -> list[int]:
        return [head_dim for head_dim, _ in self.counts.sdpa]


@contextlib.contextmanager
def before_issue_49() -> Iterator[None]:
    """The CUDA path as it was: the literal sampler in 2**26-element chunks, the sketch's SDPA at its own head size."""
    chunk, alignment = sampling._CHUNK_ELEMENTS_CPU, sketch.SDPA_HEAD_ALIGNMENT
    sampling._CHUNK_ELEMENTS_CPU, sketch.SDPA_HEAD_ALIGNMENT = sampling._CHUNK_ELEMENTS_ACCELERATOR, 1
    try:
        yield
    finally:
        sampling._CHUNK_ELEMENTS_CPU, sketch.SDPA_HEAD_ALIGNMENT = chunk, alignment


def census(
    model: torch.nn.Module, input_ids: torch.Tensor, *, train: bool, attention_mask: torch.Tensor | None = None
) -> Census:
    """The census of one eval forward without autograd (`train=False`) or one training forward+backward (all-ones
    `attention_mask` by default), after one unrecorded warm-up forward (as the benchmark does)."""
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    model.train(train)
    warm_up = OpRecorder()  # recording too: a stubbed kernel zero-fills only outputs allocated while recording
    with cuda_code_path(warm_up, None), warm_up, torch.no_grad():
        model(input_ids=input_ids, attention_mask=mask)
    recorder = OpRecorder()
    with cuda_code_path(recorder, None), torch.set_grad_enabled(train), recorder:
        with recorder.saving_hooks(list(model.parameters())):
            hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        if train:
            hidden.float().pow(2).mean().backward()
    saved = sum(sum(storages.values()) for storages in recorder.saved.values())
    return Census(recorder.total(), saved)


def _models(width: int, heads: int, ffn: int, length: int, **smart_bird) -> tuple[torch.nn.Module, ...]:
    size = {
        "vocab_size": 512, "hidden_size": width, "num_hidden_layers": 1, "num_attention_heads": heads,
        "intermediate_size": ffn, "max_position_embeddings": length, "attention_backend": "triton",
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    }  # fmt: skip
    torch.manual_seed(0)
    return DenseTransformerModel(DenseTransformerConfig(**size)), SmartBirdModel(SmartBirdConfig(**size, **smart_bird))


# ----- tests -----

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA path is counted here on a CPU")
LENGTH = 512  # the batch's FFN activation (2 x N x 2D = 2 x 512 x 128) is below N x N, which the census must not see
N_BY_N_BYTES = LENGTH * LENGTH * 4  # one fp32 (N, N) tensor


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two examples, the second padded: the case where eval sampling used to sync once per example."""
    ids = torch.randint(5, 512, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, LENGTH - 100 :] = 0
    return ids, mask


@pytest.mark.parametrize("train", [False, True], ids=["forward", "forward+backward"])
def test_the_counter_sampler_and_the_sketch_add_no_sync_and_no_n_by_n_tensor(train):
    dense, smart_bird = _models(64, 4, 128, LENGTH, num_samples=8)
    ids, mask = _padded_batch()
    base = census(dense, ids, train=train, attention_mask=mask)
    counted = census(smart_bird, ids, train=train, attention_mask=mask)
    assert counted.num_syncs == base.num_syncs, (counted.counts.syncs, base.counts.syncs)  # input checks sync
    assert counted.counts.largest_bytes < N_BY_N_BYTES, counted.counts.largest_op
    assert all(d % sketch.SDPA_HEAD_ALIGNMENT == 0 for d in counted.sdpa_head_dims), counted.sdpa_head_dims
    launches = counted.counts.launches
    assert launches["_attentive_sample_kernel"] == 1  # one sampler launch per layer, none in backward
    assert launches["_gathered_bwd"] == int(train)


def test_the_census_sees_what_the_cuda_path_did_before():
    # The same census on the path before issue 49 finds its (H, N, N) noise, its eval-time syncs and head size 4.
    dense, smart_bird = _models(64, 4, 128, LENGTH, num_samples=8, sampling_method="literal")
    ids, mask = _padded_batch()
    base = census(dense, ids, train=False, attention_mask=mask)
    with before_issue_49():
        counted = census(smart_bird, ids, train=False, attention_mask=mask)
    assert counted.counts.largest_bytes >= 4 * N_BY_N_BYTES, counted.counts.largest_op
    assert counted.num_syncs > base.num_syncs, (counted.counts.syncs, base.counts.syncs)  # a length per example
    assert 4 in counted.sdpa_head_dims


# ----- the report -----


def _row(name: str, fwd: Census, fwd_bwd: Census) -> str:
    written = fwd.counts.bytes_written / 2**20, fwd_bwd.counts.bytes_written / 2**20
    return (
        f"| {name} | {fwd.counts.num_ops} | {fwd_bwd.counts.num_ops} | {fwd.num_syncs} / {fwd_bwd.num_syncs} | "
        f"{fwd_bwd.saved_bytes / 2**20:.1f} | {written[0]:.1f} / {written[1]:.1f}"
        f" | {fwd.counts.largest_op} | {fwd_bwd.counts.largest_op} | {sorted(set(fwd.sdpa_head_dims))} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--ffn", type=int, default=3072)
    args = parser.parse_args()
    ids = torch.randint(5, 512, (1, args.length), generator=torch.Generator().manual_seed(0))
    print(
        f"One encoder layer, width {args.width}, {args.heads} heads, FFN {args.ffn}, N = {args.length}, fp32, batch 1"
    )
    print("| row | aten ops fwd | aten ops fwd+bwd | syncs fwd / fwd+bwd | saved MB | written MB fwd / fwd+bwd "
          "| largest output fwd | largest output fwd+bwd | SDPA head dims |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    dense, after = _models(args.width, args.heads, args.ffn, args.length)
    print(_row("dense", census(dense, ids, train=False), census(dense, ids, train=True)))
    print(_row("smart_bird after (counter sampler, aligned sketch)", census(after, ids, train=False),
               census(after, ids, train=True)))  # fmt: skip
    _, before = _models(args.width, args.heads, args.ffn, args.length, sampling_method="literal")
    with before_issue_49():
        print(_row("smart_bird before (literal sampler, head size 4)", census(before, ids, train=False),
                   census(before, ids, train=True)))  # fmt: skip


if __name__ == "__main__":
    main()

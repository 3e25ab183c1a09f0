"""How many fastRG edge slots an SBM layer reserves on an accelerator: chosen on the host, without waiting for the
device, from what the layer's earlier calls drew."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from .fastrg import FastRGGraph, poisson_slots


def reads_draw_counts(kernel: str) -> bool:
    """Whether the fastRG sampler reads its draw count from the device to size the edge list exactly, given the
    edge attention's implementation (`"reference"`, `"torch"` or `"triton"`, as resolved by the kernel dispatch).

    Only the Triton kernel takes a padded edge list without compacting it (a host sync on an accelerator), so only
    its path reserves the slots with an [`EdgeBudget`] instead; the others read the count (free on a CPU). The path
    follows `attention_backend`, so `"triton"` on a CPU under Triton's interpreter takes CUDA's branch.
    """
    return kernel != "triton"


def round_slots(slots: int) -> int:
    """`slots` rounded up to one of 16 sizes per octave (a multiple of `2^(bit_length - 5)`): at most 6.25% more."""
    step = 1 << max(slots.bit_length() - 5, 0)
    return -(-slots // step) * step


class EdgeBudget:
    """Slots reserved for one SBM layer's fastRG draws, sized from the layer's earlier calls.

    The number of draws is Poisson with a mean that only the device knows, and reading it would make the host wait
    for the device in every call. Instead each call copies its mean and its draw count to pinned host memory without
    waiting ([`record`]), and a later call reads them once the device has passed that point (never waiting for it:
    an unfinished copy is left for the next call). The reservation is `poisson_slots(headroom * rate * pairs)`, with
    `rate` the expected draws per `(query, key)` pair of the recent calls (the largest, remembered with a decay of
    `decay` per call), so the Poisson noise of the count never exceeds it and the mean may grow by `headroom` from
    one call to the next; it is rounded up to one of 16 sizes per octave ([`round_slots`], at most 6.25% more).
    The first call has no history and reads its mean from the device (one wait per layer, once).

    The rate follows the expected counts only, never the random draw counts: the reservation (hence the padded edge
    list and the bytes saved for backward) is a function of the weights and inputs of the calls, not of their random
    draws, and the rounding keeps it the same while the mean drifts a little from one training step to the next. A
    function of the current call alone would need its mean on the host, which is the wait this class avoids.

    A call whose draws exceed its reservation drops the draws past it, so its graph is not fastRG's: the next call
    that reads its counts warns, naming the layer and the counts, and reserves for that call's rate from then on.
    The slots change nothing else: every draw's random numbers depend on its position only, so the same seed gives
    the same graph whatever was reserved.

    Args:
        name (`str`): the layer, for the warning.
    """

    headroom: float = 1.5
    decay: float = 0.9

    def __init__(self, name: str) -> None:
        self.name = name
        self.rate: float | None = None
        self._pending: tuple[Tensor, torch.cuda.Event | None, int, int] | None = None

    def reserve(self, expected: Tensor, pairs: int) -> int:
        """Slots for a call with `pairs` `(query, key)` pairs whose expected draw count is the device scalar
        `expected` (read only on the first call)."""
        self._collect()
        if self.rate is None:
            self.rate = float(expected) / max(pairs, 1)
        return round_slots(poisson_slots(self.headroom * self.rate * pairs))

    def record(self, graph: FastRGGraph, pairs: int) -> None:
        """Send a call's expected and drawn counts to the host, without waiting for them."""
        counts = graph.totals[0]  # expected and drawn fastRG draws (fp64: the draws are exact integers)
        if counts.device.type == "cuda":
            host = torch.empty(2, dtype=counts.dtype, pin_memory=True)
            host.copy_(counts, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = counts, None
        self._pending = (host, event, pairs, graph.slots)

    def _collect(self) -> None:
        """Read the last recorded call's counts if the device has produced them."""
        if self._pending is None:
            return
        host, event, pairs, slots = self._pending
        if event is not None and not event.query():
            return
        self._pending = None
        expected, drawn = host.tolist()
        drawn = int(drawn)
        rate = expected / max(pairs, 1)
        self.rate = rate if self.rate is None else max(rate, self.rate * self.decay)
        if drawn > slots:
            warnings.warn(
                f"SBM {self.name}: a fastRG graph drew {drawn} edges into the {slots} slots reserved for it, and the "
                f"{drawn - slots} past them were dropped, so that call's graph did not follow fastRG's law. The "
                f"reservation now covers {self.headroom}x that call's rate ({EdgeBudget.__name__}.headroom).",
                RuntimeWarning,
                stacklevel=3,
            )

"""Entry point of the subprocesses started by :func:`attnzoo.benchmarking.run_benchmark` (not a user interface).

`python -m attnzoo.benchmarking memory-worker|timing-worker SETTINGS_JSON` prints its result as one JSON line behind
:data:`~attnzoo.benchmarking.subprocesses.RESULT_MARKER`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .memory import memory_worker
from .settings import BenchmarkSettings
from .subprocesses import RESULT_MARKER
from .timing import timing_sweep


def worker_main(argv: list[str]) -> None:
    """Run the worker `argv[0]` on the JSON payload `argv[1]` and print its result line."""
    import attnzoo  # noqa: F401  (registers the landed families before the settings name them)

    kind, payload = argv[0], json.loads(argv[1])
    settings = BenchmarkSettings(**payload["settings"])
    if kind == "memory-worker":
        result: Any = memory_worker(settings, payload["model"], payload["length"])
    elif kind == "timing-worker":
        result = timing_sweep(settings)
    else:
        raise SystemExit(f"unknown worker {kind!r}")
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    worker_main(sys.argv[1:])

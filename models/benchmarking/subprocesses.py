"""Start the benchmark's worker subprocesses and read back their one-line JSON results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from .settings import BenchmarkSettings

# Subprocess results are printed on one line behind this marker, so library warnings on stdout cannot corrupt them.
RESULT_MARKER = "ATTNZOO_BENCHMARK_RESULT "


def _subprocess_env(settings: BenchmarkSettings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MALLOC_MMAP_THRESHOLD_": "65536",  # large buffers are mmapped and returned on free (package docstring)
            "OMP_NUM_THREADS": str(settings.threads),
            "MKL_NUM_THREADS": str(settings.threads),
            "TOKENIZERS_PARALLELISM": "false",
            "TRANSFORMERS_VERBOSITY": "error",
        }
    )
    return env


def run_worker(kind: str, payload: dict[str, Any], settings: BenchmarkSettings) -> subprocess.Popen:
    """Start `python -m attnzoo.benchmarking KIND PAYLOAD_JSON` (`__main__.py`) in the benchmark's environment."""
    command = [sys.executable, "-m", "attnzoo.benchmarking", kind, json.dumps(payload)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_subprocess_env(settings)
    )


def collect_worker(process: subprocess.Popen) -> Any:
    """Wait for a worker and return its result; `RuntimeError` with the end of its output when it printed none."""
    stdout, stderr = process.communicate()
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    tail = (stderr or stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"benchmark worker failed (exit {process.returncode}): {' | '.join(tail)}")

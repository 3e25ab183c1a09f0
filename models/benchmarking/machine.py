"""What the numbers depend on: hardware, threads, load, library versions, commit and date."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import torch

from .settings import BenchmarkSettings


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (`None` without `/proc/loadavg`)."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def apply_threads(settings: BenchmarkSettings) -> None:
    """Pin intra-op threads (and, if asked, CPU affinity) before any tensor work."""
    if settings.cpu_affinity:
        os.sched_setaffinity(0, settings.cpu_affinity)
    torch.set_num_threads(settings.threads)
    # Fails once inter-op work ran in this process (e.g. in tests); the value is then already fixed.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def cpu_affinity() -> list[int] | None:
    """The cores this process may run on (`None` where the platform cannot tell)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _git(*args: str) -> str | None:
    # Asked in the package's own folder: a source checkout answers with its commit, an installed wheel with nothing.
    here = Path(__file__).resolve().parent
    try:
        result = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def machine_header(settings: BenchmarkSettings) -> dict[str, Any]:
    """What the numbers depend on: hardware, threads, library versions, commit, date."""
    import transformers

    import attnzoo

    cpu_model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read(), re.MULTILINE)
            cpu_model = match.group(1).strip() if match else cpu_model
    except OSError:
        pass
    header = {
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_affinity(),
        "threads": settings.threads,
        "torch_num_threads": torch.get_num_threads(),
        "device": settings.device,
        "dtype": settings.dtype,
        "gpu": None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attnzoo": attnzoo.__version__,
        "git_commit": _git("rev-parse", "HEAD"),
        # Uncommitted or untracked code changes the numbers; result folders elsewhere in the tree do not.
        "git_dirty": bool(_git("status", "--porcelain", "--", "models", "scripts", "pyproject.toml")),
        "date_start": utc_now(),
    }
    if settings.device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        header["gpu"] = {
            "name": properties.name,
            "memory_gib": round(properties.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "capability": list(torch.cuda.get_device_capability(0)),
        }
    return header

"""Work that a test session does once, whatever the number of pytest-xdist processes.

Under pytest-xdist every process would otherwise redo a session fixture's work (a subprocess run, a measurement) for
the tests it happens to get. The processes share the parent of their temporary folders, unique to the session: the
first process to ask does the work under a file lock and leaves a marker; the others wait on the lock and read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str, produce: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `produce(folder)` once per test session (a failed `produce` leaves no marker,
    so the next process to ask tries again and fails alike).

    Args:
        tmp_path_factory (`pytest.TempPathFactory`): the session's.
        name (`str`): the folder's name, unique to the work (and to its arguments).
        produce (`Callable[[Path], None]`): writes the results into the (existing, empty) folder.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        produce(folder)
        return folder
    shared = tmp_path_factory.getbasetemp().parent
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            folder.mkdir(exist_ok=True)
            produce(folder)
            done.touch()
    return folder

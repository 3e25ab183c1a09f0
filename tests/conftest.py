"""Test configuration: offline mode, GPU skipping, optional extra families, and no deprecated transformers API."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without CUDA, attention_backend="triton" runs attnzoo's Triton kernels under Triton's CPU interpreter, which is
# chosen when the kernels are first imported: set it before anything can import them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attnzoo  # noqa: E402, F401  (registers every family)

# Families still under development register themselves when named here, e.g. ATTNZOO_FAMILIES=sbm,fsat.
for _name in filter(None, os.environ.get("ATTNZOO_FAMILIES", "").split(",")):
    importlib.import_module(f"attnzoo.{_name.strip()}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


class _DeprecationLog(logging.Handler):
    """Collects the deprecation notices transformers writes to its logger (its `warnings` are errors, see
    `filterwarnings` in pyproject.toml)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "deprecat" in record.getMessage().lower():
            self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def no_transformers_deprecation_notices() -> Iterator[None]:
    """The package must use the installed release's current names (`attnzoo.core.compat`): a deprecated call fails
    the test that makes it, so the next transformers release cannot remove something under us unseen."""
    handler = _DeprecationLog()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.messages:
        pytest.fail("transformers logged a deprecation: " + " | ".join(dict.fromkeys(handler.messages)))

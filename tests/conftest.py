"""Test configuration: offline mode, deterministic threads, GPU skipping, and optional extra families."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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

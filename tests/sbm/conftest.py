"""Fixtures of the SBM tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def synthetic_script() -> ModuleType:
    """`scripts/sbm_synthetic.py` imported as a module (scripts are not part of the package)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "sbm_synthetic.py"
    spec = importlib.util.spec_from_file_location("sbm_synthetic", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

"""Fixtures of the SBM tests."""

from __future__ import annotations

from types import ModuleType

import pytest

from attnzoo.testing import load_script


@pytest.fixture(scope="session")
def synthetic_script() -> ModuleType:
    """`scripts/sbm_synthetic.py` imported as a module (scripts are not part of the package)."""
    return load_script("sbm_synthetic")

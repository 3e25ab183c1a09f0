"""Registers the pytest markers of transformers' common tests (the suite runs with `--strict-markers`)."""

from __future__ import annotations

import re

import pytest

from .upstream import UPSTREAM_FILES, UpstreamUnavailable, upstream_tests_dir


def pytest_configure(config: pytest.Config) -> None:
    try:
        folder = upstream_tests_dir()
    except UpstreamUnavailable:
        return  # the test module reports it and skips
    names = set()
    for name in UPSTREAM_FILES:
        names.update(re.findall(r"\bmark\.([A-Za-z_]\w*)\b", (folder / name).read_text()))
    for name in sorted(names):
        config.addinivalue_line("markers", f"{name}: marker of transformers' common tests")

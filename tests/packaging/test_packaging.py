"""Packaging: the folder `models/` installs as `attnzoo`, completely, and cannot be imported under its folder name."""

from __future__ import annotations

import subprocess
import sys

from transformers import AutoConfig

import attnzoo
from source_checkout import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def test_pyproject_lists_every_subpackage():
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(("attnzoo", *path.parent.relative_to(REPO_ROOT / "models").parts))
        for path in (REPO_ROOT / "models").rglob("__init__.py")
        if "__pycache__" not in path.parts
    }
    assert listed == found


def test_importing_the_folder_as_models_fails_clearly():
    result = subprocess.run(
        [sys.executable, "-c", "import models"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "must be imported as `attnzoo`" in result.stderr


def test_import_registers_every_family_with_the_auto_classes():
    assert attnzoo.FAMILIES, "no family registered"
    for model_type, family in attnzoo.FAMILIES.items():
        assert type(AutoConfig.for_model(model_type)) is family.config_class
        assert (REPO_ROOT / "configs" / "models" / family.name / "tiny.json").is_file()

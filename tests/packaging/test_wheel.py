"""The library stands alone: the wheel (`pip wheel .`), installed non-editable into a fresh virtual environment with
only its core dependencies, imports, builds a tiny model of every family, saves and reloads it with the Auto classes
and runs it, without the checkout on the path. Marked `wheel`: it builds and installs (about two minutes, the
package index reachable), so `bash scripts/run.sh test-wheel` runs it apart from the default suite (CI does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

import attnzoo
from source_checkout import REPO_ROOT

CHECK = Path(__file__).with_name("wheel_check.py")


def _run(command: list[str], cwd: Path) -> str:
    # A clean environment: nothing of the checkout or of this interpreter's packages leaks into the new one.
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.wheel
@pytest.mark.timeout(3600)  # unpacking torch into a fresh environment is disk-bound: minutes on a busy machine
def test_the_wheel_runs_every_family_with_core_dependencies_only(tmp_path: Path) -> None:
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp_path / "dist"), str(REPO_ROOT)],
        tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("attnzoo-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    # The pinned torch first (as scripts/run.sh does): a bare `torch` requirement would resolve to a CUDA build.
    _run([python, "-m", "pip", "install", "--quiet", f"torch=={torch.__version__.split('+')[0]}"], tmp_path)
    _run([python, "-m", "pip", "install", "--quiet", str(wheel)], tmp_path)
    configs = {}
    for name, family in attnzoo.FAMILIES.items():
        fields = json.loads((REPO_ROOT / "configs" / "models" / family.name / "tiny.json").read_text())
        fields.pop("model_type")
        configs[name] = fields
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    # Run from an empty folder: the checkout must not be importable.
    output = _run([python, str(CHECK), str(tmp_path / "configs.json"), str(tmp_path / "saved")], tmp_path)
    for name in configs:
        assert f"{name}: built, saved, reloaded" in output, output
    assert "attnzoo[train]" in output

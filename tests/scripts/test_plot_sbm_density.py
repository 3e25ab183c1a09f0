"""The density plotting script: figure written, densities returned, Trainer logs read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from source_checkout import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    return load_script("tools/plot_sbm_density")


def test_plot_writes_figure_with_logged_densities(script, tmp_path):
    state = tmp_path / "trainer_state.json"
    logs = [{"step": s, "loss": 1.0, "sbm_density/layer_0": 0.25 - s / 100, "sbm_density/mean": 0.2} for s in (1, 2)]
    state.write_text(json.dumps({"log_history": logs}))
    out = tmp_path / "density.png"
    density = script.main(
        [
            "--config_path", str(REPO_ROOT / "configs" / "models" / "sbm" / "tiny.json"),
            "--length", "64",
            "--trainer_state", str(state),
            "--output_file", str(out),
        ]
    )  # fmt: skip
    assert out.stat().st_size > 0
    assert density.shape == (2, 4)
    assert 0.15 < float(density.mean()) < 0.35
    assert script.read_logged_density(str(state))["sbm_density/layer_0"] == ([1, 2], [0.24, 0.23])


def test_plot_rejects_both_sources(script):
    with pytest.raises(ValueError, match="exactly one"):
        script.main(["--config_path", "a.json", "--model_name_or_path", "b"])

"""`scripts/tools/plot_a2former_positions.py` draws and returns the bounded sample positions of every layer."""

from __future__ import annotations

import torch

from source_checkout import REPO_ROOT, load_script


def test_plot_writes_the_figure_and_positions_stay_in_range(tmp_path):
    output = tmp_path / "positions.png"
    positions = load_script("tools/plot_a2former_positions").main(
        [
            "--config_path", str(REPO_ROOT / "configs" / "models" / "a2former" / "tiny.json"),
            "--length", "40", "--layers", "0", "1", "--perturb", "0.5", "--save_positions",
            "--output_file", str(output),
        ]
    )  # fmt: skip
    assert output.is_file() and (tmp_path / "positions.png.pt").is_file()
    assert sorted(positions) == [0, 1]
    pos = positions[0]  # (H, N, K)
    assert pos.shape == (4, 40, 10) and pos.min() >= 0 and pos.max() <= 39
    assert not torch.equal(pos, pos.round())  # perturbed offsets give fractional, input-dependent positions

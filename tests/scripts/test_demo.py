"""`scripts/demo.py`: the showcase runs end to end (tiny step counts here) and writes its table, JSON and plot."""

from __future__ import annotations

import json

import pytest

import attnzoo


def test_demo_smoke_writes_table_json_and_plot(tmp_path, load_script, capsys):
    demo = load_script("demo")
    status = demo.main(
        ["--output_dir", str(tmp_path), "--mlm_steps", "2", "--sst2_steps", "2", "--families", "dense_transformer"]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "The album was released in [MASK] ." in printed  # fill-mask predictions are shown
    assert "| dense_transformer |" in printed
    summary = json.loads((tmp_path / "results.json").read_text())
    assert [row["family"] for row in summary["results"]] == ["dense_transformer"]
    assert 0.0 <= summary["results"][0]["accuracy"] <= 1.0
    assert len(summary["fill_mask"]["The album was released in [MASK] ."]) == 5
    assert "| dense_transformer |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_demo_rejects_unknown_families(tmp_path, load_script, capsys):
    assert load_script("demo").main(["--output_dir", str(tmp_path), "--families", "nope", "--skip_mlm"]) == 2
    assert "unknown families" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_compares_every_family(tmp_path, load_script):
    demo = load_script("demo")
    assert demo.main(["--output_dir", str(tmp_path), "--skip_mlm", "--sst2_steps", "20"]) == 0
    summary = json.loads((tmp_path / "results.json").read_text())
    assert sorted(row["family"] for row in summary["results"]) == sorted(f.name for f in attnzoo.FAMILIES.values())
    assert all(row["error"] is None for row in summary["results"])

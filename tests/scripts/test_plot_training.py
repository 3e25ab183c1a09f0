"""`scripts/tools/plot_training.py`: redraws a run's curves and compares runs."""

from __future__ import annotations

import json

from attnzoo.training import plot_training_curves

HISTORY = [
    {"loss": 2.0, "learning_rate": 1e-3, "epoch": 0.1, "step": 1},
    {"loss": 1.5, "learning_rate": 5e-4, "epoch": 0.2, "step": 2},
    {"eval_loss": 1.4, "eval_accuracy": 0.6, "eval_runtime": 1.0, "epoch": 0.2, "step": 2},
    {"train_runtime": 3.0, "train_loss": 1.75, "total_flos": 1.0, "epoch": 0.2, "step": 2},
]


def test_plot_training_curves_writes_a_png(tmp_path):
    path = plot_training_curves(HISTORY, tmp_path / "curves.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_training_curves([{"train_runtime": 1.0, "step": 1}], tmp_path / "none.png") is None


def test_plot_training_script_reads_runs_and_checkpoints(tmp_path, load_script, capsys):
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "log_history.json").write_text(json.dumps(HISTORY))
    (run / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"log_history": HISTORY[:2]}))
    plot = load_script("tools/plot_training")
    assert plot.main([str(run)]) == 0 and (run / "training_curves.png").is_file()
    assert plot.main([str(run / "checkpoint-2"), "--output", str(tmp_path / "c.png")]) == 0
    assert plot.main([str(run), str(run / "checkpoint-2"), "--output", str(tmp_path / "both.png")]) == 0
    assert (tmp_path / "both.png").is_file()
    assert plot.main([str(tmp_path / "missing")]) == 2
    assert "No log_history.json" in capsys.readouterr().err

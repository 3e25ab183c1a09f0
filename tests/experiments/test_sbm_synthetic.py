"""Fast checks of `scripts/experiments/sbm-synthetic/run.py` (the paper's §5.1 task): labels, learning-rate
schedule, CLI and plots. The training runs themselves are slow tests (`tests/sbm/test_sbm_slow.py`)."""

from __future__ import annotations

import json

import pytest
import torch


def test_labels_mark_exactly_the_tokens_that_occur_twice_or_more(synthetic_script):
    ids, labels = synthetic_script.repeated_tokens_batch(8, 32, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (8, 32)
    assert ids.min() >= 1 and ids.max() <= 32
    for row, row_labels in zip(ids.tolist(), labels.tolist(), strict=True):
        assert row_labels == [int(row.count(token) > 1) for token in row]


@pytest.mark.parametrize("decay", ["none", "linear"])
def test_lr_factor_warms_up_linearly_then_stays_or_decays_to_zero(synthetic_script, decay):
    factor = [synthetic_script.lr_factor(step, 10, 4, decay) for step in range(11)]
    assert factor[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    if decay == "none":
        assert factor[4:] == [1.0] * 7
    else:
        assert factor[4:] == pytest.approx([1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0.0])


def test_cli_trains_both_families_records_the_setup_and_plots_seeds(synthetic_script, tmp_path):
    argv = ["--length", "16", "--batch", "4", "--steps", "4", "--log-every", "2", "--clusters", "8", "--seed", "3"]
    argv += ["--warmup", "2", "--decay", "linear", "--beta2", "0.98", "--ste-all-pairs", "--out-dir", str(tmp_path)]
    synthetic_script.main(argv)
    results = json.loads((tmp_path / "repeated_tokens_N16.json").read_text())
    setup = results["setup"]
    assert (setup["warmup"], setup["decay"], setup["beta2"], setup["seed"]) == (2, "linear", 0.98, 3)
    assert setup["sbm_overrides"] == {"ste_variant": "paper", "ste_all_pairs": True}
    for family in ("dense", "sbm"):
        log = results["runs"][family]["log"]
        assert [entry["step"] for entry in log] == [2, 4]
        assert all(0.0 <= entry["eval_accuracy"] <= 1.0 for entry in log)
    assert all(0.0 < entry["train_density"] <= 1.0 for entry in results["runs"]["sbm"]["log"])
    assert 0.0 < results["runs"]["sbm"]["initial_density"] < 1.0
    assert results["runs"]["dense"]["initial_density"] == 1.0
    assert (tmp_path / "repeated_tokens_N16.png").stat().st_size > 0

    synthetic_script.main(["--compare", str(tmp_path / "repeated_tokens_N16.json"), "--out-dir", str(tmp_path)])
    assert (tmp_path / "seeds.png").stat().st_size > 0


def test_param_groups_give_the_graph_parameters_their_own_learning_rate(synthetic_script):
    model = synthetic_script.build_model("sbm", 16, 32, 8, 0.1, True, {})
    rest, graph = synthetic_script.param_groups(model, 1e-3, 0.3)
    attention = model.encoder.encoder.layers[0].attention
    expected = {id(attention.clusters)} | {id(p) for p in attention.membership_mlp.parameters()}
    assert {id(p) for p in graph["params"]} == expected and graph["lr"] == pytest.approx(3e-4)
    assert rest["lr"] == 1e-3 and len(rest["params"]) + len(graph["params"]) == len(list(model.parameters()))
    dense = synthetic_script.build_model("dense", 16, 32, 8, 0.1, True, {})
    assert synthetic_script.param_groups(dense, 1e-3, 0.3)[1]["params"] == []


def test_compare_names_a_result_file_without_an_sbm_run(synthetic_script, tmp_path):
    dense_only = tmp_path / "dense.json"
    dense_only.write_text(json.dumps({"setup": {"seed": 0}, "runs": {"dense": {"log": []}}}))
    with pytest.raises(SystemExit, match="dense.json: no SBM run"):
        synthetic_script.main(["--compare", str(dense_only), "--out-dir", str(tmp_path)])

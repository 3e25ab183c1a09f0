"""`scripts/run_long_eval.py`: its rows, and (slow) end to end on IMDB and ListOps for all six families (a tiny
budget)."""

from __future__ import annotations

import json

import pytest

from attnzoo.registry import FAMILIES
from source_checkout import load_script


def test_families_flag_picks_the_rows():
    script = load_script("run_long_eval")
    variant = ["--variant", "fsat:feature_map=dsconv"]
    labels = [row.spec(64).key for row in script.table_rows(script.parse_args(["--output_dir", "x", *variant]))]
    assert labels == [f"{name}@64" for name in sorted(FAMILIES)] + ["fsat [feature_map=dsconv]@64"]
    only_variant = script.parse_args(["--output_dir", "x", "--families", *variant])
    assert [row.spec(64).key for row in script.table_rows(only_variant)] == ["fsat [feature_map=dsconv]@64"]
    named = script.parse_args(["--output_dir", "x", "--families", "sbm", "a2former"])
    assert [row.model_type for row in script.table_rows(named)] == ["sbm", "a2former"]


@pytest.mark.slow
def test_run_long_eval_runs_imdb_and_listops_for_every_family(tmp_path):
    script = load_script("run_long_eval")
    argv = [
        "--output_dir", str(tmp_path), "--tasks", "imdb", "listops", "--imdb_lengths", "256",
        "--imdb_dense_lengths", "128", "--listops_lengths", "2048", "--steps", "2", "--batch_size", "2",
        "--warmup_steps", "1", "--validation_size", "8", "--hidden_size", "16", "--num_attention_heads", "2",
        "--intermediate_size", "32", "--variant", "fsat:num_global_tokens=0",
    ]  # fmt: skip
    script.main(argv)
    results = json.loads((tmp_path / "long_eval.json").read_text())
    done = {(r["task"], r["label"], r["length"]) for r in results["runs"]}
    for model_type in FAMILIES:
        assert ("imdb", model_type, 256) in done and ("listops", model_type, 2048) in done
    assert ("imdb", "dense_transformer", 128) in done
    assert ("listops", "fsat [num_global_tokens=0]", 2048) in done
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["train_tokens_per_second"] > 0 for r in results["runs"])
    assert results["task_info"]["imdb"]["256"]["validation_examples"] == 8
    assert (tmp_path / "long_eval.md").read_text().count("| fsat |") == 2
    assert (tmp_path / "long_eval.png").is_file()

"""`scripts/demo.py`: one table and one figure of speed, memory, attention patterns and long-document accuracy."""

from __future__ import annotations

import json

import pytest

import attnzoo

pytest.importorskip("matplotlib")


def run_tiny(demo, output_dir, families: str) -> dict:
    assert demo.main(["--tiny", "--output_dir", str(output_dir), "--families", families]) == 0
    return json.loads((output_dir / "results.json").read_text())


def table_rows(markdown: str) -> list[str]:
    """First cells of the table's body rows."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [line.split("|")[1].strip() for line in lines[1:]]


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_tiny_run_writes_one_table_and_one_figure_with_a_row_per_family(tmp_path, load_script, capsys):
    record = run_tiny(load_script("demo"), tmp_path, "sparse_transformer,dense_transformer")
    printed = capsys.readouterr().out

    markdown = (tmp_path / "results.md").read_text()
    # One row per family asked, dense first: the reference of every ratio and of the accuracy.
    assert table_rows(markdown) == ["dense_transformer", "sparse_transformer"]
    assert markdown.splitlines()[2] in printed  # the table is printed too
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # 1. speed and memory come from the project's benchmark: a fwd+bwd ratio at every length, memory at the longest
    results = {(r["model"], r["length"]): r for r in record["benchmark"]["results"]}
    assert set(results) == {(name, n) for name in ("dense_transformer", "sparse_transformer") for n in (64, 128)}
    assert all(r["status"] == "ok" and r["fwd_bwd"]["ratio"] > 0 for r in results.values())
    assert results["sparse_transformer", 128]["memory"]["fwd_bwd_ratio"] > 0
    # 2. the sparse pattern reads fewer keys than dense, which reads them all
    assert record["keys_per_query"]["dense_transformer"] == record["pattern_length"]
    assert record["keys_per_query"]["sparse_transformer"] < record["pattern_length"]
    # 3. dense truncated, every other family reading more of each review, all scored on the same held-out reviews
    runs = [(r["model_type"], r["length"]) for r in record["imdb"]["records"]]
    assert runs == [("dense_transformer", 32), ("sparse_transformer", 64)]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in record["imdb"]["records"])
    # progress counts the real work: 2 runs of 2 steps
    assert "[2/2] sparse_transformer" in printed and "[3/2]" not in printed
    assert "step 2/2" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--families", "dense_transformer,nope"], "unknown family 'nope'"),
        (["--lengths", "512,0"], "--lengths must be integers >= 8"),
        (["--imdb_length", "512", "--imdb_dense_length", "512"], "must be >= 3 and below --imdb_length"),
    ],
)
def test_bad_arguments_exit_with_status_2_and_say_why(argv, message, tmp_path, load_script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script("demo").main([*argv, "--output_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results.md").exists()  # rejected before any work


def test_the_accuracy_text_claims_a_difference_only_beyond_the_interval(load_script):
    demo = load_script("demo")

    def imdb(*accuracies: float) -> dict:
        records = [{"model_type": "dense_transformer", "length": 512, "accuracy": accuracies[0]}]  # the reference
        records += [{"model_type": f"f{i}", "length": 2048, "accuracy": a} for i, a in enumerate(accuracies[1:])]
        return {"validation_reviews": 250, "majority_class_accuracy": 0.52, "records": records}

    # 250 reviews: the difference of two accuracies near 0.6 has a 95% interval of about +-8.6 points
    assert "does not separate them" in demo.accuracy_summary(imdb(0.60, 0.65, 0.55))
    text = demo.accuracy_summary(imdb(0.60, 0.75, 0.62))
    assert "f0 (+15.0 points)" in text and "f1" not in text
    failed = imdb(0.60)
    failed["records"].append({"model_type": "f0", "length": 2048, "error": "RuntimeError: boom"})
    assert "does not separate them" in demo.accuracy_summary(failed)  # a failed run claims nothing


@pytest.mark.slow
def test_every_family_runs_through_the_demo(tmp_path, load_script):
    record = run_tiny(load_script("demo"), tmp_path, ",".join(f.name for f in attnzoo.FAMILIES.values()))
    families = sorted(f.name for f in attnzoo.FAMILIES.values())
    assert sorted(r["model_type"] for r in record["imdb"]["records"]) == families
    assert all("error" not in r for r in record["imdb"]["records"])
    assert sorted({r["model"] for r in record["benchmark"]["results"] if r["status"] == "ok"}) == families

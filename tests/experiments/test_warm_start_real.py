"""`scripts/experiments/warm-start-real/`: the recipe from a headless BERT end to end (convert, continue, fine-tune,
summarize) with its recipe files, the study's job plan, runner, baselines and tables, and its GPU command at toy size.

The source is a tiny `BertModel` (no masked-LM head, like all-MiniLM-L6-v2) built here; the ECTSum-format calls are
made up here from the bundled WikiText (the shared ECTSum copy stays out of the repository).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel, TrainingArguments

from attnzoo.conversion import convert_checkpoint
from attnzoo.training import ClassificationDataArguments, MLMDataArguments, ModelArguments, parse_arguments
from source_checkout import FIXTURES, REPO_ROOT

STUDY = "experiments/warm-start-real"
SOURCE_POSITIONS = 64
LONG = 128


@pytest.fixture(scope="module")
def study(load_script):
    return load_script(f"{STUDY}/run")


@pytest.fixture(scope="module")
def headless_bert(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny `BertModel` (with pooler, without masked-LM head) and its tokenizer, saved by transformers."""
    folder = tmp_path_factory.mktemp("headless-bert")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=SOURCE_POSITIONS,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _sentences() -> list[str]:
    lines = (FIXTURES / "text" / "wikitext_train.txt").read_text(encoding="utf-8").splitlines()
    return [part.strip() + " ." for line in lines if len(line) > 80 for part in line.split(" . ") if part.strip()]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, Path]:
    """ECTSum-format calls (figures in the transcripts, the reference bullets repeating some), WikiText, reviews."""
    folder = tmp_path_factory.mktemp("data")
    sentences, generator = _sentences(), random.Random(0)
    (folder / "ectsum").mkdir()
    for split, calls in (("train", 8), ("validation", 3)):
        with gzip.open(folder / "ectsum" / f"{split}.jsonl.gz", "wt", encoding="utf-8") as handle:
            for number in range(calls):
                figures = [f"${generator.randint(1, 99)}.{generator.randint(10, 99)}" for _ in range(3)]
                text = generator.sample(sentences, 30) + [f"Revenue was {f} billion ." for f in figures]
                summary = [f"q{number % 4 + 1} revenue {figures[0]} billion.", f"sees eps {figures[1]}."]
                record = {"id": f"T{number}{split[0].upper()}_q{number % 4 + 1}_2021", "text": "\n".join(text)}
                handle.write(json.dumps({**record, "summary": "\n".join(summary)}) + "\n")
    return {
        "ectsum": folder / "ectsum",
        "wikitext": FIXTURES / "text" / "wikitext_train.txt",
        "reviews": FIXTURES / "imdb" / "train.tsv",
    }


def _study(study_module, source: Path, data: dict[str, Path], tmp_path: Path, **changes):
    import dataclasses

    profile = dataclasses.replace(study_module.PROFILES["toy"], families=("sparse_transformer",), **changes)
    return study_module.Study(str(source), profile, tmp_path / "work", tmp_path / "results", "cpu", **data)


QUIET = [
    "--use_cpu",
    "--disable_tqdm",
    "true",
    "--log_level",
    "warning",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
]


def test_the_recipe_runs_end_to_end_from_a_headless_bert(tmp_path, load_script, study, headless_bert, data_files):
    """Step 1 converts (a fresh tied head), step 2 continues with the MLM recipe and its held-back loss falls, step 3
    fine-tunes with the IMDB and ECTSum recipes (BERT2BERT from the same source)."""
    run = _study(study, headless_bert, data_files, tmp_path)
    data = study.step_data(run)
    assert data["ectsum"] == {"train": 8, "validation": 3}
    assert data["imdb"]["validation"] == 4 and data["imdb"]["train"] == 313 - 4
    work = tmp_path / "work"
    report = convert_checkpoint(str(headless_bert), "sparse_transformer", LONG, work / "converted")
    assert report.target_class == "SparseTransformerForMaskedLM"

    mlm = load_script("run_mlm").main(
        [
            str(REPO_ROOT / study.MLM_RECIPE),
            "--model_name_or_path", str(work / "converted"),
            "--train_file", str(work / "data" / "mlm_train.jsonl"),
            "--validation_file", str(work / "data" / "mlm_validation.jsonl"),
            "--max_seq_length", str(LONG),
            "--per_device_train_batch_size", "4",
            "--gradient_accumulation_steps", "1",
            "--max_steps", "30",
            "--learning_rate", "2e-3",
            "--warmup_steps", "3",
            "--max_eval_samples", "4",
            "--eval_steps", "30",
            "--output_dir", str(work / "mlm"),
            *QUIET,
        ]
    )  # fmt: skip
    history = json.loads((work / "mlm" / "log_history.json").read_text())
    losses = [row["eval_loss"] for row in history if "eval_loss" in row]
    assert mlm["global_step"] == 30 and len(losses) >= 2
    assert losses[-1] < losses[0] - 0.15  # the converted model with its fresh head learns the held-back text (-0.24)

    imdb = load_script("run_glue").main(
        [
            str(REPO_ROOT / study.IMDB_RECIPE),
            "--model_name_or_path", str(work / "mlm"),
            "--train_file", str(work / "data" / "imdb_train.jsonl"),
            "--validation_file", str(work / "data" / "imdb_validation.jsonl"),
            "--max_seq_length", str(LONG),
            "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2",
            "--max_steps", "2",
            "--output_dir", str(work / "imdb"),
            *QUIET,
        ]
    )  # fmt: skip
    # The whole encoder comes from step 2, and BERT's pooler (the conversion's `classifier.dense`) came through it:
    # step 2 carried it, though its masked-LM model has no place for it. Only the output layer is new.
    assert mlm["model"]["carried_keys"] == ["classifier.dense.bias", "classifier.dense.weight"]
    assert imdb["model"]["missing_keys"] == ["classifier.out_proj.bias", "classifier.out_proj.weight"]
    assert 0.0 <= imdb["metrics"]["eval_accuracy"] <= 1.0 and imdb["data"]["validation_truncated"] >= 0

    summary = load_script("run_summarization").main(
        [
            str(REPO_ROOT / study.ECTSUM_RECIPE),
            "--model_name_or_path", str(headless_bert),
            "--family", "sparse_transformer",
            "--max_position_embeddings", str(LONG),
            "--max_source_length", str(LONG),
            "--max_target_length", "16",
            "--generation_max_new_tokens", "8",
            "--train_file", str(work / "data" / "ectsum_train.jsonl"),
            "--validation_file", str(work / "data" / "ectsum_validation.jsonl"),
            "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "1",
            "--per_device_eval_batch_size", "3",
            "--max_steps", "1",
            "--output_dir", str(work / "ectsum"),
            *QUIET,
        ]
    )  # fmt: skip
    assert summary["data"]["train_source_truncated"] == 8  # every made-up transcript is longer than 128 tokens
    predictions = (work / "ectsum" / "generated_predictions.txt").read_text().splitlines()
    assert len(predictions) == 3
    converted = json.loads((work / "ectsum" / "converted" / "conversion_report.json").read_text())
    assert converted["seq2seq"] and any(".cross_attn." in row["name"] for row in converted["new"])


@pytest.mark.parametrize("recipe", ["MLM_RECIPE", "IMDB_RECIPE", "ECTSUM_RECIPE"])
def test_recipes_parse_and_read_the_long_length(study, recipe):
    from transformers import Seq2SeqTrainingArguments

    from attnzoo.training import SummarizationDataArguments

    data_class, training_class = {
        "MLM_RECIPE": (MLMDataArguments, TrainingArguments),
        "IMDB_RECIPE": (ClassificationDataArguments, TrainingArguments),
        "ECTSUM_RECIPE": (SummarizationDataArguments, Seq2SeqTrainingArguments),
    }[recipe]
    model_args, data_args, training_args = parse_arguments(
        (ModelArguments, data_class, training_class), [str(REPO_ROOT / getattr(study, recipe))]
    )
    length = {"MLM_RECIPE": "max_seq_length", "IMDB_RECIPE": "max_seq_length", "ECTSUM_RECIPE": "max_source_length"}
    assert getattr(data_args, length[recipe]) == (2048 if recipe == "IMDB_RECIPE" else 4096)
    if recipe == "MLM_RECIPE":  # Longformer's schedule: warm-up, then a power-3 polynomial decay
        assert training_args.eval_on_start and training_args.lr_scheduler_kwargs == {"power": 3.0}
        assert training_args.learning_rate == 3e-5 and training_args.warmup_steps == 500
    if recipe == "ECTSUM_RECIPE":
        assert model_args.family is not None and model_args.max_position_embeddings == 4096
        assert training_args.predict_with_generate


def test_the_gpu_plan_holds_every_row_cheapest_families_first(study, monkeypatch):
    run = study.Study(
        "minilm", study.PROFILES["gpu"], Path("work"), Path("results"), "cuda", Path("e"), Path("w"), Path("r")
    )
    monkeypatch.setattr(study.Study, "short", 512)
    jobs = study.planned_jobs(run)
    names = [job.name for job in jobs]
    assert len(names) == len(set(names)) == 7 + 7 + 21 * 3 + 7  # conversions, MLM, IMDB rows x seeds, ECTSum
    assert all(name.startswith("convert-") for name in names[:7])
    assert names.index("imdb-dense_transformer-warm-seed0") < names.index("imdb-smart_bird-warm-seed0")
    assert names.index("imdb-smart_bird-scratch-seed0") < names.index("imdb-dense_transformer-warm-seed1")
    by_name = {job.name: job for job in jobs}
    assert by_name["imdb-fsat-warm-mlm-seed2"].needs == ("mlm-fsat-4096",)
    assert by_name["mlm-fsat-4096"].needs == ("convert-fsat-4096",)
    assert "--bf16" in by_name["ectsum-dense_transformer-512"].command
    # MiniLM at its length pooled as the long rows are (the mean), beside BERT's first token.
    mean_row = by_name["imdb-dense_transformer-512-warm-mean-pooling-seed0"].command
    assert mean_row[mean_row.index("--config_overrides") + 1] == "classifier_pooling=mean"
    assert "--config_overrides" not in by_name["imdb-dense_transformer-512-warm-seed0"].command
    source_row = by_name["imdb-source-seed1"].command
    assert source_row[source_row.index("--model_name_or_path") + 1] == "minilm"
    assert source_row[source_row.index("--max_seq_length") + 1] == "512"
    # The dense row at the source's length continues on as many tokens per step as the long rows.
    dense_mlm = by_name["mlm-dense_transformer-512"].command
    assert dense_mlm[dense_mlm.index("--per_device_train_batch_size") + 1] == "16"
    # Every command is one its program accepts (the recipe first, then the flags).
    from transformers import Seq2SeqTrainingArguments

    from attnzoo.training import SummarizationDataArguments

    programs = {
        "scripts/run_mlm.py": (ModelArguments, MLMDataArguments, TrainingArguments),
        "scripts/run_glue.py": (ModelArguments, ClassificationDataArguments, TrainingArguments),
        "scripts/run_summarization.py": (ModelArguments, SummarizationDataArguments, Seq2SeqTrainingArguments),
    }
    names = ("mlm-sbm-4096", "imdb-a2former-scratch-seed0", "imdb-source-seed2", "ectsum-fsat-4096")
    for name in (*names, "imdb-dense_transformer-512-warm-mean-pooling-seed1"):
        program, recipe, *flags = by_name[name].command
        assert "--bf16" in flags
        on_this_cpu = ["--use_cpu" if flag == "--bf16" else flag for flag in flags]  # bf16 needs the GPU to parse
        parsed = parse_arguments(programs[program], [str(REPO_ROOT / recipe), *on_this_cpu])
        assert parsed[-1].include_num_input_tokens_seen in ("all", True)
        if "scratch" in name:  # the recipe's checkpoint is unset: a fresh model of the converted architecture
            assert parsed[0].model_name_or_path is None and parsed[0].config_path == "work/converted/a2former-4096"


def test_the_second_gpu_call_trains_the_ectsum_rows_alone_for_several_epochs(study, monkeypatch):
    import dataclasses

    from transformers import Seq2SeqTrainingArguments

    from attnzoo.training import SummarizationDataArguments

    profile = study.PROFILES["gpu-ectsum"]
    run = study.Study("minilm", profile, Path("work"), Path("results"), "cuda", Path("e"), Path("w"), Path("r"))
    monkeypatch.setattr(study.Study, "short", 512)
    jobs = study.planned_jobs(run)
    rows = [f"ectsum-{family}-4096" for family in study.COST_ORDER] + ["ectsum-dense_transformer-512"]
    assert sorted(job.name for job in jobs) == sorted(rows)
    assert profile.parallel >= len(jobs)  # all side by side
    # Five epochs of the 1,681 training calls at 8 a step, each row stopping its training 230 s before the deadline.
    epochs = profile.summarize_steps * profile.summarize_batch * profile.summarize_accumulation / 1681
    assert 4.9 < epochs < 5.1
    programs = (ModelArguments, SummarizationDataArguments, Seq2SeqTrainingArguments)
    for job in jobs:
        program, recipe, *flags = job.command
        on_this_cpu = ["--use_cpu" if flag == "--bf16" else flag for flag in flags]
        _, data, training = parse_arguments(programs, [str(REPO_ROOT / recipe), *on_this_cpu])
        assert (data.max_train_seconds, training.max_steps) == (220.0, profile.summarize_steps)
    # A shorter deadline (`gpu.sh`'s SECONDS_LIMIT) shortens the training, and one too short for any is refused.
    assert dataclasses.replace(profile, deadline=330).summarize_time_limit() == 100
    with pytest.raises(ValueError, match="A deadline of 200 s leaves no training time after the 230 s"):
        dataclasses.replace(profile, deadline=200).summarize_time_limit()
    assert study.PROFILES["gpu"].summarize_time_limit() is None
    # A profile naming a step the study does not have cannot be planned.
    broken = study.Study(
        "minilm", dataclasses.replace(profile, steps=("summarise",)), Path("w"), Path("r"), "cuda", *[Path("x")] * 3
    )
    with pytest.raises(ValueError, match=r"unknown step\(s\) \['summarise'\]"):
        study.planned_jobs(broken)


def test_all_runs_and_records_only_the_profiles_steps(study, tmp_path, headless_bert, data_files, monkeypatch):
    run = _study(study, headless_bert, data_files, tmp_path, steps=("summarize",))
    for step in study.JOBS:  # each step's programs stand-ins that leave a file named after the step
        job = study.Job(f"{step}-job", ["-c", f"open({str(tmp_path / step)!r}, 'w')"])
        monkeypatch.setitem(study.JOBS, step, lambda _, job=job: [job])
        monkeypatch.setitem(study.COLLECT, step, lambda _, records: {"jobs": sorted(records)})
    summary = study.run_all(run)
    assert {name: record["status"] for name, record in summary["jobs"].items()} == {"summarize-job": "done"}
    assert [step for step in study.JOBS if (tmp_path / step).exists()] == ["summarize"]
    records = sorted(path.name for path in (tmp_path / "results").glob("*.json"))
    assert records == ["all.json", "data.json", "summarize.json"]
    assert (tmp_path / "results" / "README.md").is_file()
    # A profile it cannot plan is refused before the data step writes anything.
    broken = _study(study, headless_bert, data_files, tmp_path / "broken", steps=("summarise",))
    with pytest.raises(ValueError, match="unknown step"):
        study.run_all(broken)
    assert not (tmp_path / "broken").exists()


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_runner_keeps_priority_and_needs_and_stops_at_the_deadline(load_script, tmp_path):
    schedule = load_script(f"{STUDY}/schedule")

    def job(name: str, code: str, needs: tuple[str, ...] = ()):
        return schedule.Job(name, ["-c", f"import time, sys; {code}"], needs=needs)

    jobs = [
        job("fails", "sys.exit(3)"),
        job("after-failure", "pass", needs=("fails",)),
        job("long", "time.sleep(60)"),
        job("after-long", "pass", needs=("long",)),
        job("quick", "print('hi')"),
    ]
    begin = time.time()
    records = schedule.run_jobs(jobs, tmp_path, tmp_path / "logs", sys.executable, dict(os.environ), 2, begin + 8)
    assert time.time() - begin < 40
    statuses = {name: record["status"] for name, record in records.items()}
    assert statuses == {
        "fails": "failed",
        "after-failure": "skipped",
        "long": "unfinished",
        "after-long": "not started",
        "quick": "done",
    }
    assert (tmp_path / "logs" / "quick.log").read_text().strip() == "hi"
    with pytest.raises(ValueError, match="needs unknown job"):
        schedule.run_jobs([job("a", "pass", needs=("b",))], tmp_path, tmp_path / "logs", sys.executable, {}, 1)


def test_a_step_runs_alone_after_the_steps_it_needs(study, tmp_path, data_files):
    """`run.py classify` after `run.py convert` and `run.py mlm`, each its own command: the jobs of earlier steps are
    not in the step's batch, and their outputs are reused rather than required again."""
    run = _study(study, tmp_path / "source", data_files, tmp_path)

    def job(name: str, needs: tuple[str, ...] = ()):
        return study.Job(name, ["-c", f"open({str(tmp_path / name)!r}, 'w')"], needs=needs)

    records = run.run([job("imdb-a", needs=("convert-a", "mlm-a")), job("imdb-b", needs=("imdb-a",))])
    ran = sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("imdb"))
    assert {name: record["status"] for name, record in records.items()} == {"imdb-a": "done", "imdb-b": "done"}
    assert ran == ["imdb-a", "imdb-b"]


def test_lead_and_oracle(load_script):
    baselines = load_script(f"{STUDY}/baselines")
    sentences = ["Welcome to the call.", "Revenue rose 5% to $2 billion.", "Thanks all.", "EPS was $1.01."]
    reference = "revenue rose 5% to $2 billion\neps $1.01"
    assert baselines.greedy_oracle(sentences, reference) == [1, 3]
    assert baselines.oracle_summary(sentences, reference) == "Revenue rose 5% to $2 billion.\nEPS was $1.01."
    assert baselines.lead(sentences, 2) == "Welcome to the call.\nRevenue rose 5% to $2 billion."
    documents = [["Hello there.", "Sales grew 3%.", "Bye."], ["Hi.", "Costs fell 2%.", "Later."]]
    k, scores = baselines.choose_lead_length(documents, ["sales grew 3%", "costs fell 2%"], candidates=(1, 2, 3))
    assert k == 2 and scores[2] > scores[1]  # the second sentence carries the bigrams; a third only dilutes them
    with pytest.raises(ValueError, match="at least one sentence"):
        baselines.lead(sentences, 0)


def test_data_files_keep_records_whose_text_holds_other_line_breaks(study, tmp_path):
    """A review with U+2028, U+0085 or a form feed (IMDB has them) is one record: `str.splitlines` would cut it."""
    rows = [{"text": "first\u2028second\x85third\x0cfourth\r\nfifth", "label": 1}, {"text": "plain", "label": 0}]
    study.write_jsonl(tmp_path / "rows.jsonl", rows)
    assert study.read_jsonl(tmp_path / "rows.jsonl") == rows


def test_baselines_step_scores_every_validation_call_without_a_model(study, tmp_path, data_files, capsys):
    """`run.py baselines`: the lead and the oracle on all validation calls (the toy profile scores 2 of the 3 in step
    3b), in the record and the tables; the oracle, picking the transcript's figure sentences, reproduces more figures
    than the lead."""
    study.step_data(_study(study, Path("unused"), data_files, tmp_path))
    work, results = tmp_path / "work", tmp_path / "results"
    study.main(["baselines", "--profile", "toy", "--work", str(work), "--results", str(results)])
    record = json.loads((results / "baselines.json").read_text())
    assert record["validation_calls"] == 3 and record["ran_on"]["profile"] == "toy"
    lead, oracle = record["lead"], record["oracle"]["scores"]
    tried = lead["train_rouge2_by_sentences"]  # chosen on the training calls: the best of the lengths tried
    assert tried[str(lead["sentences"])] == max(tried.values())
    assert oracle["rouge2"] > lead["scores"]["rouge2"]
    assert oracle["numbers_reproduced"] > lead["scores"]["numbers_reproduced"]
    study.main(["table", "--profile", "toy", "--results", str(results)])
    table = (results / "README.md").read_text()
    assert "## Step 3b's reference points (no model)" in table and "3 calls scored" in table
    assert f"| lead-{lead['sentences']} (first sentences" in table and "| extractive oracle (upper bound) |" in table
    capsys.readouterr()


def test_the_summarization_pilot_tunes_on_held_back_training_calls(
    load_script, study, headless_bert, data_files, tmp_path
):
    """`summarize_pilot.py`: each learning rate trains on the training calls but the last ones, and is scored on
    those before its first step and as it trains; the validation calls are never read."""
    pilot = load_script(f"{STUDY}/summarize_pilot")
    study.step_data(_study(study, headless_bert, data_files, tmp_path))
    work, results = tmp_path / "work", tmp_path / "results"
    (work / "data" / "ectsum_validation.jsonl").unlink()  # a pilot that read it would fail
    args = ["--profile", "toy", "--source", str(headless_bert), "--work", str(work), "--results", str(results)]
    variants = ["--config-overrides", "copy_from_source=false", "copy_from_source=true"]
    record = pilot.main(
        [*args, "--learning-rates", "1e-4", "1e-3", "--steps", "2", "--eval-every", "1", "--hold-out", "2", *variants]
    )

    train = study.read_jsonl(work / "pilot" / "data" / "train.jsonl")
    tune = study.read_jsonl(work / "pilot" / "data" / "tune.jsonl")
    assert (len(train), len(tune)) == (8 - 2, 2) and not {c["id"] for c in train} & {c["id"] for c in tune}
    assert json.loads((results / "summarize_pilot.json").read_text()) == record
    names = {f"pilot-lr{rate}-copy_from_source-{copy}" for rate in ("0.0001", "0.001") for copy in ("false", "true")}
    copying = {name for name in names if name.endswith("true")}
    assert record["held_back_calls"] == 2 and set(record["rows"]) == names
    for name, row in record["rows"].items():
        output = Path(row["command"].split("--output_dir ")[1].split()[0])
        config = json.loads((output / "config.json").read_text())
        assert config["copy_from_source"] == (name in copying), name
        assert row["status"] == "done", row
        assert [point["step"] for point in row["curve"]] == [0, 1, 2]
        assert all(point["loss"] > 0 and 0 <= point["rouge2"] <= 100 for point in row["curve"])
        assert {"rouge2", "numbers_reproduced", "distinct_2grams"} <= set(row["final"]) and row[
            "different_summaries"
        ] >= 1
    with pytest.raises(ValueError, match="--hold-out must be between 1 and 7"):
        pilot.main([*args, "--hold-out", "8"])  # every training call held back: nothing left to train on

    # `decoding_pilot.py`: the trained runs write the held-back calls' summaries again, once per decoding setting.
    decoding = load_script(f"{STUDY}/decoding_pilot")
    runs = [Path(row["command"].split("--output_dir ")[1].split()[0]) for row in record["rows"].values()][:2]
    sizes = ["--no-repeat-ngram-sizes", "0", "2"]
    decoded = decoding.main([*args, "--runs", *map(str, runs), *sizes, "--baseline-size", "2"])
    assert json.loads((results / "decoding_pilot.json").read_text()) == json.loads(json.dumps(decoded))
    assert decoded["held_back_calls"] == 2 and len(decoded["rows"]) == 4
    # Each run's other setting against the baseline setting, call by call: every call has a ROUGE-2, so the mean of
    # the per-call differences is the difference of the two rows' ROUGE-2.
    assert decoded["baseline_size"] == 2 and set(decoded["paired"]) == {run.name for run in runs}
    assert decoded["oracle"]["scores"]["rouge2"] >= decoded["lead"]["scores"]["rouge2"]
    for run, comparison in decoded["paired"].items():
        ((name, row),) = comparison.items()
        rows = decoded["rows"]
        expected = rows[name]["scores"]["rouge2"] - rows[f"decode-{run}-norepeat2"]["scores"]["rouge2"]
        assert row["rouge2"]["mean"] == pytest.approx(expected, abs=1e-9) and row["rouge2"]["calls"] == 2
        assert row["numbers_reproduced"]["calls"] == 2  # both made-up references state figures
    with pytest.raises(SystemExit):  # the recipe's size (3) is not among those run: nothing to compare with
        decoding.main([*args, "--runs", *map(str, runs), *sizes])
    for name, row in decoded["rows"].items():
        assert row["status"] == "done", row
        assert {"rouge2", "numbers_reproduced", "distinct_2grams"} <= set(row["scores"])
        output = Path(row["command"].split("--output_dir ")[1].split()[0])
        assert "train_loss" not in json.loads((output / "metrics.json").read_text())["metrics"]  # generation only
        if name.endswith("norepeat2"):  # no token bigram twice, so no word bigram twice either
            for summary in (output / "generated_predictions.txt").read_text().splitlines():
                words = summary.split()
                assert len(set(zip(words, words[1:], strict=False))) == len(words) - 1, summary
    with pytest.raises(SystemExit):
        decoding.main([*args, "--runs", str(tmp_path)])  # not a trained run


def test_the_classification_pilot_tunes_the_head_rate_on_held_back_training_reviews(
    load_script, study, headless_bert, data_files, tmp_path
):
    """`classify_pilot.py`: each row trains on the training reviews but the last ones, once per head learning rate,
    is scored on those, and is compared with its first setting review by review; the validation reviews are never
    read."""
    pilot = load_script(f"{STUDY}/classify_pilot")
    toy = _study(study, headless_bert, data_files, tmp_path)
    study.step_data(toy)
    work, results = tmp_path / "work", tmp_path / "results"
    (work / "data" / "imdb_validation.jsonl").unlink()  # a pilot that read it would fail
    convert_checkpoint(str(headless_bert), "sparse_transformer", LONG, toy.converted("sparse_transformer", LONG))
    args = ["--profile", "toy", "--source", str(headless_bert), "--work", str(work), "--results", str(results)]
    rows = ["--rows", "sparse_transformer warm", "source"]
    record = pilot.main([*args, *rows, "--head-learning-rates", "none", "1e-2", "--hold-out", "4"])

    train = study.read_jsonl(work / "pilot" / "data" / "imdb_train.jsonl")
    tune = study.read_jsonl(work / "pilot" / "data" / "imdb_tune.jsonl")
    every = study.read_jsonl(work / "data" / "imdb_train.jsonl")
    assert len(tune) == 4 and train + tune == every
    assert json.loads((results / "classify_pilot.json").read_text()) == json.loads(json.dumps(record))
    assert record["held_back_reviews"] == 4 and set(record["rows"]) == {"sparse_transformer warm", "source"}
    # The new head: the zoo keeps BERT's pooler (classifier.dense), transformers' BERT keeps it in its base model.
    heads = {"sparse_transformer warm": ["classifier.out_proj.weight", "classifier.out_proj.bias"],
             "source": ["classifier.weight", "classifier.bias"]}  # fmt: skip
    for label, row in record["rows"].items():
        runs = row["runs"]
        assert runs["none"]["head_parameters"] is None and runs["1e-2"]["head_parameters"] == heads[label]
        assert all(run["status"] == "done" and 0 <= run["accuracy"] <= 1 for run in runs.values())
        paired = row["versus_none"]["1e-2"]
        difference = 100 * (runs["1e-2"]["accuracy"] - runs["none"]["accuracy"])
        assert paired["accuracy_difference"] == pytest.approx(difference)
        assert paired["only_this_right"] - paired["only_first_right"] == round(difference * 4 / 100)
    with pytest.raises(ValueError, match="No IMDB row"):
        pilot.main([*args, "--rows", "sparse_transformer hot"])
    with pytest.raises(ValueError, match="does not exist"):
        pilot.main([*args, "--rows", "sparse_transformer warm+mlm"])  # step 2 never ran


def test_the_feature_probe_scores_each_feature_of_a_frozen_checkpoint(
    load_script, study, headless_bert, data_files, tmp_path
):
    """`feature_probe.py` on a converted toy checkpoint: each feature probed, its spread between reviews recorded."""
    probe = load_script(f"{STUDY}/feature_probe")
    study.step_data(_study(study, headless_bert, data_files, tmp_path))
    work, results = tmp_path / "work", tmp_path / "results"
    convert_checkpoint(str(headless_bert), "sparse_transformer", LONG, work / "converted")
    args = ["--work", str(work), "--checkpoints", "converted", "--train", "40", "--results", str(results)]
    record = probe.main(args)

    assert json.loads((results / "feature_probe.json").read_text()) == record
    assert (record["train_reviews"], record["held_back_reviews"]) == (40, 4) and "commit" in record["ran_on"]
    row = record["rows"]["converted"]
    assert set(row) == {"head", "cls", "mean"}
    for scores in row.values():
        assert 0 <= scores["accuracy"] <= 100 and 0 < scores["cv_accuracy"] <= 100
        assert scores["C"] > 0 and scores["spread"] > 0


def test_tables_show_unfinished_rows_by_status(load_script, tmp_path):
    tables = load_script(f"{STUDY}/tables")
    ran = {"commit": "abcdef0", "device": "NVIDIA H100", "profile": "gpu"}
    record = {"command": "python x", "status": "unfinished", "seconds": 400.0}
    (tmp_path / "mlm.json").write_text(json.dumps({"ran_on": ran, "smart_bird-4096": record}))
    scores = {"rouge1": 40.0, "rouge2": 20.0, "rougeL": 30.0, "numbers_reproduced": 55.5, "distinct_2grams": 12.0}
    summarize = {
        "ran_on": ran,
        "validation_calls": 249,
        "rows": {
            "sbm-4096": {"command": "python y", "status": "not started"},
            "fsat-4096": {"scores": scores, "different_summaries": 249, "steps_trained": 700, "time_limited": True},
        },
        "lead": {"sentences": 3, "scores": scores},
        "oracle": {"scores": scores},
    }
    (tmp_path / "summarize.json").write_text(json.dumps(summarize))
    text = tables.write_tables(tmp_path)
    assert "| smart_bird-4096 | – | unfinished |" in text
    assert "| sbm-4096 | not started |" in text
    assert "| fsat-4096 | 40.0 / 20.0 / 30.0 | 55.5 | 12.0 | 249 of 249 | 700 (time limit) | – | – |" in text
    assert (
        "| lead-3 (first sentences; how many chosen on the training calls) | 40.0 / 20.0 / 30.0 | 55.5 | 12.0 |"
        in text
    )
    assert (tmp_path / "README.md").read_text() == text


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 18 programs, each importing torch and transformers; 10 minutes on a free 2-core CPU
def test_gpu_command_runs_the_study_at_toy_size_on_the_cpu(tmp_path, load_script, headless_bert, data_files):
    """The GPU command itself (pack, receive, run) with the toy budget on the CPU, one sparse family."""
    pack = load_script(f"{STUDY}/device_pack")
    parts = pack.main(
        [
            "--source", str(headless_bert),
            "--ectsum", str(data_files["ectsum"]),
            "--wikitext", str(data_files["wikitext"]),
            "--output", str(tmp_path / "pack"),
            "--no-wheels",
            "--part-bytes", str(2**20),
        ]
    )  # fmt: skip
    assert len(parts) >= 2  # the 1 MiB parts force the several-call path
    env = {
        **os.environ,
        "STAGING": str(tmp_path / "staging"),
        "PROFILE": "toy",
        "DEVICE": "cpu",
        "FAMILIES": "sparse_transformer",
        "REVIEWS": str(data_files["reviews"]),
        "PYTHON": sys.executable,
        "SECONDS_LIMIT": "3000",  # this shared CPU is slow: the deadline is for the GPU
    }
    script = str(REPO_ROOT / "scripts" / "experiments" / "warm-start-real" / "gpu.sh")
    early = subprocess.run(
        ["bash", script, "run", str(parts[-1]), str(tmp_path / "out")], env=env, capture_output=True
    )
    assert early.returncode == 2 and b"chunks received" in early.stderr  # the other parts must come first
    for part in parts[:-1]:
        subprocess.run(["bash", script, "receive", str(part)], env=env, check=True)
    done = subprocess.run(["bash", script, "run", str(parts[-1]), str(tmp_path / "out")], env=env, text=True)
    assert done.returncode == 0
    results = tmp_path / "out" / "results"
    summary = json.loads((results / "all.json").read_text())
    assert {record["status"] for record in summary["jobs"].values()} == {"done"}
    classify = json.loads((results / "classify.json").read_text())
    assert set(classify["rows"]["sparse_transformer warm+mlm"]["accuracy"]) == {"0", "1"}
    summarize = json.loads((results / "summarize.json").read_text())
    assert "numbers_reproduced" in summarize["rows"]["sparse_transformer-128"]["scores"]
    assert summarize["oracle"]["scores"]["rouge2"] >= summarize["lead"]["scores"]["rouge2"]
    table = (results / "README.md").read_text()
    assert "| sparse_transformer-128 |" in table and "| source |" in table
    assert (tmp_path / "out" / "logs.tar.gz").is_file()

"""The long-input evaluation: tasks, one run, the grid with resume, and the reports."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import multiprocessing
import random

import pytest
import torch

from attnzoo.evaluation import (
    SCHEDULES,
    Budget,
    ModelSize,
    Row,
    RunSpec,
    TaskPlan,
    collate,
    imdb_task,
    listops_task,
    parse_variant,
    planned_runs,
    read_reviews,
    run_long_eval,
    split_reviews,
    text_task,
    train_and_evaluate,
)
from attnzoo.evaluation.report import load_results, markdown_report, results_lock, save_results
from attnzoo.evaluation.runner import GROUP_BATCHES, build_classifier, model_config, training_batches
from attnzoo.evaluation.tasks import (
    CLS_ID,
    FIRST_SYMBOL_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    Example,
    TaskData,
    epoch_stream,
    position_reach,
)
from attnzoo.registry import FAMILIES
from attnzoo.training.data.listops import ListOpsSettings
from attnzoo.training.data.mlm import bert_masking
from source_checkout import REVIEWS_FILE

# the module (the package exports a function of the same name)
long_eval_evaluate = importlib.import_module("attnzoo.evaluation.evaluate")
TINY = ModelSize(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)


def test_shipped_reviews_are_read_whole_with_their_quoting():
    reviews = read_reviews(REVIEWS_FILE)
    assert len(reviews) == 2500
    assert sorted({label for _, label in reviews}) == [0, 1]
    # The file is CSV-quoted: the field's quotes are removed and doubled inner quotes read as one.
    (quoted,) = [text for text, _ in reviews if text.startswith("A favourite of mine,this movie")]
    assert 'New York "characters", Steve Brodie' in quoted


def test_split_is_fixed_and_disjoint():
    reviews = [(f"review {i}", i % 2) for i in range(100)]
    train, validation = split_reviews(reviews, 20, seed=0)
    assert (train, validation) == split_reviews(reviews, 20, seed=0)
    assert len(validation) == 20 and len(train) == 80
    assert not {t for t, _ in train} & {t for t, _ in validation}
    with pytest.raises(ValueError, match="validation_size"):
        split_reviews(reviews, 100, seed=0)


def test_imdb_and_text_tasks_wrap_and_count_truncation(reviews_file):
    imdb = imdb_task(reviews_file, 64, validation_size=10, vocab_size=300)
    assert imdb.info["train_examples"] == 30 and imdb.info["validation_examples"] == 10
    for ids, label in imdb.validation:
        assert ids[0] == CLS_ID and ids[-1] == SEP_ID and len(ids) <= 64 and label in (0, 1)
    longest = max(len(t.split()) for t, _ in read_reviews(reviews_file))
    assert longest > 64 and imdb.info["train_truncated"] + imdb.info["validation_truncated"] > 0

    text = text_task(reviews_file, 10_000, validation_size=10)
    raw = {t.encode("utf-8") for t, _ in read_reviews(reviews_file)}
    for ids, _ in text.validation:
        assert bytes(i - FIRST_SYMBOL_ID for i in ids[1:-1]) in raw
    assert text.info["train_truncated"] == 0 and text.vocab_size == FIRST_SYMBOL_ID + 256
    assert 0.0 <= text.info["byte_ngram_accuracy"] <= 1.0
    one_epoch = itertools.islice(text.train_stream(0), text.info["train_examples"])  # the stream is endless
    lengths = [len(ids) for ids, _ in one_epoch]
    reach = text.info["train_reaching_position"]
    assert list(reach) == [str(p) for p in (512, 1024, 2048, 4096, 8192)]  # the marks below the task length
    assert reach == {p: sum(n > int(p) for n in lengths) for p in reach}
    assert reach["512"] > 0


def test_position_reach_counts_examples_holding_a_token_at_each_mark():
    examples = [([1] * n, 0) for n in (100, 513, 600, 1025, 3000)]
    assert position_reach(examples, 4096) == {"512": 4, "1024": 2, "2048": 1}
    assert position_reach(examples, 512) == {}


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_listops_task_streams_by_seed_and_keeps_a_fixed_validation_set():
    task = listops_task(2048, validation_size=4)
    again = listops_task(2048, validation_size=4)
    assert task.validation == again.validation
    first = [next(task.train_stream(0)) for _ in range(1)]
    assert first == [next(again.train_stream(0))]
    assert first != [next(task.train_stream(1))]
    assert task.num_labels == 10 and task.info["validation_truncated"] == 0


def test_collate_pads_right():
    batch = collate([([2, 7, 3], 1), ([2, 3], 0)])
    assert batch["input_ids"].tolist() == [[2, 7, 3], [2, 3, PAD_ID]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [1, 0]


def test_length_grouped_batches_pad_less_and_keep_every_example_once_per_pass():
    rng = random.Random(0)
    # Two groups per pass of the stream, so that the first pass ends with a group.
    examples = [([CLS_ID, *[FIRST_SYMBOL_ID] * rng.randrange(1, 400), SEP_ID], i % 2) for i in range(800)]
    batch_size, passes = 8, 2
    steps = passes * len(examples) // batch_size

    def drawn(group_by_length: bool) -> list[list[Example]]:
        batches = training_batches(epoch_stream(examples)(0), batch_size, group_by_length, seed=0)
        return [next(batches) for _ in range(steps)]

    def padded(batches: list[list[Example]]) -> int:
        return sum(len(batch) * max(len(ids) for ids, _ in batch) for batch in batches)

    plain, grouped = drawn(False), drawn(True)
    assert all(len(batch) == batch_size for batch in grouped)
    # The same examples, each once per pass of the stream: grouping reorders, it drops and repeats nothing.
    assert sorted(map(id, (e for b in grouped for e in b))) == sorted(map(id, (e for b in plain for e in b)))
    assert sorted(map(id, (e for b in grouped[: len(examples) // batch_size] for e in b))) == sorted(map(id, examples))
    assert padded(grouped) < 0.6 * padded(plain)
    # Batches are not served shortest first: the order of the sorted batches is shuffled.
    longest = [max(len(ids) for ids, _ in batch) for batch in grouped[:GROUP_BATCHES]]
    assert longest != sorted(longest)


def test_a_run_learns_a_trivial_rule():
    # Label = which of two symbols fills a third of the document: any family that trains at all separates it.
    def make(n, seed):
        g = torch.Generator().manual_seed(seed)
        rows = []
        for i in range(n):
            ids = torch.randint(FIRST_SYMBOL_ID + 2, FIRST_SYMBOL_ID + 8, (24,), generator=g)
            ids[torch.randperm(24, generator=g)[:8]] = FIRST_SYMBOL_ID + i % 2
            rows.append(([CLS_ID, *ids.tolist(), SEP_ID], i % 2))
        return rows

    task = TaskData("imdb", 32, FIRST_SYMBOL_ID + 10, 2, epoch_stream(make(64, 0)), make(32, 1))
    spec = RunSpec("dense_transformer", 32, {"classifier_pooling": "mean"})
    record = train_and_evaluate(task, spec, TINY, Budget(steps=40, batch_size=16, learning_rate=1e-2, warmup_steps=4))
    assert record["accuracy"] >= 0.9
    assert record["curve"][-1]["loss"] < record["curve"][0]["loss"] / 2
    assert record["train_tokens_per_second"] > 0 and record["overrides"] == {"classifier_pooling": "mean"}


def test_planned_runs_add_dense_baselines_once():
    plans = [TaskPlan("imdb", (512, 2048), dense_lengths=(512,)), TaskPlan("listops", (2048,))]
    rows = [Row("dense_transformer"), Row("fsat"), parse_variant("fsat:index_scale=max_length")]
    runs = [(task, spec.key) for task, spec in planned_runs(plans, rows)]
    assert len(runs) == len(set(runs)) == 9
    assert ("imdb", "fsat [index_scale=max_length]@2048") in runs
    baseline_only = planned_runs([TaskPlan("text", (4096,), dense_lengths=(1024,))], [])
    assert [(task, spec.key) for task, spec in baseline_only] == [("text", "dense_transformer@1024")]
    with pytest.raises(ValueError, match="Nothing to run"):
        planned_runs([TaskPlan("text", (4096,))], [])
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_variant("fsat")
    with pytest.raises(ValueError, match="Unknown task"):
        TaskPlan("qa", (512,))


def test_evaluation_writes_reports_and_resumes(tmp_path, reviews_file, monkeypatch):
    budget = Budget(steps=2, batch_size=4, warmup_steps=1, eval_batch_size=8)
    plans = [TaskPlan("text", (256,), dense_lengths=(128,))]
    calls = []
    results = run_long_eval(
        tmp_path,
        plans,
        [Row("sparse_transformer")],
        size=TINY,
        budget=budget,
        reviews_file=reviews_file,
        validation_size=10,
        on_result=calls.append,
    )
    assert {(r["label"], r["length"]) for r in results["runs"]} == {
        ("sparse_transformer", 256),
        ("dense_transformer", 128),
    }
    saved = json.loads((tmp_path / "long_eval.json").read_text())
    assert saved["runs"] == results["runs"] and saved["settings"]["budget"]["steps"] == 2
    markdown = (tmp_path / "long_eval.md").read_text()
    assert "LRA Text" in markdown and "| sparse_transformer | 256 |" in markdown
    assert (tmp_path / "long_eval.png").is_file()
    # The same command again runs nothing; another budget in the same folder is refused.
    again = run_long_eval(
        tmp_path,
        plans,
        [Row("sparse_transformer")],
        size=TINY,
        budget=budget,
        reviews_file=reviews_file,
        validation_size=10,
        on_result=calls.append,
    )
    assert len(calls) == 2 and again["runs"] == results["runs"]
    with pytest.raises(ValueError, match="another budget"):
        other = dataclasses.replace(budget, steps=3)
        run_long_eval(tmp_path, plans, [Row("sparse_transformer")], size=TINY, budget=other)


def test_two_processes_sharing_a_folder_keep_each_others_runs(tmp_path, reviews_file, monkeypatch):
    budget = Budget(steps=2, batch_size=4, warmup_steps=1, eval_batch_size=8)
    real_train = long_eval_evaluate.train_and_evaluate

    def train_while_another_process_saves(task, spec, size, budget, device):
        # the other process finishes its run while ours trains
        other = real_train(task, RunSpec("fsat", 256, {}, ""), size, budget)
        path = tmp_path / "long_eval.json"
        on_disk = json.loads(path.read_text()) if path.is_file() else {"runs": []}
        path.write_text(json.dumps({**on_disk, "runs": [*on_disk["runs"], other]}))
        return real_train(task, spec, size, budget, device=device)

    monkeypatch.setattr(long_eval_evaluate, "train_and_evaluate", train_while_another_process_saves)
    results = run_long_eval(
        tmp_path,
        [TaskPlan("text", (256,))],
        [Row("sparse_transformer")],
        size=TINY,
        budget=budget,
        reviews_file=reviews_file,
        validation_size=10,
    )
    saved = json.loads((tmp_path / "long_eval.json").read_text())
    assert [(r["label"], r["length"]) for r in saved["runs"]] == [("fsat", 256), ("sparse_transformer", 256)]
    assert saved["runs"] == results["runs"] and "256" in saved["task_info"]["text"]


def _save_runs(path, writer: int, count: int) -> None:
    for k in range(count):
        with results_lock(path):
            on_disk = load_results(path)
            run = {"task": "text", "label": f"writer{writer}-{k}", "length": 64}
            save_results(path, {**on_disk, "runs": [*on_disk["runs"], run]})


def test_writers_sharing_a_folder_neither_lose_nor_corrupt_runs(tmp_path):
    # Before the lock and the per-writer temporary file, two writers lost runs and left unreadable JSON behind.
    path = tmp_path / "long_eval.json"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_save_runs, args=(path, writer, 60)) for writer in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    labels = {run["label"] for run in json.loads(path.read_text())["runs"]}
    assert labels == {f"writer{w}-{k}" for w in range(2) for k in range(60)}
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_a_run_is_refused_when_another_process_changed_the_folder_s_protocol_meanwhile(
    tmp_path, reviews_file, monkeypatch
):
    budget = Budget(steps=2, batch_size=4, warmup_steps=1, eval_batch_size=8)
    kwargs = {"size": TINY, "budget": budget, "reviews_file": reviews_file, "validation_size": 8}
    real_train = long_eval_evaluate.train_and_evaluate

    def train_while_another_process_pools_the_mean(task, spec, size, budget, device):
        record = real_train(task, spec, size, budget, device=device)
        if spec.model_type == "dense_transformer":  # ours; the other process's run trains plainly
            run_long_eval(tmp_path, [TaskPlan("text", (64,))], [Row("fsat")], text_pooling="mean", **kwargs)
        return record

    monkeypatch.setattr(long_eval_evaluate, "train_and_evaluate", train_while_another_process_pools_the_mean)
    with pytest.raises(ValueError, match="task overrides"):
        run_long_eval(tmp_path, [TaskPlan("text", (64,))], [Row("dense_transformer")], text_pooling="cls", **kwargs)
    # Only the other process's run is in the folder, with its protocol.
    saved = json.loads((tmp_path / "long_eval.json").read_text())
    assert [run["label"] for run in saved["runs"]] == ["fsat"]


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_validation_size_and_reviews_file_are_settings_of_the_folder(tmp_path, reviews_file):
    budget = Budget(steps=1, batch_size=4, warmup_steps=0, eval_batch_size=8)
    plans, rows = [TaskPlan("text", (64,))], [Row("dense_transformer")]
    run_long_eval(tmp_path, plans, rows, size=TINY, budget=budget, reviews_file=reviews_file, validation_size=8)
    with pytest.raises(ValueError, match="another validation_size"):
        run_long_eval(tmp_path, plans, rows, size=TINY, budget=budget, reviews_file=reviews_file, validation_size=10)
    other = tmp_path / "other.tsv"
    other.write_text(reviews_file.read_text(encoding="utf-8") + "one more review\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="another reviews"):
        run_long_eval(tmp_path, plans, rows, size=TINY, budget=budget, reviews_file=other, validation_size=8)
    # ListOps reads no reviews: its runs neither conflict with a reviews file nor unset the folder's.
    short = ListOpsSettings(min_length=20, max_length=60)
    kwargs = {"size": TINY, "budget": budget, "validation_size": 8, "listops_settings": short}
    run_long_eval(tmp_path / "mixed", [TaskPlan("listops", (64,))], rows, **kwargs)
    run_long_eval(tmp_path / "mixed", plans, rows, reviews_file=reviews_file, **kwargs)
    run_long_eval(tmp_path / "mixed", [TaskPlan("listops", (128,))], rows, **kwargs)
    saved = json.loads((tmp_path / "mixed" / "long_eval.json").read_text())
    assert saved["settings"]["reviews"].startswith("sha256:") and len(saved["runs"]) == 3


def test_imdb_tokenizer_is_trained_once_per_folder_and_read_by_every_later_run(tmp_path, reviews_file, monkeypatch):
    tasks_module = importlib.import_module("attnzoo.evaluation.tasks")
    trainings = []
    real_trainer = tasks_module.train_wordpiece_tokenizer

    def counting_trainer(*args, **kwargs):
        trainings.append(1)
        return real_trainer(*args, **kwargs)

    monkeypatch.setattr(tasks_module, "train_wordpiece_tokenizer", counting_trainer)
    folder = tmp_path / "tokenizer"
    short = imdb_task(reviews_file, 64, validation_size=10, vocab_size=300, tokenizer_dir=folder)
    resumed = imdb_task(reviews_file, 64, validation_size=10, vocab_size=300, tokenizer_dir=folder)
    longer = imdb_task(reviews_file, 256, validation_size=10, vocab_size=300, tokenizer_dir=folder)
    # WordPiece training breaks ties differently from run to run: a second training could give other ids.
    assert len(trainings) == 1
    assert resumed.validation == short.validation
    assert [ids[1:20] for ids, _ in longer.validation] == [ids[1:20] for ids, _ in short.validation]
    with pytest.raises(ValueError, match="tokenizer of another split"):
        imdb_task(reviews_file, 64, validation_size=12, vocab_size=300, tokenizer_dir=folder)


def test_listops_trees_must_fit_the_length_whole(tmp_path):
    # A cut tree would keep the value of the whole tree as its label.
    with pytest.raises(ValueError, match="do not fit length 600"):
        listops_task(600, validation_size=4)
    budget = Budget(steps=1, batch_size=4, warmup_steps=0, eval_batch_size=8)
    with pytest.raises(ValueError, match="at least 2002"):
        run_long_eval(tmp_path, [TaskPlan("listops", (2048, 1024))], [Row("dense_transformer")], size=TINY,
                      budget=budget, validation_size=8)  # fmt: skip
    assert not (tmp_path / "long_eval.json").exists()  # refused before any run


def test_schedules_follow_their_formulas():
    model = torch.nn.Linear(2, 2)
    peak, warmup = 1e-3, 10
    for name, expected in {
        # LRA's rsqrt_decay: peak * sqrt(warmup / step) after the warm-up, so 4x the warm-up halves the rate.
        "rsqrt": {5: peak / 2, 10: peak, 40: peak / 2, 90: peak / 3},
        "linear": {5: peak / 2, 10: peak, 55: peak / 2, 100: 0.0},
    }.items():
        budget = Budget(steps=100, learning_rate=peak, warmup_steps=warmup, schedule=name)
        optimizer = torch.optim.AdamW(model.parameters(), lr=peak)
        schedule = SCHEDULES[name](optimizer, budget)
        seen = {}
        for step in range(1, 101):
            optimizer.step()
            schedule.step()
            seen[step] = optimizer.param_groups[0]["lr"]
        for step, lr in expected.items():
            assert seen[step] == pytest.approx(lr, abs=1e-12), (name, step)
    with pytest.raises(ValueError, match="schedule"):
        Budget(schedule="cosine")


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_bf16_autocast_is_applied_and_close_to_float32():
    task = listops_task(600, validation_size=4, settings=ListOpsSettings(min_length=300, max_length=598))
    budget = Budget(steps=2, batch_size=2, warmup_steps=1, eval_batch_size=4)
    for family in ("dense_transformer", "sparse_transformer"):
        full = train_and_evaluate(task, RunSpec(family, 600), TINY, budget, device="cpu")
        half = train_and_evaluate(task, RunSpec(family, 600), TINY, dataclasses.replace(budget, bf16=True))
        assert half["device"] == full["device"] == "cpu"
        # bfloat16 matmuls change the numbers (so autocast ran) by far less than the loss itself.
        assert half["validation_loss"] != full["validation_loss"]
        assert half["validation_loss"] == pytest.approx(full["validation_loss"], rel=0.02)


def test_a_folder_from_before_a_budget_field_existed_still_resumes(tmp_path, reviews_file):
    budget = Budget(steps=2, batch_size=4, warmup_steps=1, eval_batch_size=8)
    plans = [TaskPlan("text", (128,))]
    first = run_long_eval(
        tmp_path, plans, [Row("dense_transformer")], size=TINY, budget=budget, reviews_file=reviews_file,
        validation_size=10,
    )  # fmt: skip
    saved = json.loads((tmp_path / "long_eval.json").read_text())
    for field in ("schedule", "bf16"):  # written before these fields existed
        del saved["settings"]["budget"][field]
    (tmp_path / "long_eval.json").write_text(json.dumps(saved))
    calls = []
    again = run_long_eval(
        tmp_path, plans, [Row("dense_transformer")], size=TINY, budget=budget, reviews_file=reviews_file,
        validation_size=10, on_result=calls.append,
    )  # fmt: skip
    assert calls == [] and again["runs"] == first["runs"]
    other = dataclasses.replace(budget, schedule="rsqrt")
    with pytest.raises(ValueError, match="another budget"):
        run_long_eval(
            tmp_path, plans, [Row("dense_transformer")], size=TINY, budget=other, reviews_file=reviews_file,
            validation_size=10,
        )  # fmt: skip


def test_listops_tree_shape_is_a_setting_of_the_folder(tmp_path):
    short = ListOpsSettings(min_length=20, max_length=60)
    budget = Budget(steps=2, batch_size=4, warmup_steps=1, eval_batch_size=8)
    plans = [TaskPlan("listops", (64,))]
    results = run_long_eval(
        tmp_path, plans, [Row("dense_transformer")], size=TINY, budget=budget, validation_size=8,
        listops_settings=short,
    )  # fmt: skip
    info = results["task_info"]["listops"]["64"]
    assert info["generator"]["max_length"] == 60 and info["validation_truncated"] == 0
    assert 0.0 <= info["first_operator_accuracy"] <= 1.0
    with pytest.raises(ValueError, match="ListOps runs at length 64"):
        run_long_eval(tmp_path, plans, [Row("sparse_transformer")], size=TINY, budget=budget, validation_size=8)


def test_lra_tasks_pool_the_first_token_for_every_family_unless_a_row_says_otherwise(tmp_path, reviews_file):
    short = ListOpsSettings(min_length=20, max_length=60)
    listops = listops_task(64, validation_size=4, settings=short)
    imdb = imdb_task(reviews_file, 64, validation_size=10, vocab_size=300)
    for task in (listops, text_task(reviews_file, 64, validation_size=10)):
        assert task.model_overrides == {"classifier_pooling": "cls"} == task.info["model_overrides"]
    assert imdb.model_overrides == {}

    def pooling(task, **overrides):
        return build_classifier(task, RunSpec("sparse_transformer", 64, overrides), TINY).config.classifier_pooling

    assert pooling(listops) == "cls" and pooling(imdb) == "mean"  # the sparse families' own default is the mean
    assert pooling(listops, classifier_pooling="mean") == "mean"  # an ablation row overrides the protocol

    budget = Budget(steps=2, batch_size=4, warmup_steps=1, eval_batch_size=8)
    plans = [TaskPlan("listops", (64,))]
    run_long_eval(
        tmp_path, plans, [Row("dense_transformer")], size=TINY, budget=budget, validation_size=8,
        listops_settings=short,
    )  # fmt: skip
    saved = json.loads((tmp_path / "long_eval.json").read_text())
    del saved["task_info"]["listops"]["64"]["model_overrides"]  # a folder from before the protocol
    (tmp_path / "long_eval.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="task overrides"):
        run_long_eval(
            tmp_path, plans, [Row("sparse_transformer")], size=TINY, budget=budget, validation_size=8,
            listops_settings=short,
        )  # fmt: skip


def test_text_pooling_is_the_task_protocol_of_every_family_and_of_the_folder(tmp_path, reviews_file):
    mean = text_task(reviews_file, 64, validation_size=10, pooling="mean")
    assert mean.model_overrides == {"classifier_pooling": "mean"} == mean.info["model_overrides"]
    assert build_classifier(mean, RunSpec("dense_transformer", 64), TINY).config.classifier_pooling == "mean"
    with pytest.raises(ValueError, match="pooling must be one of"):
        text_task(reviews_file, 64, validation_size=10, pooling="max")

    budget = Budget(steps=2, batch_size=4, warmup_steps=1, eval_batch_size=8)
    plans = [TaskPlan("text", (64,))]
    kwargs = {"size": TINY, "budget": budget, "reviews_file": reviews_file, "validation_size": 8}
    run_long_eval(tmp_path, plans, [Row("dense_transformer")], text_pooling="mean", **kwargs)
    saved = json.loads((tmp_path / "long_eval.json").read_text())
    assert saved["task_info"]["text"]["64"]["model_overrides"] == {"classifier_pooling": "mean"}
    # The same folder refuses runs that pool differently: their rows would share labels with these.
    with pytest.raises(ValueError, match="task overrides"):
        run_long_eval(tmp_path, plans, [Row("sparse_transformer")], text_pooling="cls", **kwargs)


def test_bert_masking_masks_only_maskable_tokens_by_the_80_10_10_rule():
    ids = torch.randint(FIRST_SYMBOL_ID, 200, (64, 512), generator=torch.Generator().manual_seed(0))
    maskable = ids % 3 != 0
    masked, labels = bert_masking(ids, maskable, 0.3, MASK_ID, (FIRST_SYMBOL_ID, 200), torch.Generator())
    chosen = labels != -100
    assert not (chosen & ~maskable).any() and (masked[~chosen] == ids[~chosen]).all()
    assert (labels[chosen] == ids[chosen]).all()
    assert chosen.sum() / maskable.sum() == pytest.approx(0.3, abs=0.01)
    as_mask = (masked == MASK_ID) & chosen
    replaced = (masked != MASK_ID) & (masked != ids) & chosen
    assert as_mask.sum() / chosen.sum() == pytest.approx(0.8, abs=0.02)
    # 10% are drawn at random (a draw may hit the original id: 1 in 195 here), 10% stay.
    assert replaced.sum() / chosen.sum() == pytest.approx(0.1 * 194 / 195, abs=0.01)
    assert ((masked[replaced] >= FIRST_SYMBOL_ID) & (masked[replaced] < 200)).all()


def test_self_pretraining_learns_the_inputs_and_the_classifier_starts_from_its_encoder(monkeypatch):
    # Each document repeats one symbol, so a masked token is given away by its neighbours.
    def make(n, seed):
        g = torch.Generator().manual_seed(seed)
        symbols = torch.randint(FIRST_SYMBOL_ID, FIRST_SYMBOL_ID + 6, (n,), generator=g).tolist()
        return [([CLS_ID, *[s] * 20, SEP_ID], int(s % 2)) for s in symbols]

    task = TaskData("imdb", 24, FIRST_SYMBOL_ID + 6, 2, epoch_stream(make(64, 0)), make(16, 1))
    states = []

    def spy(model, batches, steps, budget, name, log_every=25):
        states.append({k: v.detach().clone() for k, v in model.model.state_dict().items()})  # before
        result = runner_optimize(model, batches, steps, budget, name, log_every)
        states.append({k: v.detach().clone() for k, v in model.model.state_dict().items()})  # after
        return result

    runner = importlib.import_module("attnzoo.evaluation.runner")
    runner_optimize = runner.optimize
    monkeypatch.setattr(runner, "optimize", spy)
    budget = Budget(steps=2, batch_size=16, learning_rate=1e-2, warmup_steps=2, pretrain_steps=200)
    record = train_and_evaluate(task, RunSpec("dense_transformer", 24), TINY, budget, log_every=10)
    pretrain_start, pretrained, finetune_start, _ = states
    curve = record["pretrain_curve"]
    assert len(curve) == 20 and record["pretrain_seconds"] > 0
    assert curve[-1]["loss"] < 0.1 * curve[0]["loss"]
    # Fine-tuning starts from the encoder pretraining left, not from the fresh one it began with.
    assert finetune_start.keys() == pretrained.keys()
    assert all(torch.equal(finetune_start[k], pretrained[k]) for k in pretrained)
    assert not all(torch.equal(pretrain_start[k], pretrained[k]) for k in pretrained)
    # The report counts the pretraining in the run's time.
    row = markdown_report({"runs": [record]}).splitlines()[-1]
    assert f"| {record['pretrain_seconds']:.0f} pretraining + {record['train_seconds']:.0f} |" in row
    plain = train_and_evaluate(
        task, RunSpec("dense_transformer", 24), TINY, dataclasses.replace(budget, pretrain_steps=0)
    )
    assert "pretrain_curve" not in plain


def test_budget_rejects_bad_pretraining_settings():
    with pytest.raises(ValueError, match="pretrain_steps"):
        Budget(pretrain_steps=-1)
    with pytest.raises(ValueError, match="mlm_probability"):
        Budget(mlm_probability=0.0)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_family_classifier_loads_its_masked_lm_encoder(model_type):
    # Self-pretraining hands the masked-LM's encoder to the classifier with a strict load.
    task = TaskData("imdb", 64, FIRST_SYMBOL_ID + 6, 2, epoch_stream([]), [])
    config = model_config(task, RunSpec(model_type, 64), TINY)
    family = FAMILIES[model_type]
    torch.manual_seed(0)
    encoder = family.masked_lm_class(config).model
    classifier = family.sequence_classification_class(config)
    classifier.model.load_state_dict(encoder.state_dict())
    loaded, source = classifier.model.state_dict(), encoder.state_dict()
    assert loaded.keys() == source.keys() and all(torch.equal(loaded[k], source[k]) for k in source)

"""`attnzoo.training`: metrics against hand-computed values, data readers, the MLM collator, argument parsing, model
construction and warm starts across families."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoTokenizer, TrainingArguments

import attnzoo
from attnzoo.training import (
    ClassificationDataArguments,
    MLMCollator,
    ModelArguments,
    SummarizationDataArguments,
    build_model,
    classification_metrics,
    glue_metrics,
    load_classification_splits,
    load_summarization_splits,
    parse_arguments,
    read_cohan_jsonl,
    read_story,
    resolve_checkpoint,
    rouge_scores,
    split_sentences,
)
from attnzoo.training.data import read_records
from source_checkout import REPO_ROOT

FAMILY_NAMES = sorted(f.name for f in attnzoo.FAMILIES.values())

# ---------------------------------------------------------------------------------------------------------------------
# Metrics: every expected value below is worked out by hand in the comment next to it.
# ---------------------------------------------------------------------------------------------------------------------

PREDICTIONS = [1, 0, 1, 1, 0, 1]
LABELS = [1, 0, 0, 1, 1, 1]  # TP = 3 (rows 0, 3, 5), TN = 1 (row 1), FP = 1 (row 2), FN = 1 (row 4)


def test_glue_accuracy_and_f1_match_hand_computed_values():
    metrics = glue_metrics("mrpc", PREDICTIONS, LABELS)
    assert metrics["accuracy"] == pytest.approx(4 / 6)  # (TP + TN) / 6
    assert metrics["f1"] == pytest.approx(6 / 8)  # 2TP / (2TP + FP + FN)
    assert glue_metrics("qqp", PREDICTIONS, LABELS) == metrics
    assert glue_metrics("rte", PREDICTIONS, LABELS) == {"accuracy": pytest.approx(4 / 6)}


def test_glue_matthews_correlation_matches_hand_computed_value():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (3 - 1) / sqrt(4 * 4 * 2 * 2) = 0.25
    assert glue_metrics("cola", PREDICTIONS, LABELS) == {"matthews_correlation": pytest.approx(0.25)}


def test_glue_stsb_pearson_and_spearman_match_hand_computed_values():
    # x = 1..4, y = (2, 9, 5, 4): deviations (-1.5, -.5, .5, 1.5) and (-3, 4, 0, -1); sum of products 1, sums of
    # squares 5 and 26 -> pearson = 1 / sqrt(130). Ranks of y: (1, 4, 3, 2), d^2 sums to 8 ->
    # spearman = 1 - 6 * 8 / (4 * 15) = 0.2.
    metrics = glue_metrics("stsb", [1.0, 2.0, 3.0, 4.0], [2.0, 9.0, 5.0, 4.0])
    assert metrics["pearson"] == pytest.approx(1 / math.sqrt(130))
    assert metrics["spearmanr"] == pytest.approx(0.2)


def test_classification_metrics_report_accuracy_and_macro_f1():
    # Class 1: F1 = 0.75 (above). Class 0 as positive: TP = 1, FP = 1, FN = 1 -> F1 = 0.5. Macro = 0.625.
    metrics = classification_metrics(PREDICTIONS, LABELS)
    assert metrics == {"accuracy": pytest.approx(4 / 6), "macro_f1": pytest.approx(0.625)}


def test_rouge_matches_hand_computed_values():
    # Unigrams: 5 of 6 match on each side -> 5/6; bigrams: "the cat", "on the", "the mat" of 5 -> 3/5;
    # LCS "the cat on the mat" = 5 of 6 -> 5/6.
    scores = rouge_scores(["the cat sat on the mat"], ["the cat lay on the mat"])
    assert scores["rouge1"] == pytest.approx(100 * 5 / 6)
    assert scores["rouge2"] == pytest.approx(100 * 3 / 5)
    assert scores["rougeL"] == pytest.approx(100 * 5 / 6)
    assert scores["rougeLsum"] == pytest.approx(100 * 5 / 6)


def test_rouge_uses_stemming():
    # Porter stems: cats -> cat, running -> run, runs -> run: every unigram matches.
    assert rouge_scores(["cats running"], ["cat runs"])["rouge1"] == pytest.approx(100.0)


def test_rouge_lsum_is_computed_over_sentences():
    # As one sequence the LCS of "the dog ran the cat sat" and "the cat sat the dog ran" is 3 of 6 tokens (0.5).
    # Summary-level LCS matches each reference sentence with its twin in the prediction: 6 of 6 (1.0).
    scores = rouge_scores(["The dog ran. The cat sat."], ["The cat sat. The dog ran."])
    assert scores["rougeL"] == pytest.approx(50.0)
    assert scores["rougeLsum"] == pytest.approx(100.0)


def test_rouge_averages_over_examples_and_checks_lengths():
    scores = rouge_scores(["the cat", "a b"], ["the cat", "c d"])
    assert scores["rouge1"] == pytest.approx(50.0)
    with pytest.raises(ValueError, match="predictions"):
        rouge_scores(["a"], ["a", "b"])


def test_split_sentences_splits_on_end_punctuation_and_keeps_abbreviations_of_lowercase_text():
    assert split_sentences('He left. "Why?" she asked! 3 more.\nNext line') == [
        "He left.",
        '"Why?" she asked!',
        "3 more.",
        "Next line",
    ]
    assert split_sentences("e.g. this stays one sentence.") == ["e.g. this stays one sentence."]


# ---------------------------------------------------------------------------------------------------------------------
# GLUE and classification readers
# ---------------------------------------------------------------------------------------------------------------------


def _classification(**kwargs) -> ClassificationDataArguments:
    return ClassificationDataArguments(**kwargs)


def test_reads_original_cola_layout_without_header(data_dir):
    path = str(data_dir / "glue" / "CoLA" / "train.tsv")
    data = load_classification_splits(_classification(task_name="CoLA", train_file=path))
    train = data.splits["train"]
    assert len(train["label"]) == 200
    assert train["text"][0] == "Our friends won't buy this analysis, let alone the next one we propose."
    assert train["label"][0] == 1
    assert train["text_pair"] is None
    assert data.label_names == ["unacceptable", "acceptable"]


def test_reads_original_mrpc_layout_with_byte_order_mark(data_dir):
    path = str(data_dir / "glue" / "MRPC" / "train.tsv")
    data = load_classification_splits(_classification(task_name="mrpc", train_file=path))
    train = data.splits["train"]
    assert len(train["text"]) == 200
    assert train["text"][0].startswith("Amrozi accused his brother")
    assert train["text_pair"][0].startswith("Referring to him as only")
    assert train["label"][:2] == [1, 0]


def test_reads_rte_label_names_and_qnli_label_ids(data_dir):
    rte = load_classification_splits(_classification(task_name="rte", train_file=str(data_dir / "glue/RTE/train.tsv")))
    assert rte.splits["train"]["label"][0] == 1  # "not_entailment"
    assert rte.splits["train"]["text"][0] == "No Weapons of Mass Destruction Found in Iraq Yet."
    qnli = load_classification_splits(
        _classification(task_name="qnli", validation_file=str(data_dir / "glue/QNLI/dev.tsv"))
    )
    assert sorted(set(qnli.splits["validation"]["label"])) == [0, 1]
    assert qnli.splits["validation"]["text"][0] == "When did the third Digimon series begin?"


@pytest.mark.parametrize(
    ("task", "header", "row", "text", "pair", "label"),
    [
        (
            "stsb",
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
            "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\t"
            "An air plane is taking off.\t5.000",
            "A plane is taking off.",
            "An air plane is taking off.",
            5.0,
        ),
        (
            "mnli",
            "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
            "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
            "0\t1\t1e\tgov\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tConceptually cream skimming.\tProduct and geography.\t"
            "neutral\tneutral",
            "Conceptually cream skimming.",
            "Product and geography.",
            1,
        ),
        (
            "qqp",
            "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            "0\t1\t2\tWhat is AI?\tWhat's AI?\t1",
            "What is AI?",
            "What's AI?",
            1,
        ),
        (
            "wnli",
            "index\tsentence1\tsentence2\tlabel",
            "0\tI stuck a pin.\tI stuck it.\t1",
            "I stuck a pin.",
            "I stuck it.",
            1,
        ),
    ],
)
def test_reads_original_glue_layouts(tmp_path, task, header, row, text, pair, label):
    path = tmp_path / "train.tsv"
    path.write_text(f"{header}\n{row}\n", encoding="utf-8")
    data = load_classification_splits(_classification(task_name=task, train_file=str(path)))
    train = data.splits["train"]
    assert (train["text"], train["text_pair"], train["label"]) == ([text], [pair], [label])
    assert (data.label_names is None) == (task == "stsb")


def test_reads_headerless_ag_news_by_column_position(data_dir):
    path = str(data_dir / "agnews" / "train.tsv")
    data = load_classification_splits(_classification(train_file=path, text_column="0", label_column="1"))
    assert data.label_names == ["Business", "Sci/Tech", "Sports", "World"]
    labels = data.splits["train"]["label"]
    assert len(labels) == 500
    assert [labels.count(i) for i in range(4)] == [137, 123, 119, 121]


def test_column_positions_on_a_file_with_a_header_are_refused(data_dir):
    # The header line would train as a review and add a class "label" (314 examples, 3 classes).
    path = str(data_dir / "imdb" / "train.tsv")
    with pytest.raises(ValueError, match=r"Line 1 of .* looks like a header row .* 'label' is not an integer"):
        load_classification_splits(_classification(train_file=path, text_column="0", label_column="1"))


def test_an_empty_first_label_is_an_empty_row_not_a_header(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("no label\t\ngood\t1\nbad\t0\n", encoding="utf-8")
    given = {"train_file": str(path), "text_column": "0", "label_column": "1", "skip_empty_rows": True}
    data = load_classification_splits(_classification(**given))
    assert data.splits["train"]["text"] == ["good", "bad"]
    assert data.report.counts["train_dropped_empty_rows"] == 1


def test_integer_labels_from_one_keep_their_ids_and_say_so(tmp_path, caplog):
    path = tmp_path / "train.tsv"
    path.write_text("good\t1\nbad\t2\nfine\t4\n", encoding="utf-8")
    with caplog.at_level("WARNING"):
        data = load_classification_splits(_classification(train_file=str(path), text_column="0", label_column="1"))
    assert data.label_names == ["0", "1", "2", "3", "4"]
    assert "never occur in the data" in caplog.text and "[0, 3]" in caplog.text


def test_reads_csv_quoted_imdb_with_header(data_dir):
    data = load_classification_splits(_classification(train_file=str(data_dir / "imdb" / "train.tsv")))
    labels = data.splits["train"]["label"]
    assert len(labels) == 313
    assert (labels.count(1), labels.count(0)) == (158, 155)


def test_missing_column_is_a_clear_error(data_dir):
    path = str(data_dir / "glue" / "SST-2" / "train.tsv")
    with pytest.raises(ValueError, match=r"Column\(s\) stars not found .* available columns: sentence, label"):
        load_classification_splits(_classification(train_file=path, label_column="stars"))
    with pytest.raises(ValueError, match="sentence1"):
        load_classification_splits(_classification(task_name="rte", train_file=path))


def test_empty_rows_fail_unless_skipped_and_then_are_counted(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\ngood film\t1\n \t0\nbad film\t\nawful\t0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3 .* empty or missing sentence"):
        load_classification_splits(_classification(task_name="sst2", train_file=str(path)))
    data = load_classification_splits(_classification(task_name="sst2", train_file=str(path), skip_empty_rows=True))
    assert data.splits["train"]["text"] == ["good film", "awful"]
    assert data.report.counts["train_dropped_empty_rows"] == 2


def test_unknown_labels_and_tasks_are_errors(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\nfine\tmaybe\n", encoding="utf-8")
    with pytest.raises(ValueError, match="Unknown label 'maybe'"):
        load_classification_splits(_classification(task_name="sst2", train_file=str(path)))
    with pytest.raises(ValueError, match="Unknown GLUE task"):
        _classification(task_name="squad", train_file=str(path))


def test_max_samples_are_reported(data_dir):
    path = str(data_dir / "glue" / "SST-2" / "dev.tsv")
    data = load_classification_splits(_classification(task_name="sst2", validation_file=path, max_eval_samples=10))
    assert len(data.splits["validation"]["label"]) == 10
    assert data.report.counts["validation_dropped_by_max_samples"] == 790


def test_glue_task_without_files_defaults_to_the_hub():
    args = _classification(task_name="SST-2")
    assert (args.dataset_name, args.dataset_config_name) == ("nyu-mll/glue", "sst2")


def test_read_records_reads_json_lines_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "a", "label": 0}\n\n{"text": "b", "label": 1}\n', encoding="utf-8")
    records, columns = read_records(jsonl, [])
    assert [r["text"] for r in records] == ["a", "b"] and columns == ["text", "label"]
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["x", "y"], "label": [1, 0]}), parquet)
    data = load_classification_splits(_classification(train_file=str(parquet)))
    assert data.splits["train"]["text"] == ["x", "y"] and data.splits["train"]["label"] == [1, 0]


# ---------------------------------------------------------------------------------------------------------------------
# Summarization readers
# ---------------------------------------------------------------------------------------------------------------------


def test_read_story_separates_article_and_highlights(data_dir):
    article, summary = read_story(
        data_dir / "cnn_dailymail/cnn_stories/2bd8ada1de6a7b02f59430cc82045eb8d29cf033.story"
    )
    assert article.startswith("(CNN)For the first time in eight years")
    assert "@highlight" not in article and "@highlight" not in summary
    assert len(summary.split("\n")) >= 2


def test_story_folder_is_split_by_url_lists(data_dir, tmp_path):
    stories = str(data_dir / "cnn_dailymail" / "cnn_stories")
    args = SummarizationDataArguments(
        train_file=stories,
        train_url_list=str(data_dir / "cnn_dailymail/url_lists/all_train.txt"),
        validation_file=stories,
        validation_url_list=str(data_dir / "cnn_dailymail/url_lists/all_val.txt"),
    )
    splits, report = load_summarization_splits(args)
    assert report.counts == {"train_examples": 10, "validation_examples": 10}
    assert not set(splits["train"]["document"]) & set(splits["validation"]["document"])
    missing = tmp_path / "urls.txt"
    missing.write_text("http://example.com/not-a-story\n", encoding="utf-8")
    with pytest.raises(ValueError, match="1 of the 1 stories listed"):
        load_summarization_splits(SummarizationDataArguments(train_file=stories, train_url_list=str(missing)))


def test_reads_pubmed_cohan_format(data_dir):
    records = read_cohan_jsonl(data_dir / "pubmed" / "train.txt")
    assert len(records) == 8
    first = records[0]
    assert first["summary"].startswith("background : the present study was carried out")
    assert "<S>" not in first["summary"] and "</S>" not in first["summary"]
    assert "\n" in first["summary"]  # one abstract sentence per line, as ROUGE-Lsum expects
    assert first["document"].startswith("a recent systematic analysis showed that in 2011")
    splits, _ = load_summarization_splits(SummarizationDataArguments(train_file=str(data_dir / "pubmed/train.txt")))
    assert splits["train"]["summary"][0] == first["summary"]


def test_summarization_columns_are_checked(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"body": "x", "tldr": "y"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="Cannot find document/summary columns .* body, tldr"):
        load_summarization_splits(SummarizationDataArguments(train_file=str(path)))
    splits, _ = load_summarization_splits(
        SummarizationDataArguments(train_file=str(path), text_column="body", summary_column="tldr")
    )
    assert splits["train"] == {"document": ["x"], "summary": ["y"]}
    # One column given: the other comes from the known pair that agrees with it (was `KeyError: None`).
    pair = tmp_path / "p.jsonl"
    pair.write_text('{"article": "a", "highlights": "h", "abstract": "s"}\n', encoding="utf-8")
    for given, summary in (({"text_column": "article"}, "h"), ({"summary_column": "abstract"}, "s")):
        splits, _ = load_summarization_splits(SummarizationDataArguments(train_file=str(pair), **given))
        assert splits["train"] == {"document": ["a"], "summary": [summary]}
    with pytest.raises(ValueError, match="to go with `text_column=body`; pass"):
        load_summarization_splits(SummarizationDataArguments(train_file=str(path), text_column="body"))
    empty = tmp_path / "e.jsonl"
    empty.write_text('{"document": "x", "summary": ""}\n{"document": "z", "summary": "w"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="empty or missing summary"):
        load_summarization_splits(SummarizationDataArguments(train_file=str(empty)))
    splits, report = load_summarization_splits(SummarizationDataArguments(train_file=str(empty), skip_empty_rows=True))
    assert splits["train"]["document"] == ["z"] and report.counts["train_dropped_empty_rows"] == 1


# ---------------------------------------------------------------------------------------------------------------------
# MLM collator
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def _features(tokenizer, texts):
    return [dict(tokenizer(t)) for t in texts]


def test_mlm_masks_do_not_depend_on_batch_composition(tokenizer):
    texts = ["the album was released in the united states", "he was born in the city of york in 1990", "a b c"]
    collator = MLMCollator(tokenizer, mlm_probability=0.4, seed=3)
    together = collator(_features(tokenizer, texts))
    for row, text in enumerate(texts):
        alone = collator(_features(tokenizer, [text]))
        n = alone["input_ids"].shape[1]
        assert torch.equal(together["input_ids"][row, :n], alone["input_ids"][0])
        assert torch.equal(together["labels"][row, :n], alone["labels"][0])
        assert (together["labels"][row, n:] == -100).all()


def test_mlm_masks_follow_seed_and_epoch_and_spare_special_tokens(tokenizer):
    # Distinct rows: a row's mask is a function of its ids, so identical rows would all repeat one row's ~8 draws
    # and the 80% [MASK] share below would rest on those alone (it failed with 4 of 8 on transformers 5.17).
    texts = [f"the album {word} was released in the united states of america in the year" for word in "abcdefgh"]
    features = _features(tokenizer, texts)
    collator = MLMCollator(tokenizer, mlm_probability=0.5, seed=0)
    first = collator(features)
    assert torch.equal(first["labels"], collator(features)["labels"])
    collator.epoch = 1
    assert not torch.equal(first["labels"], collator(features)["labels"])
    specials = torch.tensor(tokenizer.all_special_ids)
    original = torch.tensor(features[0]["input_ids"])
    selected = first["labels"] != -100
    assert not torch.isin(original, specials)[selected[0]].any()
    # Unselected positions keep their token; selected ones carry the original id as label.
    assert torch.equal(first["input_ids"][0][~selected[0]], original[~selected[0]])
    assert torch.equal(first["labels"][0][selected[0]], original[selected[0]])
    assert (first["input_ids"][selected] == tokenizer.mask_token_id).float().mean() > 0.5


# ---------------------------------------------------------------------------------------------------------------------
# Arguments, model building, checkpoints
# ---------------------------------------------------------------------------------------------------------------------


def test_recipe_values_are_overridden_by_flags_and_unknown_keys_rejected(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "config_path: configs/models/dense_transformer/tiny.json\ntokenizer_name_or_path: tok\ntrain_file: a.txt\n"
        "learning_rate: 1.0e-4\nconfig_overrides:\n  hidden_dropout_prob: 0.0\noutput_dir: out\n",
        encoding="utf-8",
    )
    from attnzoo.training import MLMDataArguments

    types = (ModelArguments, MLMDataArguments, TrainingArguments)
    model_args, data_args, training_args = parse_arguments(types, [str(recipe), "--learning_rate", "3e-3"])
    assert training_args.learning_rate == pytest.approx(3e-3)
    assert model_args.config_overrides == {"hidden_dropout_prob": 0.0}
    assert data_args.train_file == "a.txt" and training_args.output_dir == "out"
    recipe.write_text(recipe.read_text() + "learning_rat: 1.0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="Unknown keys in the recipe: learning_rat"):
        parse_arguments(types, [str(recipe)])
    with pytest.raises(ValueError, match="Recipe file not found"):
        parse_arguments(types, [str(tmp_path / "missing.yaml")])


def test_bad_model_arguments_are_clear_errors(tokenizer):
    with pytest.raises(ValueError, match="config_path"):
        ModelArguments()
    args = ModelArguments(
        config_path=str(REPO_ROOT / "configs/models/dense_transformer/tiny.json"),
        tokenizer_name_or_path="unused",
        config_overrides="hidden_dropout=0.0",
    )
    with pytest.raises(ValueError, match="Unknown config field"):
        build_model(AutoModelForMaskedLM, args, tokenizer)


def test_an_empty_config_path_clears_a_recipes_so_family_can_convert():
    # `--config_path ""` over a recipe (every bundled one sets it) was refused as "family and config_path".
    given = {"model_name_or_path": "bert", "family": "sbm", "max_position_embeddings": 1024}
    args = ModelArguments(config_path="", tokenizer_name_or_path="", **given)
    assert (args.config_path, args.family, args.tokenizer_name_or_path) == (None, "sbm", "bert")


def test_fresh_model_takes_vocabulary_and_overrides(tokenizer):
    args = ModelArguments(
        config_path=str(REPO_ROOT / "configs/models/dense_transformer/tiny.json"),
        tokenizer_name_or_path="unused",
        config_overrides="hidden_dropout_prob=0.0,num_hidden_layers=1",
    )
    model, info = build_model(AutoModelForMaskedLM, args, tokenizer)
    assert model.config.vocab_size == len(tokenizer)
    assert (model.config.hidden_dropout_prob, model.config.num_hidden_layers) == (0.0, 1)
    assert info["init"] == "scratch"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_warm_start_loads_a_dense_checkpoint_name_for_name(tmp_path, tokenizer, family):
    dense_args = ModelArguments(
        config_path=str(REPO_ROOT / "configs/models/dense_transformer/tiny.json"), tokenizer_name_or_path="x"
    )
    dense, _ = build_model(AutoModelForMaskedLM, dense_args, tokenizer)
    dense.save_pretrained(tmp_path / "dense")
    saved = load_file(tmp_path / "dense" / "model.safetensors")
    args = ModelArguments(
        config_path=str(REPO_ROOT / "configs/models" / family / "tiny.json"),
        model_name_or_path=str(tmp_path / "dense"),
        tokenizer_name_or_path="x",
    )
    model, info = build_model(AutoModelForMaskedLM, args, tokenizer)
    assert info["init"] == "warm_start"
    assert type(model) is attnzoo.testing.family_by_name(family).masked_lm_class
    state = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    # The report lists exactly the method's own new parameters (none of the shared layout).
    assert set(info["missing_keys"]) == {k for k, _ in model.named_parameters()} - set(saved)
    assert info["unexpected_keys"] == [] and info["mismatched_keys"] == []


def test_warm_start_into_other_sizes_names_them(tmp_path, tokenizer):
    # transformers stopped with a traceback about `ignore_mismatched_sizes` after a 30-row mismatch report.
    dense_args = ModelArguments(
        config_path=str(REPO_ROOT / "configs/models/dense_transformer/tiny.json"), tokenizer_name_or_path="x"
    )
    dense, _ = build_model(AutoModelForMaskedLM, dense_args, tokenizer)
    dense.save_pretrained(tmp_path / "dense")
    wider = ModelArguments(
        config_path=str(REPO_ROOT / "configs/models/sbm/small.json"),
        model_name_or_path=str(tmp_path / "dense"),
        tokenizer_name_or_path="x",
    )
    small = attnzoo.SBMConfig.from_pretrained(wider.config_path)
    expected = f"hidden_size {dense.config.hidden_size} (checkpoint) vs {small.hidden_size} (config_path)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        build_model(AutoModelForMaskedLM, wider, tokenizer)


def test_a_checkpoint_keeps_its_position_type(tmp_path, tokenizer):
    """Loading under another `position_embedding_type` would drop the trained table with only a log line."""
    dense_args = ModelArguments(
        config_path=str(REPO_ROOT / "configs/models/dense_transformer/tiny.json"), tokenizer_name_or_path="x"
    )
    dense, _ = build_model(AutoModelForMaskedLM, dense_args, tokenizer)
    dense.save_pretrained(tmp_path / "dense")

    def args(position_embedding_type: str, **fields: str) -> ModelArguments:
        return ModelArguments(
            model_name_or_path=str(tmp_path / "dense"),
            tokenizer_name_or_path="x",
            config_overrides=f"position_embedding_type={position_embedding_type}",
            **fields,
        )

    with pytest.raises(ValueError, match="position_embedding_type='sinusoidal'.*checkpoint's 'absolute'"):
        build_model(AutoModelForMaskedLM, args("sinusoidal"), tokenizer)
    warm = args("sinusoidal", config_path=str(REPO_ROOT / "configs/models/sparse_transformer/tiny.json"))
    with pytest.raises(ValueError, match="trained positions would be lost"):
        build_model(AutoModelForMaskedLM, warm, tokenizer)
    # The checkpoint's own type is accepted, stated or not.
    model, _ = build_model(AutoModelForMaskedLM, args("absolute"), tokenizer)
    torch.testing.assert_close(
        model.model.encoder.embeddings.position_embeddings.weight,
        dense.model.encoder.embeddings.position_embeddings.weight,
    )


def test_resolve_checkpoint_refuses_to_train_over_a_run(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    args = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=None)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        resolve_checkpoint(args)
    args.resume_from_checkpoint = "last"
    assert Path(resolve_checkpoint(args)).name == "checkpoint-4"
    args.output_dir = str(tmp_path / "fresh")
    assert resolve_checkpoint(SimpleNamespace(output_dir=args.output_dir, resume_from_checkpoint=None)) is None
    with pytest.raises(ValueError, match="has none"):
        resolve_checkpoint(args)


# ---------------------------------------------------------------------------------------------------------------------
# Dataset-name sources (a local folder laid out like a Hub dataset: split-named parquet files)
# ---------------------------------------------------------------------------------------------------------------------


def _hub_like(folder: Path, splits: dict[str, dict], features=None) -> str:
    from datasets import Dataset

    folder.mkdir()
    for split, columns in splits.items():
        Dataset.from_dict(columns, features=features).to_parquet(folder / f"{split}.parquet")
    return str(folder)


def test_glue_task_from_a_dataset_name(tmp_path):
    from datasets import ClassLabel, Features, Value

    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])})
    name = _hub_like(
        tmp_path / "glue_sst2",
        {"train": {"sentence": ["good", "bad"], "label": [1, 0]}, "validation": {"sentence": ["fine"], "label": [1]}},
        features,
    )
    data = load_classification_splits(_classification(task_name="sst2", dataset_name=name))
    assert data.splits["train"] == {"text": ["good", "bad"], "text_pair": None, "label": [1, 0]}
    assert data.splits["validation"]["label"] == [1]
    assert data.label_names == ["negative", "positive"]


def test_text_classification_label_names_come_from_the_dataset_features(tmp_path):
    from datasets import ClassLabel, Features, Value

    features = Features({"text": Value("string"), "label": ClassLabel(names=["World", "Sports"])})
    name = _hub_like(tmp_path / "news", {"train": {"text": ["a", "b"], "label": [1, 0]}}, features)
    data = load_classification_splits(_classification(dataset_name=name))
    assert data.label_names == ["World", "Sports"] and data.splits["train"]["label"] == [1, 0]


def test_summarization_and_mlm_from_a_dataset_name(tmp_path):
    from attnzoo.training import MLMDataArguments, load_mlm_texts

    name = _hub_like(
        tmp_path / "cnn",
        {
            "train": {"article": ["long text one", "long text two"], "highlights": ["one.\nfirst", "two"]},
            "validation": {"article": ["long text three"], "highlights": ["three"]},
        },
    )
    splits, report = load_summarization_splits(SummarizationDataArguments(dataset_name=name))
    assert splits["train"]["summary"] == ["one.\nfirst", "two"]
    assert report.counts == {"train_examples": 2, "validation_examples": 1}
    texts = load_mlm_texts(MLMDataArguments(dataset_name=name, text_column="article"), "train")
    assert texts == ["long text one", "long text two"]


def test_stop_callbacks_stop_at_a_step_or_after_a_time_budget():
    from transformers import TrainerControl, TrainerState

    from attnzoo.training import StopAtStepCallback, TimeLimitCallback

    state, control = TrainerState(), TrainerControl()
    state.global_step = 1
    assert not StopAtStepCallback(2).on_step_end(None, state, control).should_training_stop
    state.global_step = 2
    stopped = StopAtStepCallback(2).on_step_end(None, state, TrainerControl())
    assert stopped.should_training_stop and stopped.should_save
    patient, eager = TimeLimitCallback(3600.0), TimeLimitCallback(0.0)
    for callback in (patient, eager):
        callback.on_train_begin(None, state, TrainerControl())
    assert not patient.on_step_end(None, state, TrainerControl()).should_training_stop
    assert eager.on_step_end(None, state, TrainerControl()).should_training_stop

"""Tests for `attnzoo.tokenization`, `scripts/train_tokenizer.py` and the bundled data slices they read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from attnzoo.tokenization import (
    SPECIAL_TOKENS,
    iter_texts_from_dataset,
    iter_texts_from_files,
    train_wordpiece_tokenizer,
)
from source_checkout import load_script

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "tests" / "fixtures" / "data"
WIKITEXT_TRAIN = DATA / "text" / "wikitext_train.txt"
SCRIPT = REPO_ROOT / "scripts" / "train_tokenizer.py"

# Words that occur often in the WikiText slice, so the round trip does not depend on [UNK] handling.
SENTENCE = "The Album Was Released In The United States"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    # One small training run shared by the module keeps the file well under its time budget.
    return train_wordpiece_tokenizer(iter_texts_from_files(WIKITEXT_TRAIN), vocab_size=2000, model_max_length=128)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------------------------
# Trained tokenizer
# --------------------------------------------------------------------------------------------------------------------


def test_special_tokens_have_fixed_ids(tokenizer):
    assert SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3, 4]
    # The model configs hard-code these ids.
    assert tokenizer.pad_token_id == 0
    assert tokenizer.unk_token_id == 1
    assert tokenizer.cls_token_id == tokenizer.bos_token_id == 2
    assert tokenizer.sep_token_id == tokenizer.eos_token_id == 3
    assert tokenizer.mask_token_id == 4
    assert 1000 < len(tokenizer) <= 2000
    assert tokenizer.model_max_length == 128
    assert tokenizer.padding_side == "right"


_TRAIN_AND_PRINT = """
import json, sys
from attnzoo.tokenization import iter_texts_from_files, train_wordpiece_tokenizer
tokenizer = train_wordpiece_tokenizer(iter_texts_from_files(sys.argv[1]), vocab_size=600)
print(json.dumps(tokenizer.get_vocab(), sort_keys=True))
"""


def test_the_same_corpus_gives_the_same_ids_in_every_process():
    # The trainer breaks frequency ties in hash-map order, seeded per process: two processes, not two calls.
    command = [sys.executable, "-c", _TRAIN_AND_PRINT, str(WIKITEXT_TRAIN)]
    vocabs = [json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout) for _ in range(2)]
    assert vocabs[0] == vocabs[1]
    assert len(vocabs[0]) == 600


def test_renumbering_keeps_every_split(tokenizer):
    # Characters come before longer pieces; every word splits into pieces of the vocabulary, [UNK] only for unknown
    # characters.
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS), len(tokenizer))))
    lengths = [len(token.removeprefix("##")) for token in tokens]
    first_long = next(index for index, length in enumerate(lengths) if length > 1)
    assert set(lengths[:first_long]) == {1} and min(lengths[first_long:]) > 1
    assert tokenizer.tokenize("the album was released") == ["the", "album", "was", "released"]
    assert tokenizer.unk_token not in tokenizer.tokenize("unbelievably overwhelming")


def test_encode_decode_round_trip(tokenizer):
    ids = tokenizer(SENTENCE)["input_ids"]
    assert ids[0] == tokenizer.cls_token_id
    assert ids[-1] == tokenizer.sep_token_id
    assert tokenizer.unk_token_id not in ids
    # The WordPiece decoder glues `##` pieces back together; the uncased normalizer lowercases.
    assert tokenizer.decode(ids, skip_special_tokens=True) == SENTENCE.lower()


def test_accents_are_stripped_when_lowercasing(tokenizer):
    assert tokenizer.tokenize("Café") == tokenizer.tokenize("cafe")


def test_cased_tokenizer_keeps_case():
    cased = train_wordpiece_tokenizer(iter_texts_from_files(WIKITEXT_TRAIN), vocab_size=2000, lowercase=False)
    ids = cased(SENTENCE)["input_ids"]
    assert cased.decode(ids, skip_special_tokens=True) == SENTENCE
    assert cased.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3, 4]


def test_pair_encoding_has_token_types_and_separators(tokenizer):
    first, second = "the album was released", "it was a success"
    encoding = tokenizer(first, second)
    ids, types = encoding["input_ids"], encoding["token_type_ids"]
    n_first = len(tokenizer.tokenize(first))
    n_second = len(tokenizer.tokenize(second))
    assert len(ids) == n_first + n_second + 3
    assert ids[0] == tokenizer.cls_token_id
    sep_positions = [i for i, token_id in enumerate(ids) if token_id == tokenizer.sep_token_id]
    assert sep_positions == [n_first + 1, len(ids) - 1]
    # [CLS] A [SEP] are segment 0; B [SEP] are segment 1.
    assert types == [0] * (n_first + 2) + [1] * (n_second + 1)


def test_batch_padding_is_on_the_right(tokenizer):
    batch = tokenizer(["the album", "the album was released in the united states"], padding=True)
    short, long = batch["input_ids"]
    assert len(short) == len(long)
    n_real = sum(batch["attention_mask"][0])
    assert short[n_real:] == [tokenizer.pad_token_id] * (len(short) - n_real)
    assert short[n_real - 1] == tokenizer.sep_token_id


def test_truncation_uses_model_max_length(tokenizer):
    ids = tokenizer(" ".join(["the"] * 500), truncation=True)["input_ids"]
    assert len(ids) == 128
    assert ids[-1] == tokenizer.sep_token_id


def test_mask_token_survives_normalization(tokenizer):
    # A fill-mask input: [MASK] must stay one special token even though the normalizer lowercases text.
    text = f"the album was {tokenizer.mask_token} in the united states"
    encoding = tokenizer(text)
    assert tokenizer.mask_token_id == 4
    assert encoding["input_ids"].count(4) == 1
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    assert tokens.index("[MASK]") == 1 + len(tokenizer.tokenize("the album was"))


def test_save_and_reload_with_auto_tokenizer(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for args in [(SENTENCE,), ("the album was released", "it was a success"), (f"a {tokenizer.mask_token} b",)]:
        assert reloaded(*args) == tokenizer(*args)
    assert reloaded.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3, 4]
    assert (reloaded.bos_token, reloaded.eos_token) == ("[CLS]", "[SEP]")
    assert reloaded.model_max_length == 128
    assert reloaded.padding_side == "right"
    assert reloaded.decode(reloaded(SENTENCE)["input_ids"], skip_special_tokens=True) == SENTENCE.lower()


@pytest.mark.parametrize(
    ("kwargs", "texts", "needle"),
    [
        ({"vocab_size": len(SPECIAL_TOKENS)}, ["some text"], "vocab_size"),
        ({"vocab_size": 0}, ["some text"], "vocab_size"),
        ({"min_frequency": -1}, ["some text"], "min_frequency"),
        ({"model_max_length": 0}, ["some text"], "model_max_length"),
        ({}, [], "empty corpus"),
        ({}, ["", "   ", "\n"], "empty corpus"),
    ],
)
def test_training_rejects_bad_arguments(kwargs, texts, needle):
    with pytest.raises(ValueError, match=needle):
        train_wordpiece_tokenizer(texts, **kwargs)


def test_training_rejects_a_bare_string():
    with pytest.raises(TypeError, match="single string"):
        train_wordpiece_tokenizer("a whole corpus in one string")


# --------------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------------


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_cli_trains_and_saves_a_loadable_tokenizer(tmp_path):
    out = tmp_path / "tokenizer"
    story = sorted((DATA / "cnn_dailymail" / "cnn_stories").glob("*.story"))[0]
    args = ["--files", str(WIKITEXT_TRAIN), str(story), "--vocab_size", "1500", "--model_max_length", "256"]
    result = _run_cli(*args, "--output_dir", str(out))
    assert result.returncode == 0, result.stderr
    assert "vocab size:" in result.stdout
    assert "[CLS]" in result.stdout
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3, 4]
    assert reloaded.model_max_length == 256
    assert reloaded.decode(reloaded(SENTENCE)["input_ids"], skip_special_tokens=True) == SENTENCE.lower()


def test_cli_reports_a_missing_file(tmp_path, capsys):
    missing = tmp_path / "no_such_corpus.txt"
    status = load_script("train_tokenizer").main(["--files", str(missing), "--output_dir", str(tmp_path / "out")])
    assert status == 2
    assert "no_such_corpus.txt" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_rejects_dataset_options_with_files(tmp_path):
    with pytest.raises(SystemExit):
        load_script("train_tokenizer").parse_args(
            ["--files", "a.txt", "--split", "dev", "--output_dir", str(tmp_path)]
        )


# --------------------------------------------------------------------------------------------------------------------
# Corpus readers
# --------------------------------------------------------------------------------------------------------------------


def test_txt_reader_yields_stripped_non_blank_lines(tmp_path):
    path = _write(tmp_path / "corpus.txt", " first line \n\n   \nsecond line\n")
    assert list(iter_texts_from_files(path)) == ["first line", "second line"]


def test_a_txt_file_of_json_lines_is_read_as_text_with_a_warning(tmp_path, caplog):
    # The bundled PubMed file is JSON lines named .txt: a tokenizer learnt its braces and field names silently.
    path = _write(tmp_path / "pubmed.txt", '{"article_text": ["a b"]}\n{"article_text": ["c"]}\n')
    plain = _write(tmp_path / "plain.txt", "{ not json\nsecond\n")
    with caplog.at_level("WARNING", logger="attnzoo.tokenization"):
        assert list(iter_texts_from_files(path))[0] == '{"article_text": ["a b"]}'
        assert "its first line is a JSON object" in caplog.text
        caplog.clear()
        assert list(iter_texts_from_files(plain)) == ["{ not json", "second"]
        assert caplog.text == ""


def test_files_are_read_in_order(tmp_path):
    first = _write(tmp_path / "a.txt", "one\n")
    second = _write(tmp_path / "b.txt", "two\n")
    assert list(iter_texts_from_files([str(second), first])) == ["two", "one"]


def test_jsonl_reader(tmp_path):
    records = [
        {"id": 1, "text": "alpha", "title": "x"},
        {"id": 2, "text": "", "title": "y"},
        {"id": 3, "text": "beta", "title": "z"},
    ]
    path = _write(tmp_path / "corpus.jsonl", "\n".join(json.dumps(r) for r in records) + "\n\n")
    assert list(iter_texts_from_files(path)) == ["alpha", "beta"]
    assert list(iter_texts_from_files(path, text_column="title")) == ["x", "y", "z"]


def test_jsonl_reader_joins_sentence_lists_and_picks_the_only_string_field(tmp_path):
    # PubMed (Cohan et al.) stores documents as lists of sentences.
    path = _write(tmp_path / "pubmed.jsonl", json.dumps({"article_id": 7, "abstract": ["one .", "two ."]}) + "\n")
    assert list(iter_texts_from_files(path, text_column="abstract")) == ["one . two ."]
    path = _write(tmp_path / "single.json", json.dumps({"n": 1, "body": "only string"}) + "\n")
    assert list(iter_texts_from_files(path)) == ["only string"]


def test_json_array_reader(tmp_path):
    path = _write(tmp_path / "array.json", json.dumps([{"text": "a"}, {"text": "b"}]))
    assert list(iter_texts_from_files(path)) == ["a", "b"]


def test_tsv_reader_keeps_glue_quotes_literally(tmp_path):
    # GLUE TSVs are not CSV-quoted: a field that starts with a quote is plain text.
    path = _write(tmp_path / "train.tsv", 'sentence\tlabel\n" hi , " he said .\t1\nplain text\t0\n')
    assert list(iter_texts_from_files(path)) == ['" hi , " he said .', "plain text"]


def test_tsv_reader_unquotes_csv_written_files(tmp_path):
    path = _write(tmp_path / "imdb.tsv", 'text\tlabel\n"He said ""wow"" twice"\t1\nno quotes\t0\n')
    assert list(iter_texts_from_files(path)) == ['He said "wow" twice', "no quotes"]


def test_tsv_reader_column_by_name_bom_and_index(tmp_path):
    # MRPC starts with a byte-order mark and has no `text`/`sentence` column.
    path = tmp_path / "mrpc.tsv"
    path.write_bytes("\ufeffQuality\t#1 String\t#2 String\n1\tleft one\tright one\n".encode())
    assert list(iter_texts_from_files(path, text_column="#2 String")) == ["right one"]
    assert list(iter_texts_from_files(path, text_column="Quality")) == ["1"]
    # CoLA has no header: select the sentence by position and keep the first row.
    cola = _write(tmp_path / "cola.tsv", "gj04\t1\t\tFirst sentence .\ngj04\t0\t*\tSecond sentence .\n")
    assert list(iter_texts_from_files(cola, text_column=3)) == ["First sentence .", "Second sentence ."]


def test_csv_reader(tmp_path):
    path = _write(tmp_path / "corpus.csv", 'label,text\n1,"comma, inside"\n0,plain\n')
    assert list(iter_texts_from_files(path)) == ["comma, inside", "plain"]


def test_story_reader_drops_highlight_markers(tmp_path):
    story = "(CNN) First paragraph.\n\nSecond paragraph.\n\n@highlight\n\nSummary one\n\n@highlight\n\nSummary two"
    path = _write(tmp_path / "abc.story", story)
    assert list(iter_texts_from_files(path)) == [
        "(CNN) First paragraph.",
        "Second paragraph.",
        "Summary one",
        "Summary two",
    ]


@pytest.mark.parametrize(
    ("filename", "content", "kwargs", "needle"),
    [
        ("corpus.xml", "<doc/>", {}, r"\.xml"),
        ("table.tsv", "id\tbody\n1\tx\n", {}, "Cannot pick the text column"),
        ("table.tsv", "id\tbody\n1\tx\n", {"text_column": "review"}, "review"),
        ("table.csv", "id,body\n1,x\n", {"text_column": 5}, "Column index 5"),
        ("rows.jsonl", '{"a": "x", "b": "y"}\n', {}, "Cannot pick the text column"),
        ("rows.jsonl", '{"a": "x"}\n', {"text_column": "content"}, "content"),
        ("rows.jsonl", "{not json}\n", {}, "Invalid JSON on line 1"),
        ("rows.jsonl", '{"a": "x"}\n', {"text_column": 0}, "integer"),
    ],
)
def test_readers_reject_bad_inputs(tmp_path, filename, content, kwargs, needle):
    path = _write(tmp_path / filename, content)
    with pytest.raises(ValueError, match=needle):
        # Validation happens at the call, before any text is consumed.
        iter_texts_from_files(path, **kwargs)


def test_reader_rejects_a_missing_file_and_no_files(tmp_path):
    with pytest.raises(ValueError, match="missing_corpus.txt"):
        iter_texts_from_files(tmp_path / "missing_corpus.txt")
    with pytest.raises(ValueError, match="empty"):
        iter_texts_from_files([])


def test_dataset_reader_with_a_packaged_builder(tmp_path):
    path = _write(tmp_path / "corpus.txt", "first line\n\nsecond line\n")
    cache = str(tmp_path / "cache")
    assert list(iter_texts_from_dataset("text", data_files=str(path), cache_dir=cache)) == [
        "first line",
        "second line",
    ]
    # A local data file picks its builder from the extension.
    table = _write(tmp_path / "train.tsv", "sentence\tlabel\nhello there\t1\n")
    assert list(iter_texts_from_dataset(str(table), text_column="sentence", cache_dir=cache)) == ["hello there"]
    with pytest.raises(ValueError, match="body"):
        iter_texts_from_dataset("text", data_files=str(path), text_column="body", cache_dir=cache)
    with pytest.raises(ValueError, match="validation"):
        iter_texts_from_dataset("text", data_files=str(path), split="validation", cache_dir=cache)


# --------------------------------------------------------------------------------------------------------------------
# Bundled data slices (tests/fixtures/data, see its SOURCES.md)
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative_path", "header", "n_rows", "n_columns"),
    [
        ("glue/SST-2/train.tsv", "sentence\tlabel", 4000, 2),
        ("glue/SST-2/dev.tsv", "sentence\tlabel", 800, 2),
        ("glue/CoLA/train.tsv", None, 200, 4),
        ("glue/MRPC/train.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String", 200, 5),
        ("glue/RTE/train.tsv", "index\tsentence1\tsentence2\tlabel", 200, 4),
        ("glue/QNLI/dev.tsv", "question\tsentence\tlabel", 200, 3),
        ("agnews/train.tsv", None, 500, 2),
        ("imdb/train.tsv", "text\tlabel", 313, 2),
    ],
)
def test_bundled_tables_keep_their_layout(relative_path, header, n_rows, n_columns):
    lines = (DATA / relative_path).read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # ends with a newline, like the originals
    lines = lines[:-1]
    if header is not None:
        assert lines[0] == header
        lines = lines[1:]
    assert len(lines) == n_rows
    assert all(line.count("\t") == n_columns - 1 for line in lines)


def test_bundled_sst2_splits_are_disjoint_and_have_both_labels():
    train = (DATA / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    dev = (DATA / "glue/SST-2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert not {line.split("\t")[0] for line in train} & {line.split("\t")[0] for line in dev}
    for rows in (train, dev):
        assert {line.split("\t")[1] for line in rows} == {"0", "1"}


def test_bundled_text_json_and_story_slices():
    assert len((DATA / "text/wikitext_train.txt").read_text(encoding="utf-8").split("\n")) == 3001
    assert len((DATA / "text/wikitext_valid.txt").read_text(encoding="utf-8").split("\n")) == 301
    for name, n_records in [("train.txt", 8), ("validation.txt", 3)]:
        records = [json.loads(line) for line in (DATA / "pubmed" / name).read_text(encoding="utf-8").splitlines()]
        assert len(records) == n_records
        assert all({"article_id", "article_text", "abstract_text", "section_names"} <= set(r) for r in records)
    stories = sorted((DATA / "cnn_dailymail" / "cnn_stories").glob("*.story"))
    assert len(stories) == 20
    assert all("@highlight" in story.read_text(encoding="utf-8") for story in stories)
    assert (DATA / "SOURCES.md").is_file()

"""Assembling the Hub folder of a checkpoint, loading it without attnzoo, and the upload path (mocked)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch

import attnzoo
from attnzoo.hub import AUTO_CLASSES, PublishError, PublishOptions, assemble, generate_remote_code, upload
from source_checkout import REPO_ROOT, load_script

FAMILIES = [pytest.param(family, id=family.name) for family in attnzoo.FAMILIES.values()]
LOADER = Path(__file__).with_name("remote_loader.py")
#: `Family.heads` key -> (Family attribute of the class, Auto class, output compared).
HEADS: dict[str, tuple[str, str, str]] = {
    "base": ("model_class", "AutoModel", "last_hidden_state"),
    "masked_lm": ("masked_lm_class", "AutoModelForMaskedLM", "logits"),
    "sequence_classification": ("sequence_classification_class", "AutoModelForSequenceClassification", "logits"),
    "conditional_generation": ("conditional_generation_class", "AutoModelForSeq2SeqLM", "logits"),
}


@pytest.fixture(scope="module")
def card_dir(tmp_path_factory) -> Path:
    """The repository's model cards, with a stub for a family whose card is not written yet (test_card checks them)."""
    folder = tmp_path_factory.mktemp("model_cards")
    for path in (REPO_ROOT / "model_cards").glob("*.md"):
        (folder / path.name).write_text(path.read_text())
    for family in attnzoo.FAMILIES.values():
        if not (folder / f"{family.name}.md").is_file():
            (folder / f"{family.name}.md").write_text(f"# {family.name}\n\nCard not written yet.\n")
    return folder


def _options(checkpoint: Path, output: Path, card_dir: Path, **overrides) -> PublishOptions:
    fields = {
        "card_dir": str(card_dir),
        "checkpoint": str(checkpoint),
        "output_dir": str(output),
        "repo_id": "attnzoo-test/tiny",
        "metrics": str(checkpoint / "metrics.json"),
        "dataset_name": "GLUE SST-2",
        "dataset_id": "nyu-mll/glue",
        "dataset_config": "sst2",
        **overrides,
    }
    return PublishOptions(**fields)


def _expected_outputs(model: torch.nn.Module, head: str) -> dict:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, 150, (2, 16), generator=generator)
    input_ids[:, 0] = 2
    input_ids[1, 11:] = 0  # padding: the remote model must handle the mask the same way
    inputs = {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}
    expected = {}
    if head == "conditional_generation":
        expected["generate_inputs"] = dict(inputs)
        inputs["decoder_input_ids"] = torch.randint(5, 150, (2, 6), generator=generator)
    with torch.no_grad():
        expected["output"] = getattr(model(**inputs), HEADS[head][2])
        if head == "conditional_generation":
            expected["generated"] = model.generate(**expected["generate_inputs"], max_new_tokens=4, do_sample=False)
    expected["inputs"] = inputs
    return expected


@pytest.mark.slow  # long for the default suite's 8-minute budget; CI runs the default suite
def test_published_folders_load_without_attnzoo_through_every_auto_class(make_checkpoint, card_dir, tmp_path):
    """
    One child process loads every family's published folders (attnzoo blocked, offline, fresh HF_HOME) and gets the
    package's outputs. One process for all six (a child pays about 10 s of imports) also shows that the families'
    remote modules live side by side.
    """

    def published(family, head: str, folder: Path, **fields) -> dict:
        attribute, auto_class, output_name = HEADS[head]
        checkpoint = make_checkpoint(family, head, folder / f"checkpoint-{head}", **fields)
        assembled = assemble(_options(checkpoint, folder / head, card_dir))
        model = getattr(family, attribute).from_pretrained(checkpoint).eval()
        expected = folder / f"expected-{head}.pt"
        torch.save(_expected_outputs(model, head), expected)
        return {
            "folder": str(assembled.folder),
            "auto_class": auto_class,
            "class_name": getattr(family, attribute).__name__,
            "output": output_name,
            "expected": str(expected),
            "generate_kwargs": {"max_new_tokens": 4, "do_sample": False},
        }

    families = [
        {
            "name": family.name,
            "config_class": family.config_class.__name__,
            "heads": [published(family, head, tmp_path / family.name) for head in HEADS],
        }
        for family in attnzoo.FAMILIES.values()
    ]
    # A seq2seq model with the copy head: its module is flattened into the remote code too.
    copying = attnzoo.FAMILIES["sparse_transformer"]
    head = published(copying, "conditional_generation", tmp_path / "copy", copy_from_source=True)
    families.append({"name": "copy", "config_class": copying.config_class.__name__, "heads": [head]})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"families": families}))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_MODULES_CACHE": str(tmp_path / "hf_modules"),
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-I", str(LOADER), str(spec)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for family in families:
        for head in family["heads"]:
            assert f"ok {family['name']} {head['auto_class']} transformers_modules." in result.stdout, output
    assert "Do you wish to run the custom code" not in output
    # Nothing leaked into the user's caches: the modules went to the temporary HF_MODULES_CACHE.
    assert any((tmp_path / "hf_modules").rglob("modeling_*.py"))


@pytest.mark.parametrize("family", FAMILIES)
def test_assembled_folder_holds_exactly_the_upload(family, make_checkpoint, card_dir, tmp_path):
    for head in ("masked_lm", "conditional_generation"):
        checkpoint = make_checkpoint(family, head, tmp_path / f"checkpoint-{head}")
        (checkpoint / "training_args.bin").write_bytes(b"not uploaded")
        assembled = assemble(_options(checkpoint, tmp_path / f"out-{head}", card_dir))
        code = generate_remote_code(family)
        expected = {"README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
        if head == "conditional_generation":
            expected.add("generation_config.json")
        assert assembled.files == sorted(expected | set(code.files))
        card = huggingface_hub.ModelCard.load(assembled.folder / "README.md")
        results = {(r.metric_type, r.dataset_split): r.metric_value for r in card.data.eval_results}
        assert results == {("accuracy", "validation"): 0.8125, ("loss", "validation"): 0.4375}  # conftest METRICS
        config = json.loads((assembled.folder / "config.json").read_text())
        assert config["model_type"] == family.model_type
        assert set(config["auto_map"]) == set(AUTO_CLASSES)
        for auto_class, reference in config["auto_map"].items():
            module, class_name = reference.split(".")
            tree = ast.parse((assembled.folder / f"{module}.py").read_text())
            defined = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
            assert class_name in defined, (auto_class, reference)
            assert class_name == getattr(family, AUTO_CLASSES[auto_class]).__name__


def test_generation_config_is_written_for_a_seq2seq_checkpoint_without_one(make_checkpoint, tmp_path):
    family = attnzoo.FAMILIES["dense_transformer"]
    checkpoint = make_checkpoint(family, "conditional_generation", tmp_path / "checkpoint")
    (checkpoint / "generation_config.json").unlink()
    assembled = assemble(_options(checkpoint, tmp_path / "out", REPO_ROOT / "model_cards"))
    generation = json.loads((assembled.folder / "generation_config.json").read_text())
    assert generation["decoder_start_token_id"] == 2


def test_a_copy_head_is_published_with_its_code_and_named_on_the_card(make_checkpoint, tmp_path):
    family = attnzoo.FAMILIES["sparse_transformer"]
    checkpoint = make_checkpoint(family, "conditional_generation", tmp_path / "checkpoint", copy_from_source=True)
    assembled = assemble(_options(checkpoint, tmp_path / "out", REPO_ROOT / "model_cards"))
    assert "copy head (pointer-generator" in (assembled.folder / "README.md").read_text()
    code = "\n".join(path.read_text() for path in assembled.folder.glob("*.py"))
    assert "class SourceCopyHead" in code


def test_the_card_folder_must_be_named(make_checkpoint, tmp_path):
    # The card texts live in a checkout's model_cards/, not in the installed package: the library cannot guess them.
    checkpoint = make_checkpoint(attnzoo.FAMILIES["dense_transformer"], "base", tmp_path / "checkpoint")
    options = _options(checkpoint, tmp_path / "out", REPO_ROOT / "model_cards")
    options.card_dir = None
    with pytest.raises(PublishError, match="`card_dir` is required"):
        assemble(options)


def test_sharded_weights_are_published_with_their_index(make_checkpoint, tmp_path):
    family = attnzoo.FAMILIES["dense_transformer"]
    checkpoint = make_checkpoint(family, "masked_lm", tmp_path / "checkpoint")
    (checkpoint / "model.safetensors").unlink()
    torch.manual_seed(0)
    model = family.masked_lm_class(family.config_class.from_pretrained(checkpoint))
    model.save_pretrained(checkpoint, max_shard_size="200KB")
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    assembled = assemble(_options(checkpoint, tmp_path / "out", REPO_ROOT / "model_cards"))
    assert {"model.safetensors.index.json", *shards} <= set(assembled.files)
    assert "model.safetensors" not in assembled.files
    (checkpoint / shards[-1]).unlink()
    with pytest.raises(PublishError, match="lists absent shards"):
        assemble(_options(checkpoint, tmp_path / "out2", REPO_ROOT / "model_cards"))


# --------------------------------------------------------------------------------------------------------------------
# scripts/publish.py: refusals and the upload path
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def publish_main():
    return load_script("publish").main


@pytest.fixture
def dense_checkpoint(make_checkpoint, tmp_path):
    return make_checkpoint(attnzoo.FAMILIES["dense_transformer"], "sequence_classification", tmp_path / "checkpoint")


def _argv(checkpoint: Path, output: Path, *extra: str) -> list[str]:
    return [
        "--checkpoint", str(checkpoint),
        "--output_dir", str(output),
        "--repo_id", "attnzoo-test/dense-tiny-sst2",
        "--metrics", str(checkpoint / "metrics.json"),
        "--dataset_name", "GLUE SST-2",
        *extra,
    ]  # fmt: skip


@pytest.fixture
def no_hub(monkeypatch):
    """Fail the test if anything reaches the Hub client."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the Hub was contacted")

    for name in ("create_repo", "upload_folder", "create_commit"):
        monkeypatch.setattr(huggingface_hub.HfApi, name, forbidden)


def _break_weights(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors").unlink()


def _break_model_type(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config["model_type"] = "not_a_zoo_model"
    (checkpoint / "config.json").write_text(json.dumps(config))


def _break_results(checkpoint: Path) -> None:
    (checkpoint / "metrics.json").write_text(json.dumps({"metrics": {"train_loss": 0.7, "eval_runtime": 2.0}}))


def _break_tokenizer(checkpoint: Path) -> None:
    (checkpoint / "tokenizer_config.json").unlink()


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (_break_weights, "Missing weights: no model.safetensors"),
        (_break_model_type, "Unknown model type 'not_a_zoo_model'"),
        (_break_results, "The card has no results"),
        (_break_tokenizer, "Missing tokenizer"),
    ],
    ids=["missing-weights", "unknown-model-type", "no-results", "missing-tokenizer"],
)
def test_publish_refuses_clear_mistakes(publish_main, dense_checkpoint, tmp_path, capsys, no_hub, breakage, message):
    breakage(dense_checkpoint)
    output = tmp_path / "out"
    assert publish_main(_argv(dense_checkpoint, output)) == 2
    assert message in capsys.readouterr().err
    assert not output.exists() or not any(output.iterdir())


def test_publish_refuses_a_repo_id_the_hub_would_refuse(publish_main, dense_checkpoint, tmp_path, capsys, no_hub):
    # It was written into the card's loading examples, and only the upload would have refused it.
    assert publish_main(_argv(dense_checkpoint, tmp_path / "out", "--repo_id", "not a repo")) == 2
    assert "`repo_id` 'not a repo' is not a Hub repository id" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_publish_refuses_a_non_empty_output_folder(publish_main, dense_checkpoint, tmp_path, capsys, no_hub):
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    assert publish_main(_argv(dense_checkpoint, output)) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (output / "keep.txt").read_text() == "mine"


def test_publish_without_push_only_writes_the_folder(publish_main, dense_checkpoint, tmp_path, capsys, no_hub):
    output = tmp_path / "out"
    assert publish_main(_argv(dense_checkpoint, output)) == 0
    assert "Not uploaded" in capsys.readouterr().out
    assert (output / "README.md").is_file() and (output / "modeling_dense_transformer.py").is_file()


def test_publish_push_uploads_exactly_the_folder(publish_main, dense_checkpoint, tmp_path, capsys, monkeypatch):
    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, allow_patterns=None, **kwargs):
        files = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
        calls.append(("upload_folder", repo_id, [f for f in files if f in allow_patterns], kwargs))
        return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    output = tmp_path / "out"
    argv = _argv(dense_checkpoint, output, "--push", "--token", "hf_fake", "--private")
    assert publish_main(argv) == 0
    assert [call[:2] for call in calls] == [
        ("create_repo", "attnzoo-test/dense-tiny-sst2"),
        ("upload_folder", "attnzoo-test/dense-tiny-sst2"),
    ]
    assert calls[0][2]["private"] is True and calls[0][2]["exist_ok"] is True
    code_files = sorted(generate_remote_code(attnzoo.FAMILIES["dense_transformer"]).files)
    assert calls[1][2] == sorted(
        ["README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", *code_files]
    )
    assert calls[1][3]["token"] == "hf_fake"
    assert "Uploaded to attnzoo-test/dense-tiny-sst2" in capsys.readouterr().out


def test_upload_records_repo_and_files_with_a_fake_api(dense_checkpoint, tmp_path):
    class FakeApi:
        def __init__(self):
            self.sent = []

        def create_repo(self, repo_id, **kwargs):
            self.sent.append(("create", repo_id, kwargs["repo_type"]))
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, allow_patterns, **kwargs):
            self.sent.append(("upload", repo_id, Path(folder_path), list(allow_patterns), kwargs["commit_message"]))
            return "commit-url"

    assembled = assemble(_options(dense_checkpoint, tmp_path / "out", REPO_ROOT / "model_cards"))
    api = FakeApi()
    assert upload(assembled, "org/dense-sst2", api=api) == "commit-url"
    assert api.sent == [
        ("create", "org/dense-sst2", "model"),
        ("upload", "org/dense-sst2", assembled.folder, assembled.files, "Upload dense_transformer model with attnzoo"),
    ]


def test_push_without_a_token_fails_before_contacting_the_hub(dense_checkpoint, tmp_path, monkeypatch, no_hub):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assembled = assemble(_options(dense_checkpoint, tmp_path / "out", REPO_ROOT / "model_cards"))
    with pytest.raises(PublishError, match="needs a Hub token"):
        upload(assembled, "org/dense-sst2")

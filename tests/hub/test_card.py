"""Model cards: the metrics JSON formats, the rendered metadata as huggingface_hub parses it, the method texts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from huggingface_hub import ModelCard

import attnzoo
from attnzoo.hub import CardError, CardInfo, parse_metrics, render_model_card
from attnzoo.hub.card import Result, nest_headings
from source_checkout import REPO_ROOT

CARD_DIR = REPO_ROOT / "model_cards"
FAMILIES = [pytest.param(family, id=family.name) for family in attnzoo.FAMILIES.values()]

#: A family card goes into every published model's README: the Hub shows it whole, so it stays short.
MAX_CARD_LINES = 150
#: Section headings every family card has (`## ...` in the card, one level deeper once rendered).
FORMULAS_HEADING, RESULTS_HEADING = "Formulas", "Results"
#: References that resolve in a checkout of the repository but not on the Hub: commit hashes (backticked, or bare hex
#: words with a digit and a letter), repository-relative paths, issue numbers, relative links.
HUB_UNREADABLE: dict[str, re.Pattern[str]] = {
    "a commit hash": re.compile(r"`[0-9a-f]{7,40}`|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "a repository path": re.compile(r"(?<![\w/.])(?:scripts|tests|models|configs)/"),
    "an issue reference": re.compile(r"\bissues?\s*#?\d+|(?<![\w&/])#\d+\b", re.IGNORECASE),
    "a link that is not an absolute URL": re.compile(r"\]\((?!https://)[^)]*\)"),
}
TABLE_RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


def test_metrics_of_the_training_scripts_and_of_trainer_are_accepted():
    nested = parse_metrics(
        {
            "metrics": {"train_loss": 0.5, "eval_accuracy": 0.81, "eval_loss": 0.43, "eval_runtime": 2.0, "epoch": 3},
            "global_step": 300,
            "data": {"train_examples": 800},
        }
    )
    assert nested.results == [Result("accuracy", 0.81, "validation"), Result("loss", 0.43, "validation")]
    assert nested.train == {"loss": 0.5}
    assert nested.run == {"global_step": 300, "data": {"train_examples": 800}}
    flat = parse_metrics(
        {"eval_rouge1": 35.2, "eval_samples_per_second": 9.1, "test_rougeL": 30.1, "eval_gen_len": 61}
    )
    assert flat.results == [
        Result("rouge1", 35.2, "validation"),
        Result("rougeL", 30.1, "test"),
        Result("gen_len", 61.0, "validation"),
    ]


@pytest.mark.parametrize("bad", [{"eval_accuracy": "high"}, {"eval_accuracy": True}, [0.8]])
def test_malformed_metrics_are_refused(bad):
    with pytest.raises(CardError):
        parse_metrics(bad)


def _info(family, metrics, **overrides) -> CardInfo:
    fields = {
        "repo_id": "org/tiny-sst2",
        "family_name": family.name,
        "model_type": family.model_type,
        "architecture": family.sequence_classification_class.__name__,
        "auto_class": "AutoModelForSequenceClassification",
        "task_type": "text-classification",
        "dataset_name": "GLUE SST-2",
        "dataset_id": "nyu-mll/glue",
        "dataset_config": "sst2",
        "metrics": metrics,
        "base_model": "org/tiny-pretrained",
        "training_summary": "Fine-tuned for 300 steps.",
        "model_summary": {"parameters": "1 M"},
        **overrides,
    }
    return CardInfo(**fields)


def _family_cards() -> list[Any]:
    return [pytest.param(path, id=path.stem) for path in sorted(CARD_DIR.glob("*.md")) if path.name != "TEMPLATE.md"]


def _hub_unreadable(text: str) -> list[str]:
    """`"<kind>: <match>"` for every reference in `text` that does not resolve on the Hub (see `HUB_UNREADABLE`)."""
    return [
        f"{kind}: {match.group(0)!r}" for kind, pattern in HUB_UNREADABLE.items() for match in pattern.finditer(text)
    ]


def _section(markdown: str, title: str) -> list[str]:
    """The lines of the section headed `title` (any level) up to the next heading of the same or a higher level,
    headings inside code fences ignored; `[]` when there is no such section."""
    lines, fence, level, body = markdown.splitlines(), False, None, []
    for line in lines:
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        heading = None if fence else re.match(r"(#{1,6}) (.*)", line)
        if level is None:
            if heading and heading.group(2).strip() == title:
                level = len(heading.group(1))
            continue
        if heading and len(heading.group(1)) <= level:
            break
        body.append(line)
    return body


def _count_tables(lines: list[str]) -> int:
    return sum(bool(TABLE_RULE.match(line.strip())) for line in lines)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_a_method_card(family):
    assert (CARD_DIR / f"{family.name}.md").is_file(), f"write model_cards/{family.name}.md"


@pytest.mark.parametrize("path", _family_cards())
def test_every_card_belongs_to_a_family(path):
    # A renamed family would leave its old card behind, never rendered and never checked against the code.
    assert path.stem in attnzoo.FAMILIES, f"{path.name} names no family of attnzoo.FAMILIES"


@pytest.mark.parametrize("path", _family_cards())
def test_family_cards_are_written_for_the_hub(path):
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MAX_CARD_LINES, f"{path.name} has {lines} lines; a card keeps to {MAX_CARD_LINES}"
    assert not _hub_unreadable(text), f"{path.name} holds what the Hub cannot resolve: {_hub_unreadable(text)}"
    for title in (FORMULAS_HEADING, RESULTS_HEADING):
        assert _section(text, title), f"{path.name} has no '## {title}' section"


def test_the_card_checks_catch_what_the_hub_cannot_resolve():
    # The patterns above are what keeps the cards clean: each must catch its kind and leave plain prose alone.
    for bad, kind in (
        ("measured at `3edf7ce`", "a commit hash"),
        ("since 9258dc3 the default", "a commit hash"),
        ("see scripts/experiments/long-inputs/README.md", "a repository path"),
        ("in `models/sbm/`", "a repository path"),
        ("(tests/hub/test_card.py)", "a repository path"),
        ("as Issue 48 asks", "an issue reference"),
        ("fixed in #51", "an issue reference"),
        ("[the study](study/README.md)", "a link that is not an absolute URL"),
    ):
        assert any(found.startswith(f"{kind}: ") for found in _hub_unreadable(bad)), (bad, kind)
    prose = "0.30×, 1,296 tokens, fp32, `sbm:fastrg-2%`, [BERT](https://arxiv.org/abs/1810.04805), attnzoo.hub"
    assert _hub_unreadable(prose) == []


@pytest.mark.parametrize("family", [p for p in FAMILIES if (CARD_DIR / f"{p.values[0].name}.md").is_file()])
def test_rendered_card_metadata_parses_and_carries_the_results(family, tmp_path):
    metrics = parse_metrics({"metrics": {"eval_accuracy": 0.8125, "eval_loss": 0.4375}, "global_step": 300})
    render_model_card(_info(family, metrics), CARD_DIR).save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    data = card.data
    assert data.license == "apache-2.0"
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "text-classification"
    assert {"attnzoo", "sparse-attention", family.name, family.model_type} <= set(data.tags)
    assert data.datasets == ["nyu-mll/glue"]
    assert data.base_model == "org/tiny-pretrained"
    assert data.model_name == "tiny-sst2"
    results = {(r.metric_type, r.dataset_split): r.metric_value for r in data.eval_results}
    assert results == {("accuracy", "validation"): 0.8125, ("loss", "validation"): 0.4375}
    assert {r.dataset_type for r in data.eval_results} == {"nyu-mll/glue"}
    assert {r.task_type for r in data.eval_results} == {"text-classification"}
    text = card.text
    assert text.count("\n# ") == 1  # the method text's headings sit below the card's title
    assert 'from_pretrained("org/tiny-sst2", trust_remote_code=True)' in text
    assert "| validation | Accuracy | 0.8125 |" in text
    assert "Fine-tuned for 300 steps." in text
    assert "{{ " not in text and "{%" not in text  # every template variable was filled (BibTeX may use "{{")


@pytest.mark.parametrize("family", FAMILIES)
def test_rendered_card_shows_the_formulas_and_one_results_table(family, tmp_path):
    metrics = parse_metrics({"metrics": {"eval_accuracy": 0.8125}})
    render_model_card(_info(family, metrics), CARD_DIR).save(tmp_path / "README.md")
    text = ModelCard.load(tmp_path / "README.md").text
    # The method text sits one level under the card's title: its sections are `###` headings there.
    assert f"\n### {FORMULAS_HEADING}\n" in text
    assert f"\n### {RESULTS_HEADING}\n" in text
    assert _count_tables(_section(text, RESULTS_HEADING)) == 1, "the card's results section holds one table"
    assert not _hub_unreadable(text), _hub_unreadable(text)  # the template's text included


def test_without_a_dataset_id_the_results_stay_out_of_the_model_index(tmp_path):
    # The display name went into the index's data set `type`, which the Hub reads as an id ("CNN/DailyMail").
    family = attnzoo.FAMILIES["dense_transformer"]
    metrics = parse_metrics({"metrics": {"eval_rouge1": 38.2}})
    render_model_card(_info(family, metrics, dataset_id=None), CARD_DIR).save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.eval_results is None and "model-index" not in card.content
    assert card.data.datasets is None
    assert "| validation | ROUGE-1 | 38.2 |" in card.text


def test_a_card_without_results_is_refused():
    family = attnzoo.FAMILIES["dense_transformer"]
    with pytest.raises(CardError, match="no results"):
        render_model_card(_info(family, parse_metrics({"train_loss": 0.3})), CARD_DIR)


def test_method_card_front_matter_adds_metadata(tmp_path):
    family = attnzoo.FAMILIES["dense_transformer"]
    (tmp_path / "TEMPLATE.md").write_text((CARD_DIR / "TEMPLATE.md").read_text())
    (tmp_path / "dense_transformer.md").write_text(
        "---\ntags: [baseline]\nlicense: mit\narxiv: '1706.03762'\n---\n# Dense\n\n```python\n# a comment\n```\n"
    )
    metrics = parse_metrics({"eval_accuracy": 0.5})
    render_model_card(_info(family, metrics), tmp_path).save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    assert "baseline" in card.data.tags
    assert card.data.license == "apache-2.0"  # the run decides the licence, not the method text
    assert card.data.arxiv == "1706.03762"
    assert "## Dense" in card.text and "\n# a comment\n" in card.text


def test_nest_headings_leaves_code_alone():
    text = "# Title\n\n## Part\n\n```bash\n# not a heading\n```\n#hashtag\n"
    assert nest_headings(text) == "## Title\n\n### Part\n\n```bash\n# not a heading\n```\n#hashtag\n"

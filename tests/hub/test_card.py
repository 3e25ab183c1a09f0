"""Model cards: the metrics JSON formats, the rendered metadata as huggingface_hub parses it, the method texts."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard

import attnzoo
from attnzoo.hub import CardError, CardInfo, parse_metrics, render_model_card
from attnzoo.hub.card import Result, nest_headings
from source_checkout import REPO_ROOT

CARD_DIR = REPO_ROOT / "model_cards"
FAMILIES = [pytest.param(family, id=family.name) for family in attnzoo.FAMILIES.values()]


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


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_a_method_card(family):
    assert (CARD_DIR / f"{family.name}.md").is_file(), f"write model_cards/{family.name}.md"


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

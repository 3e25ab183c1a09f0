"""`scripts/tools/plot_attention_pattern.py` draws the pattern of any family; for the Sparse Transformer it is
exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnzoo.sparse_transformer  # noqa: F401  (registers the family)
from attnzoo.sparse_transformer import SparseTransformerAttention, SparseTransformerConfig
from source_checkout import load_script

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("family", ["sparse_transformer", "dense_transformer"])
def test_script_writes_an_image_and_the_masks_of_any_family(family, tmp_path):
    script = load_script("tools/plot_attention_pattern")
    output = tmp_path / "pattern.png"
    overrides = '{"sparse_pattern": "fixed", "sparse_head_assignment": "merged", "sparse_summary_size": 3}'
    argv = [
        "--config_path", str(ROOT / "configs" / "models" / family / "tiny.json"),
        "--length", "40", "--num_padding", "6", "--layers", "0", "1", "--save_masks", "True",
        "--output_file", str(output),
    ] + (["--config_overrides", overrides] if family == "sparse_transformer" else [])  # fmt: skip
    script.main(argv)
    assert output.stat().st_size > 0
    masks = torch.load(output.with_suffix(".pt"))
    assert set(masks) == {0, 1}
    assert masks[0].shape == (4, 46, 46)
    assert not masks[0][:, :, 40:].any()  # padded keys are never used
    if family == "sparse_transformer":
        config = SparseTransformerConfig.from_pretrained(ROOT / "configs" / "models" / family / "tiny.json")
        config.sparse_pattern, config.sparse_head_assignment, config.sparse_summary_size = "fixed", "merged", 3
        pos = torch.arange(46)
        attention = SparseTransformerAttention(config)
        expected = attention.pattern_mask(pos, pos) & (pos < 40)
        expected[:, : attention.num_global_tokens] = pos < 40  # global rows read every real key
        assert attention.num_global_tokens == 1
        assert torch.equal(masks[0][:, :40], expected[:, :40])
    else:
        assert masks[1][:, :, :40].all()

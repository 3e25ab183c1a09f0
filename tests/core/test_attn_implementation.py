"""`attn_implementation` selects the kernel of every dense attention, as in BERT/BART; sparse attentions ignore it."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, AutoModelForMaskedLM, AutoModelForSeq2SeqLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from attnzoo.core.attention_interface import eager_attention_forward
from attnzoo.registry import FAMILIES
from source_checkout import load_config

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": torch.randint(5, 1000, (2, 5), generator=g)}


class CountingKernel:
    """An attention kernel registered with transformers' `AttentionInterface`: eager attention that counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (query length, key length) of every call

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        self.calls.append((query.shape[2], key.shape[2]))
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)


@pytest.fixture
def counting_kernel():
    kernel = CountingKernel()
    AttentionInterface.register("counting", kernel)
    yield kernel
    del ALL_ATTENTION_FUNCTIONS._global_mapping["counting"]


def _seq2seq(family: str, implementation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = load_config(family, "tiny", **NO_DROPOUT)
    return AutoModelForSeq2SeqLM.from_config(config, attn_implementation=implementation).eval()


@torch.no_grad()
@pytest.mark.parametrize("implementation", ["sdpa", "flex_attention", "counting"])
def test_every_implementation_gives_the_eager_outputs_of_the_dense_family(implementation, counting_kernel):
    reference = _seq2seq("dense_transformer", "eager")
    model = _seq2seq("dense_transformer", implementation)
    assert model.config._attn_implementation == implementation
    torch.testing.assert_close(model(**_inputs()).logits, reference(**_inputs()).logits, rtol=1e-5, atol=1e-5)
    if implementation == "counting":
        # Encoder self-attention (16 x 16), decoder self-attention (5 x 5) and cross-attention (5 x 16), 2 layers each.
        assert sorted(counting_kernel.calls) == sorted([(16, 16)] * 2 + [(5, 5)] * 2 + [(5, 16)] * 2)


@torch.no_grad()
def test_cached_decoding_goes_through_the_selected_kernel(counting_kernel):
    model = _seq2seq("dense_transformer", "counting")
    inputs = _inputs()
    del inputs["decoder_input_ids"]
    generated = model.generate(**inputs, max_new_tokens=4, do_sample=False, use_cache=True)
    assert torch.equal(
        generated, _seq2seq("dense_transformer", "eager").generate(**inputs, max_new_tokens=4, do_sample=False)
    )
    assert (1, 3) in counting_kernel.calls  # one new query against the cached keys


@torch.no_grad()
@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - {"dense_transformer"}))
def test_sparse_encoders_ignore_the_choice_and_say_so_once(model_type, counting_kernel):
    family = FAMILIES[model_type]
    logger = logging.get_logger("attnzoo.core.modeling")
    logging.set_verbosity_warning()
    logger.warning_once.cache_clear()
    with CaptureLogger(logger) as captured:
        model = _seq2seq(family.name, "counting")
    assert captured.out.count(family.attention_class.__name__) == 1, captured.out
    eager = _seq2seq(family.name, "eager")
    inputs = _inputs()
    torch.testing.assert_close(model(**inputs).logits, eager(**inputs).logits, rtol=1e-5, atol=1e-5)
    # Only dense attentions called the kernel: never a 16 x 16 encoder self-attention.
    assert (16, 16) not in counting_kernel.calls
    decoder = model.get_decoder().layers[0]
    dense_sites = [attn.uses_attention_interface for attn in (decoder.self_attn, decoder.cross_attn)]
    assert len(counting_kernel.calls) == 2 * sum(dense_sites)


def test_an_unknown_implementation_is_a_value_error():
    config = load_config("dense_transformer", "tiny")
    with pytest.raises(ValueError, match="attn_implementation"):
        AutoModelForMaskedLM.from_config(config, attn_implementation="no_such_kernel")


@pytest.mark.gpu
@torch.no_grad()
def test_flash_attention_2_gives_the_eager_outputs_on_cuda():
    pytest.importorskip("flash_attn")
    inputs = {k: v.cuda() for k, v in _inputs().items()}
    reference = _seq2seq("dense_transformer", "eager").cuda().half()
    model = _seq2seq("dense_transformer", "flash_attention_2").cuda().half()
    torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits, rtol=2e-2, atol=2e-2)

"""The decoder cache under both names, on whichever transformers release is installed (CI runs 5.17 and the newest)."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch
from transformers import GenerationMixin
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import Seq2SeqLMOutput

from attnzoo.core import compat
from attnzoo.core.outputs import ZooDecoderOutput, ZooSeq2SeqLMOutput
from source_checkout import load_config

from .test_common import make_inputs


def _seq2seq():
    torch.manual_seed(0)
    from attnzoo import DenseTransformerForConditionalGeneration

    return DenseTransformerForConditionalGeneration(load_config("dense_transformer", "tiny")).eval()


def test_cache_name_is_the_installed_release_s():
    upstream = {f.name for f in dataclasses.fields(Seq2SeqLMOutput)}
    assert compat.CACHE_NAME in upstream
    assert compat.CACHE_NAME in {f.name for f in dataclasses.fields(ZooSeq2SeqLMOutput)}
    assert compat.CACHE_NAME in {f.name for f in dataclasses.fields(ZooDecoderOutput)}
    # generate() of this release reads the cache from the outputs under this name.
    assert f'"{compat.CACHE_NAME}"' in inspect.getsource(GenerationMixin._update_model_kwargs_for_generation)


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_forward_accepts_both_cache_names_and_returns_the_installed_one(name):
    model = _seq2seq()
    inputs = make_inputs(model.config, "conditional_generation", pad=False)
    dec = inputs.pop("decoder_input_ids")
    with torch.no_grad():
        full = model(**inputs, decoder_input_ids=dec).logits
        first = model(**inputs, decoder_input_ids=dec[:, :-1], use_cache=True)
        cache = compat.get_cache(first)
        assert isinstance(cache, EncoderDecoderCache)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            last = model(**inputs, decoder_input_ids=dec[:, -1:], use_cache=True, **{name: cache})
    torch.testing.assert_close(last.logits[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)
    assert isinstance(compat.get_cache(last), EncoderDecoderCache)
    # The old name is announced as deprecated exactly where transformers itself deprecates it.
    warned = [w for w in caught if w.category is FutureWarning and "`past_key_values` is deprecated" in str(w.message)]
    assert bool(warned) == (name == "past_key_values" and compat.CACHE_NAME == "cache")
    # ... and names the caller's line, not torch's Module.__call__ or attnzoo's forward.
    assert all(w.filename == __file__ for w in warned), [(w.filename, w.lineno) for w in warned]


def test_forward_refuses_the_cache_under_both_names():
    model = _seq2seq()
    inputs = make_inputs(model.config, "conditional_generation", pad=False)
    with pytest.raises(ValueError, match="not both"):
        model(**inputs, cache=EncoderDecoderCache.__new__(EncoderDecoderCache), past_key_values=object())


def test_activation_checkpointing_uses_the_release_s_current_call():
    model = _seq2seq().train()
    compat.enable_activation_checkpointing(model, {"use_reentrant": False})
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())

"""Everything that differs between the transformers releases attnzoo supports (`>=5.17,<6`), in one place.

The rest of the package never branches on a transformers version: it asks this module for the one name or call that
the installed release uses.

- **Decoder cache name.** transformers 5.24 renamed the key/value cache of model inputs and outputs from
  `past_key_values` to `cache` (`generate()` passes `cache=`, reads `outputs.cache`, and `Seq2SeqLMOutput` has a
  `cache` field); 5.17-5.23 use `past_key_values`. attnzoo's seq2seq forward accepts both spellings (as
  transformers' own models do while the old name is deprecated) and returns the cache under the installed name.
- **Activation checkpointing.** 5.23 added `activation_checkpointing_enable` and deprecated
  `gradient_checkpointing_enable`, the only spelling 5.17 has.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel
from transformers.modeling_outputs import Seq2SeqLMOutput

LEGACY_CACHE_NAME = "past_key_values"
#: Name of the decoder cache in model inputs and outputs for the installed transformers release.
CACHE_NAME = "cache" if "cache" in {f.name for f in dataclasses.fields(Seq2SeqLMOutput)} else LEGACY_CACHE_NAME

#: Folders whose frames a deprecation warning skips, so that it names the user's line: attnzoo itself, and torch's and
#: transformers' call wrappers between the user and a forward (`Module.__call__`, output decorators).
#: (Two levels up from this file: the package, or the folder above a published model's flat remote code.)
_LIBRARY_FOLDERS = tuple(
    os.path.dirname(os.path.dirname(os.path.abspath(path))) + os.sep
    for path in (__file__, torch.nn.modules.__file__, transformers.utils.__file__)
)

#: Whether the installed release names checkpointing "activation checkpointing" (and deprecates the old names).
HAS_ACTIVATION_CHECKPOINTING = hasattr(PreTrainedModel, "activation_checkpointing_enable")


def resolve_cache(cache: Any, past_key_values: Any) -> Any:
    """The one decoder cache given to a forward that accepts both spellings (`cache` and `past_key_values`).

    Raises:
        ValueError: both were given.
    """
    if past_key_values is None:
        return cache
    if cache is not None:
        raise ValueError("Pass the decoder cache once, as `cache` or as `past_key_values`, not both.")
    if CACHE_NAME != LEGACY_CACHE_NAME and not torch.compiler.is_compiling():
        # A FutureWarning, as transformers' own models give for the old name (its common tests check for it).
        warnings.warn(
            "`past_key_values` is deprecated since transformers 5.24 and will be removed in transformers 6; pass the "
            "decoder cache as `cache`.",
            FutureWarning,
            stacklevel=_caller_stacklevel(),
        )
    return past_key_values


def _caller_stacklevel() -> int:
    """`stacklevel` that makes a `warnings.warn` in the calling function name the first frame outside the libraries."""
    frame, level = sys._getframe(2), 2  # level 1 is the function that warns
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARY_FOLDERS):
        frame, level = frame.f_back, level + 1
    return level


def cache_field(cache: Any) -> dict[str, Any]:
    """Keyword argument that stores `cache` in an output dataclass under the installed release's field name."""
    return {CACHE_NAME: cache}


def get_cache(output: Any) -> Any:
    """The decoder cache of a model output (under whichever name the installed release uses)."""
    return getattr(output, CACHE_NAME)


def enable_activation_checkpointing(model: PreTrainedModel, checkpointing_kwargs: dict | None = None) -> None:
    """Turn on activation (gradient) checkpointing with the installed release's non-deprecated call."""
    if HAS_ACTIVATION_CHECKPOINTING:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs)

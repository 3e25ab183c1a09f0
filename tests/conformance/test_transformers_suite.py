"""transformers' own `ModelTesterMixin` and `ConfigTester`, run against every family of the zoo.

The two test files come from the source distribution of the installed transformers release (see `upstream.py`);
one `unittest` class per family runs all of `ModelTesterMixin` on the encoder, masked-LM and classification
classes, and a second one on the encoder-decoder class. Without the package registry the module skips with the
reason in the summary (and a warning): it never passes without having run.
"""

from __future__ import annotations

import contextlib
import inspect
import unittest
import warnings

import pytest

from attnzoo.registry import FAMILIES, Family

from .testers import FAMILY_FIELDS, ZooModelTester, listed_in_auto_name_tables
from .upstream import UpstreamUnavailable, load_upstream

try:
    modeling_common, configuration_common = load_upstream()
except UpstreamUnavailable as error:
    message = f"transformers' own model tests did NOT run: {error}"
    warnings.warn(message, stacklevel=1)
    pytest.skip(message, allow_module_level=True)


#: Whether this release's checkpointing test unfreezes every parameter (5.17-5.23) instead of keeping the ones a
#: model freezes on purpose (5.24 on), and then asks each of them for a gradient.
_UNFREEZES_ALL = "intentionally_frozen" not in inspect.getsource(
    modeling_common.ModelTesterMixin.check_training_gradient_checkpointing
)

#: Per family: flags transformers' `ModelTesterMixin` offers to turn a check off, each with its reason.
SKIP_FLAGS: dict[str, dict[str, bool]] = {
    "smart_bird": {
        # The sketch's own num_labels classifier is re-initialised too; the test expects the head's alone to change.
        "test_mismatched_shapes": False,
        # Sketch parts a head's sketch task never uses are frozen on purpose; an unfrozen one has no gradient to give.
        "test_all_params_have_gradient": not _UNFREEZES_ALL,
    },
}


class _ZooConformance:
    """What every generated test class shares: the tester, the config tester and the name-table listing."""

    family: Family
    encoder_decoder_tester = False
    _listing: contextlib.ExitStack

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._listing = contextlib.ExitStack()
        cls._listing.enter_context(listed_in_auto_name_tables(list(FAMILIES.values())))

    @classmethod
    def tearDownClass(cls) -> None:
        cls._listing.close()
        super().tearDownClass()

    def setUp(self) -> None:
        self.model_tester = ZooModelTester(self, self.family, modeling_common, self.encoder_decoder_tester)
        # ConfigTester checks that every argument reaches the saved JSON, which holds the non-default ones only.
        defaults = self.family.config_class()
        arguments = {"hidden_size": 40, "num_attention_heads": 4, **FAMILY_FIELDS[self.family.name]}
        arguments = {k: v for k, v in arguments.items() if getattr(defaults, k) != v}
        self.config_tester = configuration_common.ConfigTester(
            self, config_class=self.family.config_class, **arguments
        )

    def test_config(self) -> None:
        self.config_tester.run_common_tests()


def _encoder_test_class(family: Family) -> type:
    prefix = family.model_class.__name__.removesuffix("Model")
    return type(
        f"{prefix}ModelTest",
        (_ZooConformance, modeling_common.ModelTesterMixin, unittest.TestCase),
        {
            "family": family,
            **SKIP_FLAGS.get(family.name, {}),
            "all_model_classes": (
                family.model_class,
                family.masked_lm_class,
                family.sequence_classification_class,
            ),
            "__module__": __name__,
        },
    )


def _seq2seq_test_class(family: Family) -> type:
    prefix = family.model_class.__name__.removesuffix("Model")
    return type(
        f"{prefix}ForConditionalGenerationTest",
        # The generation tester is the stand-in (see `upstream.py`): generate() is tested by attnzoo's own suite.
        (_ZooConformance, modeling_common.ModelTesterMixin, modeling_common.GenerationTesterMixin, unittest.TestCase),
        {
            "family": family,
            **SKIP_FLAGS.get(family.name, {}),
            "all_model_classes": (family.conditional_generation_class,),
            "is_encoder_decoder": True,
            "encoder_decoder_tester": True,
            "__module__": __name__,
        },
    )


for _family in FAMILIES.values():
    for _cls in (_encoder_test_class(_family), _seq2seq_test_class(_family)):
        globals()[_cls.__name__] = _cls
del _family, _cls

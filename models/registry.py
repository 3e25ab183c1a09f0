"""The families of the zoo: one entry per method, filled by each method's `__init__` on import.

Tests and the benchmark iterate over :data:`FAMILIES`; a new method adds itself here and inherits every check.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

from .core.attention import ZooAttention
from .core.configuration import ZooConfig
from .core.modeling import ZooForConditionalGeneration, ZooForMaskedLM, ZooForSequenceClassification, ZooModel


@dataclass(frozen=True)
class Family:
    """A method of the zoo: its config, its four model classes and its encoder attention.

    Args:
        config_class: the family's `ZooConfig` subclass (its `model_type` is the Auto key).
        model_class / masked_lm_class / sequence_classification_class / conditional_generation_class: the heads.
        attention_class: the encoder self-attention of the family.
    """

    config_class: type[ZooConfig]
    model_class: type[ZooModel]
    masked_lm_class: type[ZooForMaskedLM]
    sequence_classification_class: type[ZooForSequenceClassification]
    conditional_generation_class: type[ZooForConditionalGeneration]
    attention_class: type[ZooAttention]

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def name(self) -> str:
        """The family's one name: its `model_type`, also its folder under `models/`, `configs/models/` and its card."""
        return self.config_class.model_type

    @property
    def heads(self) -> dict[str, type]:
        """Head name -> model class, the axis the common test suite is parametrised over."""
        return {
            "base": self.model_class,
            "masked_lm": self.masked_lm_class,
            "sequence_classification": self.sequence_classification_class,
            "conditional_generation": self.conditional_generation_class,
        }


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    """Register a family with the Auto classes and the zoo registry (idempotent)."""
    AutoConfig.register(family.model_type, family.config_class, exist_ok=True)
    AutoModel.register(family.config_class, family.model_class, exist_ok=True)
    AutoModelForMaskedLM.register(family.config_class, family.masked_lm_class, exist_ok=True)
    AutoModelForSequenceClassification.register(
        family.config_class, family.sequence_classification_class, exist_ok=True
    )
    AutoModelForSeq2SeqLM.register(family.config_class, family.conditional_generation_class, exist_ok=True)
    FAMILIES[family.model_type] = family

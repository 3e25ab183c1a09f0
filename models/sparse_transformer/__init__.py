"""Sparse Transformer family (`model_type="sparse_transformer"`), registered with the Auto classes on import."""

from ..registry import Family, register_family
from .attention_sparse_transformer import SparseTransformerAttention
from .configuration_sparse_transformer import SparseTransformerConfig
from .modeling_sparse_transformer import (
    SparseTransformerForConditionalGeneration,
    SparseTransformerForMaskedLM,
    SparseTransformerForSequenceClassification,
    SparseTransformerModel,
    SparseTransformerPreTrainedModel,
)

register_family(
    Family(
        name="sparse_transformer",
        config_class=SparseTransformerConfig,
        model_class=SparseTransformerModel,
        masked_lm_class=SparseTransformerForMaskedLM,
        sequence_classification_class=SparseTransformerForSequenceClassification,
        conditional_generation_class=SparseTransformerForConditionalGeneration,
        attention_class=SparseTransformerAttention,
    )
)

#: Extra configurations timed by `scripts/benchmark.py` next to the default (split strided heads).
BENCHMARK_VARIANTS: dict[str, dict] = {
    "fixed_split": {"sparse_pattern": "fixed", "sparse_head_assignment": "split"},
    "fixed_merged": {"sparse_pattern": "fixed", "sparse_head_assignment": "merged"},
    "strided_merged": {"sparse_head_assignment": "merged"},
}

__all__ = [
    "BENCHMARK_VARIANTS",
    "SparseTransformerAttention",
    "SparseTransformerConfig",
    "SparseTransformerForConditionalGeneration",
    "SparseTransformerForMaskedLM",
    "SparseTransformerForSequenceClassification",
    "SparseTransformerModel",
    "SparseTransformerPreTrainedModel",
]

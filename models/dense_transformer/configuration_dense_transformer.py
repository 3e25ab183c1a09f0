"""Configuration of the dense baseline family."""

# No `from __future__ import annotations`: huggingface_hub's @strict checks field types only when the annotations
# are real types, not strings.

from huggingface_hub.dataclasses import strict

from ..core.configuration import ZooConfig


@strict
class DenseTransformerConfig(ZooConfig):
    r"""
    Configuration of the dense baseline: the zoo's Transformer with full softmax attention (SDPA) everywhere.
    Every sparse method is compared against the dense family of identical size. It adds no field to
    [`~attnzoo.core.ZooConfig`], whose Args list documents every field.

    Example:

    ```python
    >>> import attnzoo
    >>> from transformers import AutoModelForMaskedLM
    >>> config = attnzoo.DenseTransformerConfig(vocab_size=8000, hidden_size=128, num_attention_heads=4)
    >>> model = AutoModelForMaskedLM.from_config(config)
    ```
    """

    model_type = "dense_transformer"

"""Smart Bird family: the zoo's Transformer with sketch-guided sampled attention in the encoder.

The encoder is [`~attnzoo.smart_bird.sketch.SmartBirdEncoder`] (the core encoder plus the sketch network); the
heads register their labels as the sketch's training targets. Decoder self-attention and cross-attention are dense.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.modeling import (
    ZooForConditionalGeneration,
    ZooForMaskedLM,
    ZooForSequenceClassification,
    ZooModel,
    ZooPreTrainedModel,
)
from .attention_smart_bird import SmartBirdAttention
from .configuration_smart_bird import SmartBirdConfig
from .sketch import SketchTaskMixin, SmartBirdEncoder, init_sketch_from_main_embeddings


class SmartBirdPreTrainedModel(ZooPreTrainedModel):
    """Binds Smart Bird's config, attention (encoder self-attention) and encoder with the sketch network."""

    config_class = SmartBirdConfig
    attention_class = SmartBirdAttention
    encoder_class = SmartBirdEncoder

    # The sketch's own classifier is sized by `num_labels`, and every checkpoint holds one (a masked-LM checkpoint
    # its untrained 2-label one), so a checkpoint saved for another label count could not be fine-tuned on a 3-label
    # or regression task: it loads fresh there, as a new classification head does.
    _sketch_classifier = re.compile(r"(^|\.)encoder\.sketch\.classifier\.(weight|bias)$")

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """`PreTrainedModel.from_pretrained`, with the sketch classifier initialised afresh when its size differs.

        Any other size mismatch stops the load as in transformers, unless `ignore_mismatched_sizes=True`.
        """
        if kwargs.get("ignore_mismatched_sizes"):
            return super().from_pretrained(*args, **kwargs)
        return_info = kwargs.pop("output_loading_info", False)
        kwargs.update(ignore_mismatched_sizes=True, output_loading_info=True)
        model, info = super().from_pretrained(*args, **kwargs)
        # Entries are (name, checkpoint shape, model shape).
        others = sorted(
            (entry for entry in info["mismatched_keys"] if not cls._sketch_classifier.search(entry[0])),
            key=lambda e: e[0],
        )
        if others:
            sizes = "; ".join(
                f"{name}: checkpoint {tuple(saved)}, model {tuple(wanted)}" for name, saved, wanted in others
            )
            raise RuntimeError(
                f"Size mismatch loading {cls.__name__}: {sizes}. Pass `ignore_mismatched_sizes=True` to initialise "
                "these weights afresh."
            )
        return (model, info) if return_info else model

    def init_sketch_from_main_embeddings(self) -> None:
        """Initialise the sketch's token embeddings by PCA of the main token embeddings (the paper's recipe)."""
        encoder = self.encoder if isinstance(self, ZooModel) else self.model.encoder
        init_sketch_from_main_embeddings(encoder)


class SmartBirdModel(SmartBirdPreTrainedModel, ZooModel):
    """Smart Bird encoder returning hidden states. Without labels it computes no sketch loss.

    Example:

    ```python
    >>> import torch, attnzoo
    >>> model = attnzoo.SmartBirdModel(attnzoo.SmartBirdConfig(vocab_size=1000, hidden_size=64))
    >>> out = model(torch.randint(5, 1000, (2, 128)), output_attentions=True)
    >>> out.attention_density.shape  # (batch, layers, heads): about K / N of the pairs
    torch.Size([2, 2, 4])
    ```
    """


class SmartBirdForMaskedLM(SketchTaskMixin, SmartBirdPreTrainedModel, ZooForMaskedLM):
    """Smart Bird with a masked-LM head. The sketch trains with a rank-`d` masked-LM loss on the same labels."""

    sketch_task = "masked_lm"
    base_model_class = SmartBirdModel


class SmartBirdForSequenceClassification(SketchTaskMixin, SmartBirdPreTrainedModel, ZooForSequenceClassification):
    """Smart Bird with a pooled classification head. The sketch trains with its own attention-pooling classifier
    on the same labels (the paper's setting)."""

    sketch_task = "classification"
    base_model_class = SmartBirdModel


class SmartBirdForConditionalGeneration(SketchTaskMixin, SmartBirdPreTrainedModel, ZooForConditionalGeneration):
    """Smart Bird encoder-decoder for summarization with `generate()`: sampled attention in the encoder, dense causal
    decoder self-attention and dense cross-attention. The sketch trains with a bag-of-target-words loss."""

    sketch_task = "seq2seq"

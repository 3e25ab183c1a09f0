"""Summarization for users of transformers 5, which removed the `summarization` pipeline.

`import attnzoo` registers the task `"sparse-summarization"`::

    summarizer = pipeline("sparse-summarization", model="path/to/checkpoint")
    summarizer("A long article ...", max_new_tokens=64, num_beams=4)

and :func:`summarize` does the same in one call on a model and tokenizer.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, Pipeline, PreTrainedModel, PreTrainedTokenizerBase
from transformers.pipelines import PIPELINE_REGISTRY

logger = logging.getLogger(__name__)

TASK = "sparse-summarization"


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], model: PreTrainedModel, truncation: bool):
    """Tokenize; inputs longer than the encoder's positions raise unless truncation was asked for explicitly."""
    limit = model.config.max_position_embeddings
    length_args = {"truncation": True, "max_length": limit} if truncation else {}
    encoded = tokenizer(texts, padding=True, return_tensors="pt", **length_args)
    encoded.pop("token_type_ids", None)
    if truncation:
        full = [len(ids) for ids in tokenizer(texts, truncation=False)["input_ids"]]
        cut = sum(n > limit for n in full)
        if cut:
            logger.warning("Truncated %d of %d inputs to max_position_embeddings=%d tokens.", cut, len(texts), limit)
    elif encoded["input_ids"].shape[1] > limit:
        raise ValueError(
            f"An input has {encoded['input_ids'].shape[1]} tokens, more than the model's max_position_embeddings "
            f"({limit}); pass truncation=True to cut it."
        )
    return encoded


def summarize(
    texts: str | list[str],
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    truncation: bool = False,
    **generate_kwargs: Any,
) -> list[str]:
    """Summarize texts with a seq2seq model of the zoo (`<Prefix>ForConditionalGeneration`).

    Args:
        texts (`str` or `list[str]`): documents to summarize.
        model: a seq2seq model (`AutoModelForSeq2SeqLM.from_pretrained(...)`).
        tokenizer: its tokenizer.
        truncation (`bool`, *optional*, defaults to `False`): cut inputs longer than `max_position_embeddings`
            (with a warning) instead of raising `ValueError`.
        generate_kwargs: passed to `model.generate` (`max_new_tokens`, `num_beams`, `no_repeat_ngram_size`, ...);
            defaults come from `model.generation_config`.

    Returns:
        `list[str]`: one summary per text.
    """
    batch = [texts] if isinstance(texts, str) else list(texts)
    encoded = _encode(tokenizer, batch, model, truncation).to(model.device)
    with torch.no_grad():
        output_ids = model.generate(**encoded, **generate_kwargs)
    return tokenizer.batch_decode(output_ids, skip_special_tokens=True)


class SparseSummarizationPipeline(Pipeline):
    """`pipeline("sparse-summarization", model=...)`, the `summarization` pipeline of transformers 4: a text gives
    `[{"summary_text": ...}]` (one entry per returned sequence), a list of texts one such entry per text (or a list
    of lists with `num_return_sequences > 1`)."""

    def __call__(self, inputs: str | list[str], **kwargs) -> list:
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(summaries) == 1 for summaries in result):
            return [summaries[0] for summaries in result]
        return result

    def _sanitize_parameters(self, truncation: bool | None = None, **generate_kwargs):
        preprocess = {} if truncation is None else {"truncation": truncation}
        return preprocess, generate_kwargs, {}

    def preprocess(self, inputs: str, truncation: bool = False) -> dict[str, torch.Tensor]:
        return _encode(self.tokenizer, [inputs], self.model, truncation)

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)  # (texts * sequences, L)
        texts = model_inputs["input_ids"].shape[0]
        # (texts, sequences, L): the pipeline splits a batch along its first dimension, one text each.
        return {"output_ids": output_ids.reshape(texts, -1, output_ids.shape[-1])}

    def postprocess(self, model_outputs: dict[str, torch.Tensor]) -> list[dict[str, str]]:
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"][0], skip_special_tokens=True)
        return [{"summary_text": text} for text in texts]


PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=SparseSummarizationPipeline, pt_model=AutoModelForSeq2SeqLM)

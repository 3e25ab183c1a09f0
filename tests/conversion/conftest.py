"""Small random BERT / RoBERTa checkpoints saved by transformers' own classes, with tokenizers, for the converter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaModel,
)

from attnzoo.tokenization import iter_texts_from_files, train_wordpiece_tokenizer

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
#: Source length of the small checkpoints (RoBERTa's table holds two more rows, see `roberta_config`).
SOURCE_POSITIONS = 64
SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


def _texts() -> list[str]:
    return list(iter_texts_from_files([DATA / "text" / "wikitext_train.txt"]))


@pytest.fixture(scope="session")
def wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    return train_wordpiece_tokenizer(_texts(), vocab_size=600, model_max_length=SOURCE_POSITIONS)


@pytest.fixture(scope="session")
def roberta_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with RoBERTa's special tokens and ids (`<s>`=0, `<pad>`=1, `</s>`=2)."""
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator(_texts(), trainers.BpeTrainer(vocab_size=600, special_tokens=specials))
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        cls_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=SOURCE_POSITIONS,
    )


def bert_config(vocab_size: int) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, max_position_embeddings=SOURCE_POSITIONS, **SIZES)


def roberta_config(vocab_size: int) -> RobertaConfig:
    # RoBERTa's table has `pad_token_id + 1` rows before the first real position.
    return RobertaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=SOURCE_POSITIONS + 2,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        layer_norm_eps=1e-5,
        **SIZES,
    )


SOURCES: dict[str, tuple[type[PreTrainedModel], Callable, str]] = {
    "BertForMaskedLM": (BertForMaskedLM, bert_config, "wordpiece"),
    "BertModel": (BertModel, bert_config, "wordpiece"),
    "BertForPreTraining": (BertForPreTraining, bert_config, "wordpiece"),
    "RobertaForMaskedLM": (RobertaForMaskedLM, roberta_config, "roberta"),
    "RobertaModel": (RobertaModel, roberta_config, "roberta"),
}


@pytest.fixture(scope="session")
def source_checkpoint(
    tmp_path_factory: pytest.TempPathFactory,
    wordpiece_tokenizer: PreTrainedTokenizerFast,
    roberta_tokenizer: PreTrainedTokenizerFast,
) -> Callable[[str], tuple[Path, PreTrainedModel]]:
    """`source_checkpoint("RobertaForMaskedLM")` -> (folder saved with `save_pretrained`, the model in eval mode)."""
    cache: dict[str, tuple[Path, PreTrainedModel]] = {}

    def make(architecture: str) -> tuple[Path, PreTrainedModel]:
        if architecture not in cache:
            model_class, make_config, tokenizer_kind = SOURCES[architecture]
            tokenizer = wordpiece_tokenizer if tokenizer_kind == "wordpiece" else roberta_tokenizer
            torch.manual_seed(0)
            model = model_class(make_config(len(tokenizer))).eval()
            # Random LayerNorm and bias values, so that a mapping mistake between them cannot go unnoticed.
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                        parameter.add_(0.1 * torch.randn_like(parameter))
            folder = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            cache[architecture] = (folder, model)
        return cache[architecture]

    return make


def right_padded_batch(vocab_size: int, pad_token_id: int, length: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of random non-special ids, the second padded on the right from position 30."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab_size, (2, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    ids[1, 30:] = pad_token_id
    return ids, mask

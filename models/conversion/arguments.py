"""The options of `scripts/convert_checkpoint.py`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ConversionArguments:
    """
    What to convert into what.

    Args:
        model_name_or_path (`str`): BERT or RoBERTa checkpoint folder, or Hub id.
        family (`str`): target `model_type` (`dense_transformer`, `smart_bird`, `a2former`, `sparse_transformer`,
            `fsat`, `sbm`).
        max_position_embeddings (`int`): the new length.
        output_dir (`str`): new or empty folder for the converted checkpoint.
        config_overrides (`dict` or `str`, *optional*): method fields, `"field=value,field=value"` (a mapping from
            a recipe).
        seq2seq (`bool`, *optional*, defaults to `False`): BERT2BERT encoder-decoder warm start.
    """

    model_name_or_path: str = field(metadata={"help": "BERT / RoBERTa checkpoint folder or Hub id."})
    family: str = field(metadata={"help": "Target model_type, e.g. smart_bird."})
    max_position_embeddings: int = field(metadata={"help": "New length (rows beyond the source's repeat it)."})
    output_dir: str = field(metadata={"help": "New or empty folder for the converted checkpoint."})
    config_overrides: dict | str | None = field(
        default=None, metadata={"help": "Method config fields to override, 'field=value,field=value'."}
    )
    seq2seq: bool = field(
        default=False, metadata={"help": "Encoder-decoder warm start (BERT2BERT): decoder from the source too."}
    )

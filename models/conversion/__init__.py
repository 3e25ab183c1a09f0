"""BERT / RoBERTa checkpoints into every attnzoo family: long positions, BERT2BERT seq2seq, and a full report.

`scripts/convert_checkpoint.py` is the command line over [`convert_checkpoint`]; `scripts/run_mlm.py --family`
converts and continues pretraining in one run. The name mapping itself is [`bert_names`].
"""

from .arguments import ConversionArguments
from .conversion_report import REPORT_FILE, REPORT_TEXT_FILE, ConversionReport, copy_report, read_report
from .convert import convert_checkpoint, convert_for_training
from .errors import ConversionError

__all__ = [
    "REPORT_FILE",
    "REPORT_TEXT_FILE",
    "ConversionArguments",
    "ConversionError",
    "ConversionReport",
    "convert_checkpoint",
    "convert_for_training",
    "copy_report",
    "read_report",
]

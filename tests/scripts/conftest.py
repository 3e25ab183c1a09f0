"""Fixtures of the training-script tests: one small tokenizer per session and the scripts loaded as modules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from attnzoo import testing
from attnzoo.tokenization import iter_texts_from_files, train_wordpiece_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "tests" / "fixtures" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1000-token WordPiece tokenizer trained on bundled WikiText (shared by every script test)."""
    path = tmp_path_factory.mktemp("tokenizer")
    texts = iter_texts_from_files([DATA / "text" / "wikitext_train.txt", DATA / "glue" / "SST-2" / "train.tsv"])
    train_wordpiece_tokenizer(texts, vocab_size=1000, model_max_length=512).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def load_script() -> Callable[[str], ModuleType]:
    """`load_script(name)` imports `scripts/<name>.py` as a module, so tests call its `main(argv)` in-process."""
    return testing.load_script


@pytest.fixture
def quiet_args(tokenizer_dir: Path) -> list[str]:
    """Arguments every tiny run shares: local tokenizer, CPU, no progress bars, quiet logs."""
    return [
        "--tokenizer_name_or_path",
        str(tokenizer_dir),
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--log_level",
        "warning",
        "--seed",
        "0",
    ]

"""Test configuration: offline mode, GPU skipping, optional extra families, no deprecated transformers API, and the
fixtures the program tests share (one small tokenizer per session, the bundled data folder)."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without CUDA, attention_backend="triton" runs attnzoo's Triton kernels under Triton's CPU interpreter, which is
# chosen when the kernels are first imported: set it before anything can import them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attnzoo  # noqa: E402, F401  (registers every family)
import source_checkout  # noqa: E402
from attnzoo.tokenization import iter_texts_from_files, train_wordpiece_tokenizer  # noqa: E402
from source_checkout import FIXTURES  # noqa: E402

# Families still under development register themselves when named here, e.g. ATTNZOO_FAMILIES=sbm,fsat.
for _name in filter(None, os.environ.get("ATTNZOO_FAMILIES", "").split(",")):
    importlib.import_module(f"attnzoo.{_name.strip()}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


class _DeprecationLog(logging.Handler):
    """Collects the deprecation notices transformers writes to its logger (its `warnings` are errors, see
    `filterwarnings` in pyproject.toml)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "deprecat" in record.getMessage().lower():
            self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def no_transformers_deprecation_notices() -> Iterator[None]:
    """The package must use the installed release's current names (`attnzoo.core.compat`): a deprecated call fails
    the test that makes it, so the next transformers release cannot remove something under us unseen."""
    handler = _DeprecationLog()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.messages:
        pytest.fail("transformers logged a deprecation: " + " | ".join(dict.fromkeys(handler.messages)))


@pytest.fixture(scope="session")
def synthetic_script() -> ModuleType:
    """The SBM synthetic-task study (`scripts/experiments/sbm-synthetic/run.py`), imported as a module: the SBM
    method tests reproduce the paper's Figure 4 with it, and the study's own tests check it."""
    return source_checkout.load_script("experiments/sbm-synthetic/run")


# ----- shared by the program tests (tests/scripts, tests/training, tests/experiments) -----


@pytest.fixture(scope="session")
def load_script() -> Callable[[str], ModuleType]:
    """`load_script(name)` imports the program `scripts/<name>.py` as a module, so tests call its `main(argv)`
    in-process."""
    return source_checkout.load_script


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1000-token WordPiece tokenizer trained on bundled WikiText (shared by every script test)."""
    path = tmp_path_factory.mktemp("tokenizer")
    texts = iter_texts_from_files(
        [FIXTURES / "text" / "wikitext_train.txt", FIXTURES / "glue" / "SST-2" / "train.tsv"]
    )
    train_wordpiece_tokenizer(texts, vocab_size=1000, model_max_length=512).save_pretrained(path)
    return path


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

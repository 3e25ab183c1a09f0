"""transformers' own common model and config tests, taken from the installed release's source distribution.

`ModelTesterMixin` (`tests/test_modeling_common.py`) and `ConfigTester` (`tests/test_configuration_common.py`) are
not shipped in the wheel. At test time they are downloaded once per release with pip from the package registry
(`pip download --no-binary :all: transformers==<installed version>`) into a cache outside the repository
(`~/.cache/attnzoo/transformers-tests/<version>/`, or `$ATTNZOO_TRANSFORMERS_TESTS_CACHE/<version>/`); only those
two files are extracted. They import three modules of transformers' test tree that the source distribution lacks;
this module writes stand-ins for them next to the two files:

- `generation/test_utils.py`: an empty `GenerationTesterMixin` (generation is covered by attnzoo's own tests);
- `exporters/test_export.py`: an empty `ExportTesterMixin` (no `torch.export` tests: attnzoo has its own compile
  test, and the sparse selections use data-dependent shapes);
- `utils/test_configuration_utils.py`: `config_common_kwargs`, the non-default `PreTrainedConfig` arguments that
  `ConfigTester.check_config_arguments_init` expects a config to keep (written here, see `CONFIG_COMMON_KWARGS`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

import transformers

#: the two files of transformers' test tree that the conformance tests run
UPSTREAM_FILES = ("test_modeling_common.py", "test_configuration_common.py")

#: Non-default values of `PreTrainedConfig`'s own arguments: a config must store each of them unchanged.
CONFIG_COMMON_KWARGS = {
    "return_dict": False,
    "output_hidden_states": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["ZooForMaskedLM"],
    "id2label": {0: "negative", 1: "positive"},
    "label2id": {"negative": 0, "positive": 1},
    "problem_type": "single_label_classification",
}

_STANDINS = {
    "__init__.py": "",
    "generation/__init__.py": "",
    "generation/test_utils.py": (
        "class GenerationTesterMixin:\n"
        "    '''Stand-in: the source distribution has no generation tests (attnzoo tests generate() itself).'''\n"
    ),
    "exporters/__init__.py": "",
    "exporters/test_export.py": (
        "class ExportTesterMixin:\n    '''Stand-in: the source distribution has no export tests.'''\n"
    ),
    "utils/__init__.py": "",
    "utils/test_configuration_utils.py": f"config_common_kwargs = {CONFIG_COMMON_KWARGS!r}\n",
}


class UpstreamUnavailable(RuntimeError):
    """transformers' test files could not be obtained (no package registry, no pip, or an unexpected archive)."""


def cache_root() -> Path:
    """Folder holding one subfolder per transformers release."""
    root = os.environ.get("ATTNZOO_TRANSFORMERS_TESTS_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "attnzoo" / "transformers-tests"


def _download(version: str, target: Path) -> None:
    """Fetch the source distribution of `transformers==version` and extract the two test files into `target`."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--retries", "2", "--no-binary", ":all:", "--no-deps",
            f"transformers=={version}", "--dest", tmp,
        ]  # fmt: skip
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as error:
            detail = getattr(error, "stderr", None) or str(error)
            raise UpstreamUnavailable(
                f"`pip download transformers=={version}` (source distribution) failed: {detail.strip()[-800:]}"
            ) from error
        archives = list(Path(tmp).glob("transformers-*.tar.gz"))
        if len(archives) != 1:
            raise UpstreamUnavailable(f"expected one transformers-{version}.tar.gz from pip, got {archives}.")
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{version}-"))
        try:
            with tarfile.open(archives[0]) as archive:
                for name in UPSTREAM_FILES:
                    member = f"transformers-{version}/tests/{name}"
                    try:
                        data = archive.extractfile(member)
                    except KeyError as error:
                        raise UpstreamUnavailable(f"{member} is not in the source distribution.") from error
                    (staging / name).write_bytes(data.read())
            for name, text in _STANDINS.items():
                path = staging / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            # Atomic publish: a concurrent run sees either nothing or the complete folder.
            try:
                staging.rename(target)
            except OSError:
                if not (target / UPSTREAM_FILES[0]).is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)


#: a failed download per release, so that one test session tries the package registry once
_FAILED: dict[str, UpstreamUnavailable] = {}


def upstream_tests_dir(version: str | None = None) -> Path:
    """The cached test folder of the installed (or given) transformers release, downloaded on first use."""
    version = version or transformers.__version__
    target = cache_root() / version
    if not all((target / name).is_file() for name in UPSTREAM_FILES):
        if version in _FAILED:
            raise _FAILED[version]
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _download(version, target)
        except UpstreamUnavailable as error:
            _FAILED[version] = error
            raise
    return target


def load_upstream(version: str | None = None) -> tuple[ModuleType, ModuleType]:
    """Import transformers' `test_modeling_common` and `test_configuration_common` from the cached folder.

    Raises:
        UpstreamUnavailable: the files could not be downloaded, or they import a module that is missing here (e.g.
            `parameterized`, a dev dependency of attnzoo).
    """
    folder = upstream_tests_dir(version)
    package = "transformers_upstream_tests"
    if package not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            package, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)
    try:
        modeling = importlib.import_module(f"{package}.test_modeling_common")
        configuration = importlib.import_module(f"{package}.test_configuration_common")
    except ImportError as error:
        raise UpstreamUnavailable(f"transformers' common tests cannot be imported here: {error}") from error
    return modeling, configuration

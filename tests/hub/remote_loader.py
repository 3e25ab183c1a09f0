"""Child process of the remote-code tests: load published folders with attnzoo made unimportable.

Usage: `python -I remote_loader.py spec.json`. The spec lists, per family and Auto class, a folder and a file of
expected outputs written by the parent (which has attnzoo). Exits non-zero on the first mismatch.
"""

from __future__ import annotations

import importlib.abc
import json
import sys


class _BlockAttnzoo(importlib.abc.MetaPathFinder):
    """Make `attnzoo` (and its source folder name `models`) unimportable, even though the venv has it installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("attnzoo", "models"):
            raise ImportError(f"{name} is blocked: published remote code must load without attnzoo")
        return None


sys.meta_path.insert(0, _BlockAttnzoo())

import torch  # noqa: E402
import transformers  # noqa: E402


def _check_head(family: dict, entry: dict) -> None:
    """Load one published folder through its Auto class; outputs, generation and tokenizer as the parent saved."""
    folder = entry["folder"]
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    assert type(config).__name__ == family["config_class"], type(config)
    assert type(config).__module__.startswith("transformers_modules."), type(config).__module__
    auto_class = getattr(transformers, entry["auto_class"])
    model = auto_class.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__name__ == entry["class_name"], type(model)
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    assert not model.training
    expected = torch.load(entry["expected"])
    with torch.no_grad():
        output = model(**expected["inputs"])
    torch.testing.assert_close(getattr(output, entry["output"]), expected["output"], rtol=1e-5, atol=1e-5)
    if "generated" in expected:
        generated = model.generate(**expected["generate_inputs"], **entry["generate_kwargs"])
        assert torch.equal(generated, expected["generated"]), (generated, expected["generated"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert tokenizer.pad_token_id == config.pad_token_id
    print(f"ok {family['name']} {entry['auto_class']} {type(model).__module__}.{type(model).__name__}")


def main(spec_path: str) -> None:
    torch.set_num_threads(1)
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    try:
        import attnzoo  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("attnzoo is importable in the child process")
    for family in spec["families"]:
        for entry in family["heads"]:
            _check_head(family, entry)
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("attnzoo", "models"))
    assert not leaked, leaked


if __name__ == "__main__":
    main(sys.argv[1])

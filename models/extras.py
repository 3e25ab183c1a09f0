"""Optional dependencies: `pip install attnzoo` brings what loading and running a model needs; training, plots and
the GPU kernels come with extras (`attnzoo[train]`, `attnzoo[plots]`, `attnzoo[gpu]`). A module that needs one
asks for it here, so a missing package is an error that names the extra to install."""

from __future__ import annotations

import importlib
import importlib.util

#: The extras of `pyproject.toml` and the import names each one provides.
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("datasets", "evaluate", "accelerate", "rouge_score", "nltk", "sklearn", "scipy"),
    "plots": ("matplotlib",),
    "gpu": ("triton",),
}


def require(extra: str, *modules: str) -> None:
    """Raise an `ImportError` naming `extra` if any of `modules` (default: all of the extra's) cannot be imported.

    Args:
        extra (`str`): a key of [`EXTRAS`].
        modules (`str`): import names to check; none checks every module of the extra.
    """
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra {extra!r}; the extras are {sorted(EXTRAS)}.")
    missing = [name for name in modules or EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"This part of attnzoo needs the `{extra}` extra ({', '.join(missing)} not installed): "
            f"pip install 'attnzoo[{extra}]'"
        )

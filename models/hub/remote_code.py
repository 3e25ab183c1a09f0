"""Generate the flat remote code of one family: the modules its classes need, copied as sibling files.

transformers copies only same-folder relative imports of a Hub repository's code (`from .modeling_x import Y`), so
the package's nested modules (`attnzoo/core/attention.py` importing `from ..kernels import ...`) cannot be uploaded
as they are. The generator starts from the modules that define the family's config and model classes, follows their
`attnzoo` imports through the `ast` of each file (so a new module of a method is picked up without a list to keep),
and writes each reached module under a flat name, every package import rewritten into a sibling import:

| package module                      | flat file                  |
|-------------------------------------|----------------------------|
| `attnzoo.core.attention`            | `core_attention.py`        |
| `attnzoo.kernels.csr`               | `kernels_csr.py`           |
| `attnzoo.<family>.modeling_<m>`     | `modeling_<m>.py`          |

Names imported from a package (`from ..kernels import edge_attention`) are followed through the package's
`__init__` to the module that defines them, so no `__init__.py` is ever copied: the package import guard and the
families' `register_family(...)` calls (which live there) stay out of the remote code, whose Auto mapping comes from
the config's `auto_map` instead. The code of the copied modules is unchanged apart from the import lines, so the
remote classes compute exactly what the package computes.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from transformers.dynamic_module_utils import get_imports, get_relative_imports

from ..registry import Family

ROOT_PACKAGE = "attnzoo"
PACKAGE_DIR = Path(__file__).resolve().parent.parent

#: The Auto classes a published folder is loadable with, and the `Family` attribute of the class each one maps to.
AUTO_CLASSES: dict[str, str] = {
    "AutoConfig": "config_class",
    "AutoModel": "model_class",
    "AutoModelForMaskedLM": "masked_lm_class",
    "AutoModelForSequenceClassification": "sequence_classification_class",
    "AutoModelForSeq2SeqLM": "conditional_generation_class",
}

# The registry (whose `register_family` fills the Auto classes) and the pipelines module (which registers the
# summarization task when imported) belong to the installed package only; remote code must not include them.
_REGISTRATION_MODULES = frozenset({f"{ROOT_PACKAGE}.registry", f"{ROOT_PACKAGE}.pipelines"})
_REGISTRATION_CALLS = frozenset({"register_family", "register_for_auto_class", "register_pipeline"})
# Third-party packages a Hub user of transformers has anyway.
_BASE_REQUIREMENTS = frozenset({"torch", "transformers", "huggingface_hub", "safetensors", "tokenizers"})


class RemoteCodeError(ValueError):
    """The package code cannot be turned into flat remote code (the message names the file and the construct)."""


@dataclass
class RemoteCode:
    """
    Result of [`generate_remote_code`].

    Args:
        files (`dict[str, str]`): flat file name -> source text.
        sources (`dict[str, str]`): flat file name -> the package module it was generated from.
        auto_map (`dict[str, str]`): Auto class -> `"<flat module>.<class>"`, for `config.json`.
        requirements (`list[str]`): third-party packages the files import beyond torch/transformers/huggingface_hub.
    """

    files: dict[str, str]
    sources: dict[str, str]
    auto_map: dict[str, str]
    requirements: list[str] = field(default_factory=list)

    def write(self, folder: str | Path) -> list[Path]:
        """Write the files into `folder` (created if needed) and return their paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in sorted(self.files.items()):
            path = folder / name
            path.write_text(text, encoding="utf-8")
            paths.append(path)
        return paths


def _module_path(module: str) -> tuple[Path, bool] | None:
    """`(file, is_package)` of an `attnzoo` module, or `None` when it does not exist."""
    parts = module.split(".")
    if parts[0] != ROOT_PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _absolute_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name `from <...> import` refers to."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(package) - 1:
        raise RemoteCodeError(f"`{ast.unparse(node)}` in {module} goes above the `{ROOT_PACKAGE}` package.")
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether a module-level statement defines `name` (def, class or assignment)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    targets = (
        node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    )
    return any(isinstance(target, ast.Name) and target.id == name for target in targets)


def _defining_module(package: str, name: str, seen: frozenset[str] = frozenset()) -> tuple[str, str]:
    """Follow a name imported from a package `__init__` to `(module, name in that module)`."""
    path, _ = _module_path(package) or (None, None)
    if path is None or package in seen:
        raise RemoteCodeError(f"Cannot follow `{name}` through `{package}`.")
    tree = _parse(path)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                base = _absolute_base(package, True, node)
                target = _module_path(base)
                if target is None:
                    raise RemoteCodeError(f"`{package}` re-exports `{name}` from `{base}`, outside attnzoo.")
                if target[1]:
                    return _defining_module(base, alias.name, seen | {package})
                return base, alias.name
    if not any(_binds(node, name) for node in tree.body):
        raise RemoteCodeError(f"`{name}` is not found in `{package}`.")
    raise RemoteCodeError(
        f"`{name}` is defined in the package file of `{package}` (its __init__.py); remote code never copies "
        "__init__ files (they register the families), so define it in a module of the package and re-export it."
    )


def flat_module_name(module: str, family_package: str) -> str:
    """
    File stem of a package module in the flat folder: the family's own modules keep their names
    (`configuration_dense`), the others join their path below `attnzoo` with underscores (`core_attention`).
    """
    parts = module.split(".")[1:]
    if module.startswith(family_package + "."):
        parts = module[len(family_package) + 1 :].split(".")
    return "_".join(parts)


def _check_no_registration(module: str, tree: ast.Module) -> None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for call in ast.walk(node):
            if isinstance(call, ast.Call):
                func = call.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                is_auto_register = (
                    isinstance(func, ast.Attribute)
                    and func.attr == "register"
                    and getattr(func.value, "id", "").startswith("Auto")
                )
                if name in _REGISTRATION_CALLS or is_auto_register:
                    raise RemoteCodeError(
                        f"{module} calls `{ast.unparse(func)}` at import time (line {call.lineno}); remote code must "
                        "not register classes (the Auto mapping comes from `auto_map`). Move the call into the "
                        "package's __init__.py."
                    )


class _ModuleRewriter:
    """Rewrites one module's `attnzoo` imports into sibling imports and reports the modules they need."""

    def __init__(self, module: str, family_package: str):
        self.module = module
        self.family_package = family_package
        path, self.is_package = _module_path(module)
        self.path = path
        self.text = path.read_text(encoding="utf-8")
        self.tree = ast.parse(self.text, filename=str(path))
        self.needed: set[str] = set()

    def _targets(self, node: ast.ImportFrom) -> list[tuple[str, str, str | None]] | None:
        """`(module, name, asname)` per imported name, or `None` for an import from outside attnzoo."""
        base = _absolute_base(self.module, self.is_package, node)
        if base != ROOT_PACKAGE and not base.startswith(ROOT_PACKAGE + "."):
            return None
        where = f"{self.module} line {node.lineno}"
        target = _module_path(base)
        if target is None:
            raise RemoteCodeError(f"`{ast.unparse(node)}` ({where}) imports the unknown module `{base}`.")
        targets = []
        for alias in node.names:
            if alias.name == "*":
                if target[1]:
                    raise RemoteCodeError(f"`{ast.unparse(node)}` ({where}): star import from a package.")
                targets.append((base, "*", None))
                continue
            if target[1] and _module_path(f"{base}.{alias.name}") is not None:
                # `from . import module` is not detected by transformers' relative-import scan (its regex needs a
                # module name after the dot), so the sibling file would not be copied next to the code.
                raise RemoteCodeError(
                    f"`{ast.unparse(node)}` ({where}) imports the module `{base}.{alias.name}` as an object; "
                    "import the names you use from it instead."
                )
            try:
                module, name = _defining_module(base, alias.name) if target[1] else (base, alias.name)
            except RemoteCodeError as err:
                raise RemoteCodeError(f"`{ast.unparse(node)}` ({where}): {err}") from None
            local = alias.asname or alias.name
            targets.append((module, name, local if local != name else None))
        return targets

    def rewrite(self) -> str:
        lines = self.text.splitlines(keepends=True)
        replacements: list[tuple[int, int, str]] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == ROOT_PACKAGE or alias.name.startswith(ROOT_PACKAGE + "."):
                        raise RemoteCodeError(
                            f"`{ast.unparse(node)}` ({self.module} line {node.lineno}) imports an attnzoo module as "
                            "an object; use `from <module> import <name>`."
                        )
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            targets = self._targets(node)
            if targets is None:
                continue
            for module, _, _ in targets:
                if module in _REGISTRATION_MODULES:
                    raise RemoteCodeError(
                        f"{self.module} imports `{module}` (line {node.lineno}), the package's Auto-class or "
                        "pipeline registration; remote code cannot include it."
                    )
                self.needed.add(module)
            replacements.append((node.lineno, node.end_lineno, self._statement(node, targets, lines)))
        for start, end, text in sorted(replacements, reverse=True):
            lines[start - 1 : end] = [text]
        return "".join(lines)

    def _statement(self, node: ast.ImportFrom, targets: list[tuple[str, str, str | None]], lines: list[str]) -> str:
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        indent = first[: node.col_offset]
        tail = last.encode()[node.end_col_offset :].decode().rstrip("\n")
        if indent.strip() or (tail.strip() and not tail.strip().startswith("#")):
            raise RemoteCodeError(
                f"`{ast.unparse(node)}` ({self.module} line {node.lineno}) shares its line with other code; "
                "put the import on its own line."
            )
        grouped: dict[str, list[str]] = {}
        for module, name, asname in targets:
            grouped.setdefault(module, []).append(name if asname is None else f"{name} as {asname}")
        statements = []
        for module, names in grouped.items():
            flat = flat_module_name(module, self.family_package)
            one_line = f"{indent}from .{flat} import {', '.join(names)}"
            if len(one_line) <= 119:
                statements.append(one_line)
            else:
                body = "".join(f"{indent}    {name},\n" for name in names)
                statements.append(f"{indent}from .{flat} import (\n{body}{indent})")
        statements[-1] += tail
        return "\n".join(statements) + "\n"


def _header(module: str) -> str:
    from .. import __version__

    relative = _module_path(module)[0].relative_to(PACKAGE_DIR).as_posix()
    return (
        f"# Generated by attnzoo.hub from attnzoo {__version__}, file {relative}: only the import lines differ.\n"
        "# Do not edit; change the attnzoo package and publish again (scripts/publish.py).\n"
    )


def _third_party(imports: Iterable[str]) -> set[str]:
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    return {name for name in imports if name not in stdlib and name != "__future__"}


def generate_remote_code(family: Family) -> RemoteCode:
    """
    Flatten the modules that define `family`'s config and model classes, and everything of attnzoo they import.

    Args:
        family ([`~attnzoo.registry.Family`]): a registered family (e.g. `attnzoo.FAMILIES["dense_transformer"]`).

    Returns:
        [`RemoteCode`]: the files, their `auto_map` and the extra packages they need.

    Raises:
        [`RemoteCodeError`]: when a module uses an import form remote code cannot express (the message says which).
    """
    classes = {auto: getattr(family, attribute) for auto, attribute in AUTO_CLASSES.items()}
    roots = [cls.__module__ for cls in classes.values()]
    family_package = roots[0].rsplit(".", 1)[0]
    files: dict[str, str] = {}
    sources: dict[str, str] = {}
    queue, done = list(dict.fromkeys(roots)), set()
    while queue:
        module = queue.pop(0)
        if module in done:
            continue
        done.add(module)
        if _module_path(module) is None or _module_path(module)[1]:
            raise RemoteCodeError(f"`{module}` is not a module file of attnzoo.")
        rewriter = _ModuleRewriter(module, family_package)
        _check_no_registration(module, rewriter.tree)
        flat = flat_module_name(module, family_package) + ".py"
        if flat in files:
            raise RemoteCodeError(f"`{module}` and `{sources[flat]}` would both be written as {flat}.")
        files[flat] = _header(module) + rewriter.rewrite()
        sources[flat] = module
        queue.extend(sorted(rewriter.needed - done))
    auto_map = {
        auto: f"{flat_module_name(cls.__module__, family_package)}.{cls.__name__}" for auto, cls in classes.items()
    }
    return RemoteCode(files, sources, auto_map, sorted(_third_party(_imports_of(files)) - _BASE_REQUIREMENTS))


def _imports_of(files: dict[str, str]) -> set[str]:
    """Absolute imports of the files as transformers' `check_imports` sees them (it imports each before loading)."""
    import tempfile

    found: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            path = Path(tmp) / name
            path.write_text(text, encoding="utf-8")
            imports = set(get_imports(path))
            if ROOT_PACKAGE in imports or "models" in imports:
                raise RemoteCodeError(f"{name}: transformers would require the attnzoo package to load it.")
            missing = {f"{rel}.py" for rel in get_relative_imports(path)} - set(files)
            if missing:
                raise RemoteCodeError(f"{name}: transformers would look for sibling files {sorted(missing)}.")
            found |= imports
    return found

"""Docs that cannot go stale silently: every module, object and file the docs and tests/README.md name exists.

Each backticked ``tito_core.x.y`` (and the adapters' and tito-testing's) must be a module of the source tree, or a
name its module defines (a function, class, constant, or a method of a class); each backticked path (``tests/...``,
``gateway/fronts/base.py``) must be a file or folder of the repository or of a package's source; the first column
of docs/architecture.md's module table must name modules of tito_core. Read statically (``ast``): no import, so it
runs without torch or an engine.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {p.name.replace("-", "_"): p / "src" for p in (ROOT / "packages").iterdir() if (p / "src").is_dir()}
DOCS = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "tests" / "README.md", ROOT / "README.md"])
_DOTTED = re.compile(r"`(tito_(?:core|vllm|sglang|transformers|testing)(?:[.:][A-Za-z_][A-Za-z0-9_]*)*)")
_PATH = re.compile(
    r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|toml|jsonl|json|png|txt|yml|sh)|(?:tests|examples|benchmarks)/[\w./-]+)`"
)


@cache
def _module_file(dotted: str) -> Path | None:
    package, *rest = dotted.split(".")
    base = SOURCES.get(package.replace("_", "_"))
    for src in SOURCES.values():
        if (src / package).is_dir():
            base = src
    if base is None:
        return None
    path = base / package
    for part in rest:
        path = path / part
    if path.is_dir() and (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


@cache
def _names(file: Path) -> dict[str, ast.AST]:
    """The names a module binds at its top level (definitions, assignments, imports, lazy exports)."""
    tree = ast.parse(file.read_text())
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
            exports = any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets)
            if exports and isinstance(node.value, ast.Dict):  # lazy exports: {"Name": "module"}
                for key in node.value.keys:
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        names[key.value] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If):  # TYPE_CHECKING blocks and the like
            for sub in node.body:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    for alias in sub.names:
                        names[(alias.asname or alias.name).split(".")[0]] = sub
    return names


def _resolves(dotted: str) -> bool:
    parts = dotted.replace(":", ".").split(".")
    for cut in range(len(parts), 0, -1):
        file = _module_file(".".join(parts[:cut]))
        if file is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        node = _names(file).get(rest[0])
        if node is None:
            return False
        if len(rest) == 1 or not isinstance(node, ast.ClassDef):
            return True  # an attribute of an imported or assigned object: not followed
        members = {getattr(n, "name", None) for n in node.body}
        members |= {t.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(t := n.target, ast.Name)}
        return rest[1] in members
    return False


def _path_exists(text: str, doc: Path) -> bool | None:
    """Whether a path a doc names exists; None when it is another project's (``vllm/outputs.py``): not checked.

    A path is the repository's when it starts at the repository root, at the doc's own folder (tests/README.md
    names ``core/test_x.py``), at an example, or inside a package's source (``gateway/fronts/base.py``).
    """
    text = text.rstrip("/").split("::")[0]
    tito = [src / name for name, src in SOURCES.items() if (src / name).is_dir()]
    first = text.split("/", 1)[0]
    bases = [ROOT, doc.parent, *tito, *(ROOT / "examples").iterdir()]
    if not any((base / first).exists() for base in bases):
        return None
    candidates = [base / text for base in bases]
    candidates += [c.with_suffix(".py") for c in candidates if c.suffix not in (".py", ".md", "")]  # a.py's function
    return any(c.exists() for c in candidates)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_and_file_a_doc_names_exists(doc: Path) -> None:
    text = doc.read_text()
    missing = sorted({m for m in _DOTTED.findall(text) if not _resolves(m)})
    missing += sorted({f"path {p}" for p in _PATH.findall(text) if _path_exists(p, doc) is False})
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_architecture_tables_name_modules_of_tito_core() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Modules", 1)[1].split("\n## ", 1)[0]
    named: list[str] = []
    for row in section.splitlines():
        if row.startswith("| `"):
            first = row.split("|")[1]
            head, _, package = first.partition("(package:")  # `trajectory` (package: `live`, `record`, ...)
            modules = [n for n in re.findall(r"`([a-z_.]+)`", head) if not n.startswith("tito_testing")]
            named += modules
            named += [f"{modules[-1]}.{n}" for n in re.findall(r"`([a-z_]+)`", package) if modules]
    assert named, "no module table found"
    missing = [n for n in named if _module_file(f"tito_core.{n}") is None]
    assert not missing, f"docs/architecture.md's module table names modules that do not exist: {missing}"

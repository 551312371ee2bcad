"""Which package may import which (docs/architecture.md, "Imports"), checked on the source: every ``import`` and
``from ... import`` statement of every package under ``packages/*/src``, function-local and ``TYPE_CHECKING`` ones
included, is resolved to the package it names. A statement that breaks a rule fails here with the file and line,
whether or not it runs at import time (a lazy import is still a dependency).

A *unit* is a first-level module or package of ``tito_core`` (``tito_core.media``, ``tito_core.export``, ...) or
another top-level package (``tito_sglang``, ``strands``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

# The recording core: what every front, the runner and the adapters build on. It imports no front, nothing
# built on the fronts, and no framework.
CORE = {
    "errors", "_suggest", "_optional", "versions", "assets", "status", "tokenizers", "media", "conversation",
    "grammar", "tool_parsers", "render", "backend", "http", "weights", "partial", "plugins", "trajectory",
    "records", "rollout_core", "model_setup", "rollout_settings", "turn_rewards", "sampling_mask", "kept_logprobs",
}  # fmt: skip
FRONTS = {"strands_front", "gateway"}
ABOVE_CORE = FRONTS | {
    "config", "runner", "cli", "trainers", "export", "analysis", "integrations", "viewer", "demo", "clean_exit",
    "harbor",
}  # fmt: skip
ADAPTERS = {"tito_vllm", "tito_sglang", "tito_transformers"}

# (importer units, forbidden units, why)
RULES: list[tuple[set[str], set[str], str]] = [
    ({"media"}, (CORE | ABOVE_CORE) - {"errors"}, "media (the input kinds) imports only errors: the plugin registry, "
     "the backend contract and the trajectory all hold media, so media sits below them"),
    ({"plugins"}, (CORE | ABOVE_CORE) - {"errors", "_suggest", "backend", "media", "tool_parsers"},
     "the plugin registry imports only the contracts it registers (backend, tool_parsers, media)"),
    (CORE, ABOVE_CORE | {"strands"}, "the recording core imports no front, nothing built on one, and not Strands"),
    ({"strands_front"}, {"gateway"}, "a front imports no other front"),
    ({"gateway"}, {"strands_front", "strands"}, "a front imports no other front; the gateway runs without Strands"),
    ({"export"}, ABOVE_CORE - {"export"}, "the exports are plain data from a trajectory: no front, runner or trainer"),
    ({"analysis"}, ABOVE_CORE - {"analysis", "strands_front"},
     "the analysis reads records and re-renders them (the text stack through the Strands front's conversion)"),
    ({"config"}, ABOVE_CORE - {"config", "strands_front"},
     "the config builds models (create_model: the Strands front, lazily), nothing above them"),
    ({"runner"}, {"cli", "analysis", "integrations", "demo"}, "the runner is below the command line"),
    ({"harbor"}, ABOVE_CORE - {"harbor"},
     "Harbor tasks, the sandbox and the verifier: the runner uses them, they know no runner"),
    ((CORE | ABOVE_CORE) - {"cli"}, {"cli"}, "nothing imports the command line"),
    (ADAPTERS, ABOVE_CORE | {"strands"}, "an adapter talks to one engine: it imports only the core, never a front"),
    (CORE | ABOVE_CORE, ADAPTERS | {"tito_testing"},
     "tito-core imports no adapter and no test kit (see ALLOWED for the two commands that load one lazily)"),
]  # fmt: skip

# Lazy imports a rule would refuse, allowed by name: (importer module, imported unit).
ALLOWED = {
    ("tito_core.analysis.audit", "tito_transformers"),  # `tito audit --model`: the transformers scorer
    ("tito_core.demo", "tito_testing"),  # `tito demo --scripted`: the scripted backend and offline tokenizer
}


@cache
def _modules() -> dict[str, Path]:
    """Every module of every package, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(ROOT.glob("packages/*/src/**/*.py")):
        src = next(p for p in path.parents if p.name == "src")
        found[".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "tito_core" and len(parts) > 1 else parts[0]


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for each import statement of ``module``: the most specific module it names."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join([*here[: len(here) - node.level + 1], *([node.module] if node.module else [])])
            for alias in node.names:  # `from . import plugins` imports tito_core.plugins, not tito_core
                name = f"{base}.{alias.name}"
                yield (name if name in _modules() else base), node.lineno


@cache
def _edges() -> list[tuple[str, str, str, int]]:
    """``(importer module, importer unit, imported unit, line)`` for every import between two units."""
    edges = []
    for module, path in _modules().items():
        for target, line in _imports(module, path):
            if target == "tito_core" or _unit(target) == _unit(module):
                continue  # the root's lazy public names; a unit's own modules
            edges.append((module, _unit(module), _unit(target), line))
    return edges


def _where(module: str, line: int) -> str:
    return f"{_modules()[module].relative_to(ROOT)}:{line}"


def test_the_source_is_found() -> None:
    units = {_unit(m) for m in _modules()}
    assert {"media", "plugins", "export", "analysis", "gateway", "tito_sglang", "tito_vllm"} <= units
    assert any(u == "media" and t == "errors" for _, u, t, _ in _edges())  # imports are read, relative ones too


def test_every_unit_of_the_core_package_has_a_place() -> None:
    """A new first-level module or package of tito_core is placed in the core or above it before it can pass."""
    units = {_unit(m) for m in _modules() if m.startswith("tito_core.")}
    assert units - CORE - ABOVE_CORE == set()


@pytest.mark.parametrize("rule", RULES, ids=[why.split(":")[0][:60] for _, _, why in RULES])
def test_rule(rule: tuple[set[str], set[str], str]) -> None:
    importers, forbidden, why = rule
    broken = sorted(
        {
            f"{_where(module, line)}: {unit} imports {target}"
            for module, unit, target, line in _edges()
            if unit in importers and target in forbidden and (module, target) not in ALLOWED
        }
    )
    assert not broken, f"{why}:\n" + "\n".join(broken)


def test_no_two_units_import_each_other() -> None:
    """The units' graph has no circle (a module-level one would also be one here: structure.py counts those)."""
    graph: dict[str, set[str]] = {}
    for _, unit, target, _ in _edges():
        graph.setdefault(unit, set()).add(target)
    circles = []
    for start in sorted(graph):  # a path back to `start` through other units
        seen, todo = set(), [(start, [start])]
        while todo:
            node, path = todo.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    todo.append((nxt, [*path, nxt]))
    assert not circles, "units that import each other:\n" + "\n".join(sorted(set(circles)))

"""AReaL's own tree-training code (areal 1.0.4, installed ``--no-deps`` by ``nox -s areal``), loaded for the tests.

Only ``areal.models.tree_attn`` is loaded: the packages' ``__init__`` files, which start AReaL's controllers and
need its whole cluster stack, are skipped, and ``areal.utils.name_resolve`` (a Ray-backed name service that
``areal.api.cli_args`` imports and the tree code never calls) is an empty module.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("areal") is None:
    pytest.skip("areal is not installed (nox -s areal installs it)", allow_module_level=True)


@pytest.fixture(scope="session")
def areal_tree() -> Any:
    """``areal.models.tree_attn`` with its ``tree`` and ``functional`` modules, and ``MicroBatchSpec``."""
    spec = importlib.util.find_spec("areal")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    for name in ("areal", "areal.models", "areal.engine", "areal.engine.fsdp_utils", "areal.infra", "areal.utils"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
    sys.modules.setdefault("areal.utils.name_resolve", types.ModuleType("areal.utils.name_resolve"))
    from areal.api.cli_args import MicroBatchSpec
    from areal.models.tree_attn import functional, tree

    return types.SimpleNamespace(tree=tree, functional=functional, MicroBatchSpec=MicroBatchSpec)

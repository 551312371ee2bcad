"""Deprecated: tito's test support is the ``tito-testing`` package now (``import tito_testing``).

Importing ``tito_core.testing`` or one of its old submodules (``tito_core.testing.conformance``,
``tito_core.testing.scripted``, ...) gives the ``tito_testing`` module itself, with a ``DeprecationWarning``
naming the new spelling, or an ``ImportError`` saying what to install when tito-testing is missing. The tito-core
wheel ships no test code: this module only points there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_OLD, _NEW = "tito_core.testing", "tito_testing"
_HINT = (
    "pip install tito-testing (or the tito-core[testing] extra; from a checkout: pip install -e packages/tito-testing)"
)


def _new_module(old: str) -> ModuleType:
    new = _NEW + old[len(_OLD) :]
    warnings.warn(f"{old} is deprecated: import {new} (package tito-testing)", DeprecationWarning, stacklevel=3)
    try:
        return importlib.import_module(new)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == _NEW:
            raise ImportError(f"{old} moved to the tito-testing package: {_HINT}") from exc
        raise


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``tito_core.testing.X`` to the module ``tito_testing.X`` (the same object, not a copy)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname.startswith(_OLD + "."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: Any) -> ModuleType:
        return _new_module(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__spec__.name if module.__spec__ else module.__name__] = module


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())  # before the path finder, which would load a second copy of the module
sys.modules[__name__] = _new_module(_OLD)

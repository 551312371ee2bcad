"""``tito_core.testing`` (before tito-testing was its own package) still imports, as tito_testing, with a warning."""

from __future__ import annotations

import importlib
import sys

import pytest


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "tito_core.testing" or m.startswith("tito_core.testing.")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_old_spelling_gives_the_same_modules_with_a_deprecation(monkeypatch: pytest.MonkeyPatch) -> None:
    import tito_testing
    import tito_testing.conformance
    import tito_testing.scripted

    _forget(monkeypatch)
    with pytest.warns(DeprecationWarning, match=r"import tito_testing \(package tito-testing\)"):
        old = importlib.import_module("tito_core.testing")
    assert old is tito_testing
    with pytest.warns(DeprecationWarning, match=r"import tito_testing\.scripted"):
        from tito_core.testing.scripted import ScriptedBackend
    assert ScriptedBackend is tito_testing.scripted.ScriptedBackend  # the same class, not a second copy
    with pytest.warns(DeprecationWarning):
        assert importlib.import_module("tito_core.testing.conformance") is tito_testing.conformance


def test_without_tito_testing_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _forget(monkeypatch)
    monkeypatch.setitem(sys.modules, "tito_testing", None)  # as if not installed
    with pytest.warns(DeprecationWarning), pytest.raises(ImportError, match="pip install tito-testing"):
        importlib.import_module("tito_core.testing")

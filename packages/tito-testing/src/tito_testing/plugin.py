"""The ``tito`` plugin of this package: registers the in-process ``scripted`` test backend by name."""

from __future__ import annotations

from collections.abc import Iterator

from tito_core.plugins import BackendSpec, hookimpl


@hookimpl
def tito_backends() -> Iterator[BackendSpec]:
    """Provide the in-process backend used by tests, examples and ``tito demo --scripted``."""
    yield BackendSpec(
        "scripted",
        "tito_testing.scripted:ScriptedBackend",
        "In-process test backend that returns scripted texts as token ids",
    )

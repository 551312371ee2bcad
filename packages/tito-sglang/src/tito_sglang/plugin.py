"""The ``tito`` plugin of this package: registers the ``sglang`` backend by name."""

from __future__ import annotations

from collections.abc import Iterator

from tito_core.plugins import BackendSpec, hookimpl


@hookimpl
def tito_backends() -> Iterator[BackendSpec]:
    """Provide the SGLang backend (native ``/generate``: exact token ids, logprobs, abort by id)."""
    yield BackendSpec(
        name="sglang",
        factory="tito_sglang.backend:SGLangBackend",
        description="SGLang server or router, native /generate with token ids, logprobs and request abort",
    )

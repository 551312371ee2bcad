"""The ``tito`` plugin of this package: registers the ``transformers`` backend by name."""

from __future__ import annotations

from collections.abc import Iterator

from tito_core.plugins import BackendSpec, hookimpl


@hookimpl
def tito_backends() -> Iterator[BackendSpec]:
    """Provide the embedded backend (transformers + torch in this process, batched, exact ids and logprobs)."""
    yield BackendSpec(
        name="transformers",
        factory="tito_transformers.backend:TransformersBackend",
        description="transformers + torch in-process: token ids in, ids and logprobs out, concurrent requests batched",
        in_process=True,
    )

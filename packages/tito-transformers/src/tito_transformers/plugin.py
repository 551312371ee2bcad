"""The ``tito`` plugin of this package: registers the ``transformers`` backend by name, and the demo's model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


def smollm2_demo() -> tuple[Path, str]:
    """The model of ``tito demo`` (entry point ``smollm2`` in ``tito.demo``): its folder and chat template.

    SmolLM2-135M-Instruct built offline on first use (:func:`tito_transformers.models.build_smollm2`) and
    its template with hermes tool calls (:func:`tito_transformers.templates.smollm2_tools`).
    """
    from tito_transformers.models import build_smollm2
    from tito_transformers.templates import smollm2_tools

    return build_smollm2(), smollm2_tools()

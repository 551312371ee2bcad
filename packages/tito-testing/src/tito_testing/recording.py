"""A backend wrapper that records every request and result, for asserting what an engine received."""

from __future__ import annotations

import msgspec

from tito_core.backend import Backend, GenerateRequest, GenerateResult


class RecordingBackend(Backend):
    """Delegates to ``inner`` and keeps ``(request, result)`` pairs; the request's ids are copied to a list."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.renders_prompt = inner.renders_prompt  # type: ignore[misc]
        self.calls: list[tuple[GenerateRequest, GenerateResult]] = []

    @property
    def requests(self) -> list[GenerateRequest]:
        """The recorded requests, in order."""
        return [request for request, _ in self.calls]

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Forward the request and record it with its result."""
        result = await self.inner.generate(request)
        self.calls.append((msgspec.structs.replace(request, input_ids=list(request.input_ids)), result))
        return result

    async def max_context_length(self) -> int | None:
        """The inner backend's context length."""
        return await self.inner.max_context_length()

    async def aclose(self) -> None:
        """Nothing to close: the inner backend belongs to the caller."""

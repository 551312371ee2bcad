"""Replay a conversation through a real tito :class:`Rollout`, the engine answering with given ids.

The backend "generates" each assistant turn as the ids the family's reference encoder gives it, and keeps
every request, so a test compares what tito would send an engine with the reference encoding of the same
conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from strands.types.content import Messages
from strands.types.tools import ToolSpec

from tito_core.backend import Backend, GenerateRequest, GenerateResult
from tito_core.chat import ChatRenderer
from tito_core.plugins import get_tool_parser
from tito_core.recording import CallOptions, RenderMode, Rollout
from tito_core.trajectory import Trajectory


class IdsBackend(Backend):
    """Answers call ``k`` with ``outputs[k]`` (finish reason ``stop``), recording every request's ids."""

    name = "ids"

    def __init__(self, outputs: Sequence[Sequence[int]]) -> None:
        self.outputs = [list(o) for o in outputs]
        self.requests: list[list[int]] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(list(request.input_ids))
        ids = self.outputs[len(self.requests) - 1]
        return GenerateResult(output_ids=ids, output_logprobs=[-0.5] * len(ids), finish_reason="stop")


def replay(
    tokenizer: Any,
    messages: Messages,
    output_ids: Callable[[int], list[int]],
    *,
    parser: str,
    tools: list[ToolSpec] | None,
    system: str | None,
    render_mode: RenderMode,
    escape_special_text: bool = False,
) -> tuple[list[list[int]], Trajectory]:
    """Run one model call per assistant message of ``messages`` (``output_ids(i)``: the ids of message ``i``).

    Returns the input ids of each request and the final trajectory.
    """
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    backend = IdsBackend([output_ids(i) for i in turns])
    renderer = ChatRenderer.shared(tokenizer, escape_special_text=escape_special_text)
    rollout = Rollout(backend, renderer, get_tool_parser(parser), render_mode=render_mode)

    async def run() -> None:
        for i in turns:
            await rollout.call(list(messages[:i]), tools, system, CallOptions())

    asyncio.run(run())
    return backend.requests, rollout.trajectory

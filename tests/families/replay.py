"""Replay a conversation through a real tito :class:`Rollout`, the engine answering with given ids.

The backend "generates" each assistant turn as the ids the family's reference encoder gives it, and keeps
every request, so a test compares what tito would send an engine with the reference encoding of the same
conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from strands.types.content import Message, Messages
from strands.types.tools import ToolSpec

from tito_core.backend import Backend, GenerateRequest, GenerateResult
from tito_core.plugins import get_tool_parser
from tito_core.render import shared_renderer
from tito_core.rollout_core import CallOptions, RenderMode, Rollout
from tito_core.strands_front.messages import to_conversation
from tito_core.tool_parsers.base import ParsedOutput
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


def assistant_message(parsed: ParsedOutput) -> Message:
    """The assistant message Strands builds from tito's events for one parsed output."""
    content: list[Any] = []
    if parsed.reasoning:
        content.append({"reasoningContent": {"reasoningText": {"text": parsed.reasoning}}})
    if parsed.content or not (parsed.reasoning or parsed.calls):
        content.append({"text": parsed.content})
    content.extend({"toolUse": {"toolUseId": c.id, "name": c.name, "input": c.input}} for c in parsed.calls)
    return {"role": "assistant", "content": content}


def _renamed(message: Message, rename: dict[str, str]) -> Message:
    blocks: list[Any] = []
    for block in message["content"]:
        if "toolResult" in block:
            result = dict(block["toolResult"])
            result["toolUseId"] = rename.get(result["toolUseId"], result["toolUseId"])
            block = {"toolResult": result}
        blocks.append(block)
    return {"role": message["role"], "content": blocks}


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
) -> tuple[list[list[int]], Trajectory, Messages]:
    """Run one model call per assistant message of ``messages`` (``output_ids(i)``: the ids of message ``i``).

    As in a Strands agent loop, each assistant message of the history is the one built from tito's parsed
    output (tool results follow the parsed call ids). Returns the input ids of each request, the final
    trajectory and the history as the agent held it (same length and roles as ``messages``).
    """
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    backend = IdsBackend([output_ids(i) for i in turns])
    renderer = shared_renderer(tokenizer, escape_special_text=escape_special_text)
    rollout = Rollout(backend, renderer, get_tool_parser(parser), render_mode=render_mode)
    history: Messages = []

    async def run() -> None:
        rename: dict[str, str] = {}
        for message in messages:
            if message["role"] != "assistant":
                history.append(_renamed(message, rename))
                continue
            result = await rollout.call(to_conversation(list(history), tools, system), CallOptions())
            history.append(assistant_message(result.parsed))
            asked = [b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b]
            rename.update(zip(asked, [c.id for c in result.parsed.calls], strict=False))

    asyncio.run(run())
    return backend.requests, rollout.trajectory, history

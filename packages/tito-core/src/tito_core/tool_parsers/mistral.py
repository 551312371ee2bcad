"""Mistral tool calls after ``[TOOL_CALLS]``, in the layouts mistral-common encodes.

- tokenizer v2-v7: one JSON list, ``[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "abc123def"}, ...]``
  (``"id"`` optional);
- v11: ``[TOOL_CALLS]f[CALL_ID]abc123def[ARGS]{...}`` per call;
- v13+: ``[TOOL_CALLS]f[ARGS]{...}`` per call.

Reasoning (Magistral) sits in ``[THINK]...[/THINK]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tito_core.conversation import ToolSpec
from tito_core.tool_parsers._common import call_with_json_arguments, json_end, unexpected_keys, valid_name
from tito_core.tool_parsers._reasoning import ThinkAwareParser, skip_whitespace
from tito_core.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    json_type_name,
    loads_json_strict,
    malformed_call,
    new_call_id,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NO_END = "\x00tito-no-end\x00"
_NAME_SALVAGE = re.compile(r'"name"\s*:\s*"([^"]+)"')


class MistralToolParser(ThinkAwareParser):
    """Strict parser for Mistral ``[TOOL_CALLS]`` tool calls (both the JSON-list and the ``[ARGS]`` layouts).

    A JSON-list call region must hold one JSON array of objects with ``"name"``, ``"arguments"`` (an
    object) and optionally ``"id"``; each item becomes a call. An ``[ARGS]`` call must read
    ``NAME[CALL_ID]ID[ARGS]{...}`` or ``NAME[ARGS]{...}`` with nothing after the JSON object but the
    next ``[TOOL_CALLS]`` or the end. When a ``[CALL_ID]`` or ``"id"`` is given, it becomes the call's
    id. Anything else is a malformed call keeping its raw text; nothing is repaired.

    Args:
        think_start: Opening reasoning delimiter.
        think_end: Closing reasoning delimiter.

    """

    name = "mistral"

    def __init__(self, *, think_start: str = "[THINK]", think_end: str = "[/THINK]") -> None:
        super().__init__(think_start=think_start, think_end=think_end, tool_start=TOOL_CALLS)

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls."""
        split = self._split_reasoning(text, TOOL_CALLS, _NO_END, _find_call_end, reasoning_open)
        calls: list[ToolCall] = []
        for call in split.calls:
            calls.extend(_parse_region(call.raw))
        return ParsedOutput(content=split.content, reasoning=split.reasoning, calls=calls)


def _find_call_end(text: str, body_start: int) -> int:
    """End of the call starting at ``body_start``: after its JSON when it reads well, else the next marker."""
    pos = skip_whitespace(text, body_start)
    if text.startswith("[", pos):
        end = json_end(text, pos)
    else:
        args = text.find(ARGS, pos)
        nxt = text.find(TOOL_CALLS, pos)
        end = None
        if args != -1 and (nxt == -1 or args < nxt):
            end = json_end(text, args + len(ARGS))
    if end is not None:
        return end
    nxt = text.find(TOOL_CALLS, body_start)
    return len(text) if nxt == -1 else nxt


def _parse_region(raw: str) -> list[ToolCall]:
    body = raw[len(TOOL_CALLS) :]
    if not body.strip():
        return [malformed_call(raw, f"nothing after {TOOL_CALLS}")]
    if body.lstrip().startswith("["):
        return _parse_list(raw, body)
    return [_parse_args_call(raw, body)]


def _parse_list(raw: str, body: str) -> list[ToolCall]:
    try:
        items = loads_json_strict(body.strip())
    except ValueError as exc:
        return [_malformed(raw, f"tool calls are not valid JSON: {exc}")]
    if not isinstance(items, list) or not items:
        got = "an empty array" if isinstance(items, list) else json_type_name(items)
        return [_malformed(raw, f"tool calls must be a non-empty JSON array of objects, got {got}")]
    # Every call keeps the whole region as raw text: the model wrote one list, not separate calls.
    return [_list_item(item, raw, index) for index, item in enumerate(items)]


def _list_item(item: Any, raw: str, index: int) -> ToolCall:
    where = f"tool call {index}"
    if not isinstance(item, dict):
        return malformed_call(raw, f"{where} must be a JSON object, got {json_type_name(item)}")
    name = item.get("name")
    if not isinstance(name, str) or not valid_name(name):
        return malformed_call(raw, f'{where} needs "name": a tool name string')
    keys = unexpected_keys(item, ("name", "arguments", "id"))
    if keys:
        return malformed_call(raw, f'unexpected key(s) {keys} in {where}: only "name", "arguments", "id"', name)
    arguments = item.get("arguments")
    if not isinstance(arguments, dict):
        got = "nothing" if "arguments" not in item else json_type_name(arguments)
        return malformed_call(raw, f"{where} arguments must be a JSON object, got {got}", name)
    call_id = item.get("id")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        return malformed_call(raw, f'{where} "id" must be a non-empty string', name)
    return ToolCall(id=call_id or new_call_id(), name=name, input=arguments, raw=raw)


def _parse_args_call(raw: str, body: str) -> ToolCall:
    at = body.find(ARGS)
    if at == -1:
        return _malformed(raw, f"tool call has no {ARGS} (expected NAME{ARGS}{{...}})")
    head, args = body[:at], body[at + len(ARGS) :]
    call_id: str | None = None
    if CALL_ID in head:
        head, call_id = head.split(CALL_ID, 1)
        if not valid_name(call_id):
            return malformed_call(raw, f"invalid {CALL_ID}: {call_id!r}", head if valid_name(head) else None)
    if not valid_name(head):
        return _malformed(raw, f"invalid tool name before {ARGS}: {head!r}")
    return call_with_json_arguments(raw, head, args, call_id)


def _malformed(raw: str, error: str) -> ToolCall:
    found = _NAME_SALVAGE.search(raw)
    return malformed_call(raw, error, found.group(1) if found else None)

"""Gemma 4 tool calls: ``call:NAME{key:value,...}`` between ``<|tool_call>`` and ``<tool_call|>``.

Format (as the official chat template, trl's ``gemma4.jinja``, renders it)::

    <|channel>thought
    REASONING<channel|><|tool_call>call:get_weather{city:<|"|>Zürich<|"|>,days:3}<tool_call|><|tool_response>

Values: strings between ``<|"|>`` quotes (verbatim, no escapes), ``true`` / ``false``, numbers,
``{key:value,...}`` objects (bare keys; ``<|"|>``-quoted keys are read too), ``[a,b]`` arrays, and the
null the template writes as ``None`` (``null`` is read too). The model stops a calling turn with
``<|tool_response>``, which is dropped from the content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tito_core.conversation import ToolSpec
from tito_core.tool_parsers._common import snippet, valid_name
from tito_core.tool_parsers._reasoning import DelimitedToolParser, RawCall
from tito_core.tool_parsers.base import ParsedOutput, ToolCall, malformed_call, new_call_id

QUOTE = '<|"|>'
TOOL_RESPONSE = "<|tool_response>"
_LITERAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|None|null")
_KEY = re.compile(r"[^:{}\[\],<>\s]+")
_NAME_SALVAGE = re.compile(r"call:([^{\s<]+)")
_MAX_DEPTH = 64


class _ScanError(Exception):
    pass


def _value(text: str, pos: int, depth: int) -> tuple[Any, int]:
    """Read one value at ``text[pos]``; return it and the index just past it."""
    if depth > _MAX_DEPTH:
        raise _ScanError("arguments nested too deeply")
    if text.startswith(QUOTE, pos):
        end = text.find(QUOTE, pos + len(QUOTE))
        if end == -1:
            raise _ScanError(f"string {snippet(text[pos : pos + 40])} is not closed with {QUOTE}")
        return text[pos + len(QUOTE) : end], end + len(QUOTE)
    if text.startswith("{", pos):
        return _object(text, pos, depth + 1)
    if text.startswith("[", pos):
        items: list[Any] = []
        pos += 1
        if text.startswith("]", pos):
            return items, pos + 1
        while True:
            item, pos = _value(text, pos, depth + 1)
            items.append(item)
            if text.startswith(",", pos):
                pos += 1
            elif text.startswith("]", pos):
                return items, pos + 1
            else:
                raise _ScanError(f"expected ',' or ']' in an array, got {snippet(text[pos : pos + 20])}")
    found = _LITERAL.match(text, pos)
    if found is None:
        raise _ScanError(f"expected a value, got {snippet(text[pos : pos + 20])}")
    word = found.group()
    value: Any
    if word in ("true", "false"):
        value = word == "true"
    elif word in ("None", "null"):
        value = None
    elif any(c in word for c in ".eE"):
        value = float(word)
    else:
        value = int(word)
    return value, found.end()


def _object(text: str, pos: int, depth: int) -> tuple[dict[str, Any], int]:
    """Read ``{key:value,...}`` at ``text[pos]`` (which is ``{``)."""
    obj: dict[str, Any] = {}
    pos += 1
    if text.startswith("}", pos):
        return obj, pos + 1
    while True:
        if text.startswith(QUOTE, pos):
            key, pos = _value(text, pos, depth)
        else:
            found = _KEY.match(text, pos)
            if found is None:
                raise _ScanError(f"expected an argument name, got {snippet(text[pos : pos + 20])}")
            key, pos = found.group(), found.end()
        if not text.startswith(":", pos):
            raise _ScanError(f"argument {snippet(key)} has no ':'")
        if key in obj:
            raise _ScanError(f"duplicate argument {snippet(key)}")
        obj[key], pos = _value(text, pos + 1, depth)
        if text.startswith(",", pos):
            pos += 1
        elif text.startswith("}", pos):
            return obj, pos + 1
        else:
            raise _ScanError(f"expected ',' or '}}' after argument {snippet(key)}, got {snippet(text[pos : pos + 20])}")


def _call(body: str) -> tuple[str, dict[str, Any], int]:
    """Read ``call:NAME{...}`` at the start of ``body``: the name, the arguments and the index past them."""
    if not body.startswith("call:"):
        raise _ScanError(f"a tool call starts with 'call:', got {snippet(body[:20])}")
    brace = body.find("{", 5)
    if brace == -1:
        raise _ScanError("tool call has no '{' for its arguments")
    name = body[5:brace]
    if not valid_name(name):
        raise _ScanError(f"invalid tool name {snippet(name)}" if name else "tool call has no name")
    arguments, end = _object(body, brace, 1)
    return name, arguments, end


class Gemma4ToolParser(DelimitedToolParser):
    """Strict parser for Gemma 4 ``<|tool_call>call:NAME{...}<tool_call|>`` calls.

    Reasoning is the ``<|channel>thought ... <channel|>`` block (the channel name is dropped); calls inside
    it are never returned. Anything that does not follow the format (a missing ``call:``, an unquoted string,
    a duplicate key, text between the arguments and ``<tool_call|>``) gives a malformed call with the exact
    raw text and a one-line error; nothing is repaired.
    """

    name = "gemma4"

    def __init__(self) -> None:
        super().__init__(
            think_start="<|channel>", think_end="<channel|>", tool_start="<|tool_call>", tool_end="<tool_call|>"
        )

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls."""
        split = self._split(text, reasoning_open)
        reasoning = split.reasoning
        if reasoning is not None and reasoning.startswith("thought"):
            reasoning = reasoning[len("thought") :].strip("\n") or None
        content = split.content
        if split.calls and content.endswith(TOOL_RESPONSE):
            content = content[: -len(TOOL_RESPONSE)].rstrip()
        return ParsedOutput(content=content, reasoning=reasoning, calls=[self._parse_call(c) for c in split.calls])

    def _find_call_end(self, text: str, body_start: int) -> int | None:
        """Past the ``<tool_call|>`` that follows the arguments (quoted strings may hold the marker)."""
        try:
            _, _, end = _call(text[body_start:])
            search_from = body_start + end
        except _ScanError:
            search_from = body_start
        at = text.find(self.tool_end, search_from)
        return None if at == -1 else at + len(self.tool_end)

    def _parse_call(self, call: RawCall) -> ToolCall:
        found = _NAME_SALVAGE.match(call.body)
        salvaged = found.group(1) if found and valid_name(found.group(1)) else None
        if not call.closed:
            return malformed_call(call.raw, f"tool call is not closed: no {self.tool_end} before the end", salvaged)
        try:
            name, arguments, end = _call(call.body)
        except _ScanError as exc:
            return malformed_call(call.raw, str(exc), salvaged)
        if end != len(call.body):
            return malformed_call(call.raw, f"unexpected text after the arguments: {snippet(call.body[end:])}", name)
        return ToolCall(id=new_call_id(), name=name, input=arguments, raw=call.raw)

"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: ``{"name": NAME, "parameters": {...}}``, bare or after ``<|python_tag|>``.

The official templates render a call as the whole assistant message, ``{"name": "f", "parameters": {...}}``,
ended by ``<|eot_id|>`` (or ``<|eom_id|>`` in ipython mode); models also write ``<|python_tag|>`` before it.
Several calls are accepted one after another, separated by whitespace or ``;``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tito_core.conversation import ToolSpec
from tito_core.grammar import json_call_grammar
from tito_core.tool_parsers._common import call_from_json_object, decode_call_object, json_end, valid_name
from tito_core.tool_parsers._reasoning import ThinkAwareParser, skip_whitespace
from tito_core.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    loads_json_strict,
    malformed_call,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JSONToolParser(ThinkAwareParser):
    """Strict parser for Llama 3.x JSON tool calls.

    A call region starts at ``<|python_tag|>`` or, with ``bare_json`` (default), at visible text that
    starts with ``{``; text before ``<|python_tag|>`` is content. Each call must be a JSON object with
    exactly ``"name"`` (a tool name) and ``"parameters"`` (an object). Anything else in the region
    (invalid JSON, ``"arguments"`` instead of ``"parameters"``, the built-in ``tool.call(...)`` syntax,
    trailing text) is a malformed call keeping its exact raw text; nothing is repaired. Llama 3 has no
    reasoning markup, but ``<think>`` blocks (R1 distills) are reasoning and never hold calls.

    Args:
        think_start: Opening reasoning delimiter.
        think_end: Closing reasoning delimiter.
        bare_json: Treat visible text starting with ``{`` as calls (the official template's layout).

    """

    name = "llama3_json"

    def __init__(self, *, think_start: str = "<think>", think_end: str = "</think>", bare_json: bool = True) -> None:
        super().__init__(think_start=think_start, think_end=think_end, python_tag=PYTHON_TAG)
        self.bare_json = bare_json

    def call_grammar(self, tools: Sequence[ToolSpec]) -> str:
        """EBNF for one call as the official template writes it: bare ``{"name": ..., "parameters": ...}``."""
        return json_call_grammar(tools, "parameters")

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls."""
        # a python_tag call has no end marker: its region is never closed, so it runs to the end of the output
        split = self._split_reasoning(text, PYTHON_TAG, "\x00tito-no-end\x00", lambda s, _: None, reasoning_open)
        content = split.content
        regions = [call.raw for call in split.calls]
        if not regions and self.bare_json and content.startswith("{"):
            regions, content = [content], ""
        calls: list[ToolCall] = []
        for region in regions:
            calls.extend(self._parse_region(region))
        return ParsedOutput(content=content, reasoning=split.reasoning, calls=calls)

    def _parse_region(self, region: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        pos = len(PYTHON_TAG) if region.startswith(PYTHON_TAG) else 0
        start = 0
        while True:
            pos = skip_whitespace(region, pos)
            if calls:
                start = pos
            if pos >= len(region):
                if not calls:
                    return [malformed_call(region, "tool call is empty")]
                return calls
            end = json_end(region, pos) if region.startswith("{", pos) else None
            if end is None:
                what = "is not a JSON object" if not region.startswith("{", pos) else "is not valid JSON"
                return [*calls, malformed_call(region[start:], f"tool call {what}: {self._why(region, pos)}")]
            calls.append(self._call(region[start:end], region[pos:end]))
            pos = skip_whitespace(region, end)
            if region.startswith(";", pos):
                pos += 1

    @staticmethod
    def _why(region: str, pos: int) -> str:
        try:
            loads_json_strict(region[pos:])
        except ValueError as exc:
            return str(exc)
        return "unexpected text"

    @staticmethod
    def _call(raw: str, body: str) -> ToolCall:
        try:
            obj = decode_call_object(body)
        except ValueError as exc:
            return malformed_call(raw, str(exc))
        name = obj.get("name")
        if not isinstance(name, str) or not valid_name(name):
            return malformed_call(raw, 'tool call needs "name": a tool name string')
        return call_from_json_object(obj, raw, name, "parameters")

"""Hermes tool calls (Qwen2.5, Qwen3, ...): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tito_core.conversation import ToolSpec
from tito_core.grammar import json_call_grammar
from tito_core.tool_parsers._common import call_from_json_object, decode_call_object
from tito_core.tool_parsers._reasoning import DelimitedToolParser, RawCall, index_past, skip_whitespace
from tito_core.tool_parsers.base import (
    UNKNOWN_TOOL_NAME,
    ParsedOutput,
    ToolCall,
    json_type_name,
    malformed_call,
)

_NAME_SALVAGE = re.compile(r'"name"\s*:\s*"([^"]+)"')
_LENIENT_DECODER = json.JSONDecoder()


class HermesToolParser(DelimitedToolParser):
    """Strict parser for hermes-style JSON tool calls.

    The body of each ``<tool_call>...</tool_call>`` (surrounding whitespace allowed) must be one JSON
    object with exactly the keys ``"name"`` (a non-empty string) and ``"arguments"`` (a JSON object).
    Anything else (invalid JSON, NaN, duplicate keys, arguments given as a string or a list, extra
    keys, a missing end tag) gives a malformed call with the exact raw text and a one-line error;
    nothing is repaired. The end of a call is found by decoding its JSON, so an argument that quotes
    ``</tool_call>`` or ``<think>`` does not cut the call short.

    Args:
        think_start: Opening reasoning delimiter.
        think_end: Closing reasoning delimiter.
        tool_start: Opening tool-call delimiter.
        tool_end: Closing tool-call delimiter.
        allow_missing_arguments: Accept a call without an ``"arguments"`` key as a call with no
            arguments (``{}``). Off by default: the format always writes ``"arguments"``.

    """

    name = "hermes"

    def __init__(
        self,
        *,
        think_start: str = "<think>",
        think_end: str = "</think>",
        tool_start: str = "<tool_call>",
        tool_end: str = "</tool_call>",
        allow_missing_arguments: bool = False,
    ) -> None:
        super().__init__(think_start=think_start, think_end=think_end, tool_start=tool_start, tool_end=tool_end)
        self.allow_missing_arguments = allow_missing_arguments

    def call_grammar(self, tools: Sequence[ToolSpec]) -> str:
        """EBNF for one call as the format writes it: ``{"name": ..., "arguments": ...}`` between the tags."""
        return json_call_grammar(tools, "arguments", before=f"{self.tool_start}\n", after=f"\n{self.tool_end}")

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls; ``tools`` is not needed."""
        split = self._split(text, reasoning_open)
        calls = [self._parse_call(call) for call in split.calls]
        return ParsedOutput(content=split.content, reasoning=split.reasoning, calls=calls)

    def _find_call_end(self, text: str, body_start: int) -> int | None:
        """End of the call: the first end tag after the JSON value when one decodes, else the first."""
        search_from = body_start
        value_start = skip_whitespace(text, body_start)
        if text.startswith("{", value_start):
            try:
                _, search_from = _LENIENT_DECODER.raw_decode(text, value_start)
            except (ValueError, RecursionError):
                search_from = body_start
        return index_past(text, self.tool_end, search_from)

    def _parse_call(self, call: RawCall) -> ToolCall:
        if not call.closed:
            return self._malformed(call, f"tool call is not closed: no {self.tool_end} before the end of the output")
        body = call.body.strip()
        if not body:
            return self._malformed(call, "tool call is empty")
        try:
            obj = decode_call_object(body)
        except ValueError as exc:
            return self._malformed(call, str(exc))
        name = obj.get("name")
        if "name" not in obj:
            return self._malformed(call, 'tool call has no "name"', UNKNOWN_TOOL_NAME)
        if not isinstance(name, str) or not name.strip():
            got = "a blank string" if isinstance(name, str) else json_type_name(name)
            return self._malformed(call, f'tool call "name" must be a non-empty string, got {got}', UNKNOWN_TOOL_NAME)
        return call_from_json_object(obj, call.raw, name, "arguments", allow_missing=self.allow_missing_arguments)

    @staticmethod
    def _malformed(call: RawCall, error: str, name: str | None = None) -> ToolCall:
        if name is None:
            found = _NAME_SALVAGE.search(call.raw)
            name = found.group(1).strip() if found else None
        return malformed_call(call.raw, error, name)

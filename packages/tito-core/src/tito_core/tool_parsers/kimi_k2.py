"""Kimi-K2 tool calls: a section of calls with ids ``functions.NAME:IDX`` and JSON arguments.

Format (one line here, no whitespace in between as the official template renders it)::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>

Calls keep the order generated; their ids are the generated ``functions.NAME:IDX`` strings (never
sorted as strings: ``:10`` sorts before ``:2``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tito_core.conversation import ToolSpec
from tito_core.tool_parsers._common import call_with_json_arguments, json_end, scan_call_section, snippet, valid_name
from tito_core.tool_parsers._reasoning import DelimitedToolParser, RawCall, index_past, skip_whitespace
from tito_core.tool_parsers.base import ParsedOutput, ToolCall, malformed_call

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_CALL_ID = re.compile(r"(?:functions\.)?([^\s:<>]+):([0-9]+)")


class KimiK2ToolParser(DelimitedToolParser):
    """Strict parser for Kimi-K2 tool-call sections.

    Inside a section, each call must read ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>``
    + a JSON object + ``<|tool_call_end|>`` (whitespace between calls allowed). The call id is the
    generated ``functions.NAME:IDX``; a repeated id, a bad id, invalid JSON or stray text gives a
    malformed call keeping its raw text (the rest of a section that cannot be read is one malformed
    call); nothing is repaired. Reasoning (Kimi-K2-Thinking) sits in ``<think>...</think>``.
    """

    name = "kimi_k2"

    def __init__(self, *, think_start: str = "<think>", think_end: str = "</think>") -> None:
        super().__init__(think_start=think_start, think_end=think_end, tool_start=SECTION_BEGIN, tool_end=SECTION_END)

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls."""
        split = self._split(text, reasoning_open)
        calls: list[ToolCall] = []
        for section in split.calls:
            calls.extend(self._parse_section(section))
        return ParsedOutput(content=split.content, reasoning=split.reasoning, calls=calls)

    def _find_call_end(self, text: str, body_start: int) -> int | None:
        pos = body_start
        while True:
            pos = skip_whitespace(text, pos)
            if not text.startswith(CALL_BEGIN, pos):
                break
            arg = text.find(ARGUMENT_BEGIN, pos)
            end = json_end(text, arg + len(ARGUMENT_BEGIN)) if arg != -1 else None
            if end is None:
                pos = body_start
                break
            pos = skip_whitespace(text, end)
            if text.startswith(CALL_END, pos):
                pos += len(CALL_END)
        return index_past(text, self.tool_end, pos)

    def _parse_section(self, section: RawCall) -> list[ToolCall]:
        body, raw = section.body, section.raw
        found, rest = scan_call_section(
            body,
            CALL_BEGIN,
            CALL_END,
            ARGUMENT_BEGIN,
            unexpected="unexpected text in the tool-call section",
            object_arguments=False,
        )
        seen: set[str] = set()
        calls = [self._call(call_raw, inner, seen) for call_raw, inner in found]
        if rest is not None:
            return [*calls, rest]
        if not section.closed:
            closing = f"tool-call section is not closed: no {SECTION_END} before the end of the output"
            if not calls:
                return [malformed_call(raw, closing)]
            calls = [malformed_call(c.raw, closing, c.name) if not c.is_error else c for c in calls]
        if not calls:
            return [malformed_call(raw, "tool-call section holds no call")]
        return calls

    @staticmethod
    def _call(raw: str, inner: str, seen: set[str]) -> ToolCall:
        if ARGUMENT_BEGIN not in inner:
            return malformed_call(raw, f"tool call has no {ARGUMENT_BEGIN}")
        call_id, arguments = inner.split(ARGUMENT_BEGIN, 1)
        call_id = call_id.strip()
        found = _CALL_ID.fullmatch(call_id)
        if found is None or not valid_name(found.group(1)):
            return malformed_call(raw, f"invalid tool-call id {snippet(call_id)} (expected functions.NAME:IDX)")
        name = found.group(1)
        if call_id in seen:
            return malformed_call(raw, f"duplicate tool-call id {snippet(call_id)}", name)
        seen.add(call_id)
        return call_with_json_arguments(raw, name, arguments, call_id)

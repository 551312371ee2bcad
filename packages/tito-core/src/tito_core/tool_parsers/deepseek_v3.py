"""DeepSeek V3 / V3.1 / V3.2 tool calls (full-width ``｜`` and ``▁`` in every marker).

- V3.1 (and V3.1-Terminus)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

- V3 / R1 (the original layout): ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` + a newline +
  ```` ```json ```` + newline + ``{...}`` + newline + ```` ``` ```` + ``<｜tool▁call▁end｜>``.
- V3.2 (DSML)::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">text</｜DSML｜parameter>
    <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>
"""

# ruff: noqa: RUF001, RUF002  (DeepSeek's markers are spelled with full-width characters)

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tito_core.conversation import ToolSpec
from tito_core.tool_parsers._common import call_with_json_arguments, json_end, scan_call_section, snippet, valid_name
from tito_core.tool_parsers._reasoning import ThinkAwareParser, find_delimiter_end, index_past, skip_whitespace
from tito_core.tool_parsers.base import ParsedOutput, ToolCall, loads_json_strict, malformed_call, new_call_id

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
DSML = "｜DSML｜"
DSML_BEGIN = f"<{DSML}function_calls>"
DSML_END = f"</{DSML}function_calls>"
_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]*)">')
_INVOKE_END = f"</{DSML}invoke>"
_PARAM = re.compile(rf'<{DSML}parameter name="([^"]*)" string="(true|false)">')
_PARAM_END = f"</{DSML}parameter>"
_V3_ARGS = re.compile(r"\n```json\n(.*)\n```", re.DOTALL)


class DeepSeekV3ToolParser(ThinkAwareParser):
    """Strict parser for DeepSeek V3 / V3.1 / V3.2 tool calls.

    The layout is read from the output: a DSML ``function_calls`` block (V3.2) or a
    ``<｜tool▁calls▁begin｜>`` section (V3.1, or V3 when the part before ``<｜tool▁sep｜>`` is the
    type ``function`` and a fenced JSON block follows the name). Arguments must be a JSON object; DSML
    parameters are text when ``string="true"`` and strict JSON when ``string="false"``. Anything else
    is a malformed call keeping its raw text; nothing is repaired. Reasoning sits in
    ``<think>...</think>`` (the thinking-mode generation prompt pre-opens ``<think>``).

    Args:
        think_start: Opening reasoning delimiter.
        think_end: Closing reasoning delimiter.

    """

    name = "deepseek_v3"

    def __init__(self, *, think_start: str = "<think>", think_end: str = "</think>") -> None:
        super().__init__(think_start=think_start, think_end=think_end, calls=CALLS_BEGIN, dsml=DSML_BEGIN)

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls."""
        dsml = DSML_BEGIN in text and (CALLS_BEGIN not in text or text.index(DSML_BEGIN) < text.index(CALLS_BEGIN))
        start, end = (DSML_BEGIN, DSML_END) if dsml else (CALLS_BEGIN, CALLS_END)
        split = self._split_reasoning(text, start, end, _dsml_end if dsml else _section_end, reasoning_open)
        calls: list[ToolCall] = []
        for section in split.calls:
            if not section.closed:
                calls.append(malformed_call(section.raw, f"tool calls are not closed: no {end} before the end"))
            elif dsml:
                calls.extend(_parse_dsml(section.body))
            else:
                calls.extend(_parse_section(section.body, section.raw))
        return ParsedOutput(content=split.content, reasoning=split.reasoning, calls=calls)


def _section_end(text: str, body_start: int) -> int | None:
    pos = body_start
    while True:
        pos = skip_whitespace(text, pos)
        if not text.startswith(CALL_BEGIN, pos):
            break
        close = text.find(CALL_END, pos)
        sep = text.find(SEP, pos)
        if close == -1:
            break
        if sep != -1 and sep < close and text.startswith("{", skip_whitespace(text, sep + len(SEP))):
            json_close = json_end(text, sep + len(SEP))
            if json_close is not None and json_close > close:
                close = text.find(CALL_END, json_close)
                if close == -1:
                    break
        pos = close + len(CALL_END)
    return index_past(text, CALLS_END, pos)


def _parse_section(body: str, raw: str) -> list[ToolCall]:
    found, rest = scan_call_section(
        body, CALL_BEGIN, CALL_END, SEP, unexpected="unexpected text among tool calls", object_arguments=True
    )
    calls = [_call(call_raw, inner) for call_raw, inner in found]
    if rest is not None:
        return [*calls, rest]
    return calls or [malformed_call(raw, "tool-call section holds no call")]


def _call(raw: str, inner: str) -> ToolCall:
    if SEP not in inner:
        return malformed_call(raw, f"tool call has no {SEP}")
    head, rest = inner.split(SEP, 1)
    if head == "function" and not rest.lstrip().startswith("{"):  # V3: type, then name and a fenced block
        name, _, fenced = rest.partition("\n")
        found = _V3_ARGS.fullmatch("\n" + fenced)
        if not valid_name(name):
            return malformed_call(raw, f"invalid tool name {snippet(name)}")
        if found is None:
            return malformed_call(raw, "expected a ```json fenced block after the tool name", name)
        head, rest = name, found.group(1)
    if not valid_name(head):
        return malformed_call(raw, f"invalid tool name {snippet(head)}")
    return call_with_json_arguments(raw, head, rest)


_dsml_end = find_delimiter_end(DSML_END)


def _parse_dsml(body: str) -> list[ToolCall]:
    calls: list[ToolCall] = []
    pos = 0
    while True:
        pos = skip_whitespace(body, pos)
        if pos >= len(body):
            return calls or [malformed_call(body, "function_calls block holds no invoke")]
        found = _INVOKE.match(body, pos)
        if found is None:
            return [*calls, malformed_call(body[pos:], f"unexpected text among invokes: {snippet(body[pos:])}")]
        close = body.find(_INVOKE_END, found.end())
        if close == -1:
            return [*calls, malformed_call(body[pos:], f"invoke is not closed: no {_INVOKE_END}")]
        end = close + len(_INVOKE_END)
        calls.append(_invoke(body[pos:end], found.group(1), body[found.end() : close]))
        pos = end


def _invoke(raw: str, name: str, inner: str) -> ToolCall:
    if not valid_name(name):
        return malformed_call(raw, f"invalid tool name {snippet(name)}")
    arguments: dict[str, Any] = {}
    pos = 0
    while True:
        pos = skip_whitespace(inner, pos)
        if pos >= len(inner):
            return ToolCall(id=new_call_id(), name=name, input=arguments, raw=raw)
        found = _PARAM.match(inner, pos)
        if found is None:
            return malformed_call(raw, f"unexpected text in invoke {name!r}: {snippet(inner[pos:])}", name)
        key, is_string = found.group(1), found.group(2) == "true"
        close = inner.find(_PARAM_END, found.end())
        if close == -1:
            return malformed_call(raw, f'parameter "{key}" is not closed: no {_PARAM_END}', name)
        if not key or key in arguments:
            return malformed_call(raw, f"{'duplicate' if key else 'empty'} parameter name {snippet(key)}", name)
        value = inner[found.end() : close]
        if is_string:
            arguments[key] = value
        else:
            try:
                arguments[key] = loads_json_strict(value)
            except ValueError as exc:
                return malformed_call(raw, f'parameter "{key}" (string="false") is not valid JSON: {exc}', name)
        pos = close + len(_PARAM_END)

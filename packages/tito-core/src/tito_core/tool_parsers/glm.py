"""GLM-4.5 / 4.6 / 4.7 tool calls: a name, then key / value tags, typed by the tool's JSON schema.

Format (as the official template renders it)::

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

The template writes string values verbatim and every other value as JSON (``tojson``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tito_core.conversation import ToolSpec
from tito_core.tool_parsers._common import input_schemas, schema_typed_arguments, snippet, valid_name
from tito_core.tool_parsers._reasoning import DelimitedToolParser, RawCall, index_past, skip_whitespace
from tito_core.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    json_type_name,
    loads_json_strict,
    malformed_call,
    new_call_id,
)

KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
_NAME_SALVAGE = re.compile(r"<tool_call>\s*([^\s<]+)")


class _Scanned(NamedTuple):
    name: str
    pairs: list[tuple[str, str]]
    end: int


class _ScanError(Exception):
    pass


def _scan(text: str, start: int, tool_end: str) -> _Scanned:
    """Read ``NAME`` and its key / value pairs from ``text[start:]`` up to (not including) ``tool_end``."""
    stops = [at for at in (text.find(KEY_OPEN, start), text.find(tool_end, start)) if at != -1]
    name_end = min(stops) if stops else len(text)
    name = text[start:name_end].strip()
    if not valid_name(name):
        raise _ScanError(f"invalid tool name {snippet(name)}" if name else "tool call has no name")
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    pos = name_end
    while True:
        pos = skip_whitespace(text, pos)
        if text.startswith(KEY_OPEN, pos):
            key_end = text.find(KEY_CLOSE, pos)
            if key_end == -1:
                raise _ScanError(f"{KEY_OPEN} is not closed")
            key = text[pos + len(KEY_OPEN) : key_end]
            if not key or key != key.strip() or "<" in key:
                raise _ScanError(f"invalid argument key {snippet(key)}")
            pos = skip_whitespace(text, key_end + len(KEY_CLOSE))
            if not text.startswith(VALUE_OPEN, pos):
                raise _ScanError(f'argument "{key}" has no {VALUE_OPEN}')
            value_end = text.find(VALUE_CLOSE, pos)
            if value_end == -1:
                raise _ScanError(f'argument "{key}" is not closed: no {VALUE_CLOSE}')
            if key in seen:
                raise _ScanError(f'duplicate argument "{key}"')
            seen.add(key)
            pairs.append((key, text[pos + len(VALUE_OPEN) : value_end]))
            pos = value_end + len(VALUE_CLOSE)
        elif text.startswith(tool_end, pos) or pos >= len(text):
            return _Scanned(name, pairs, pos)
        else:
            raise _ScanError(f"unexpected text in tool call {name!r}: {snippet(text[pos : pos + 60])}")


def _typed(value: str, types: list[str]) -> Any:
    """``value`` as one of ``types``: non-string types first (strict JSON of that type), a string last.

    The template writes strings verbatim and everything else as JSON, so in a union such as
    ``["string", "null"]`` the text ``null`` is the JSON null.
    """
    if not types:
        return value
    error = ""
    for json_type in [t for t in types if t != "string"]:
        try:
            decoded = loads_json_strict(value.strip())
        except ValueError as exc:
            error = str(exc)
            continue
        got = json_type_name(decoded)
        if got == json_type or (json_type == "number" and got == "integer"):
            return decoded
        error = f"got a JSON {got}"
    if "string" in types:
        return value
    raise ValueError(f"expected {' or '.join(types)}, got {snippet(value)} ({error})")


class GLMToolParser(DelimitedToolParser):
    """Strict parser for GLM-4.5+ ``<arg_key>`` / ``<arg_value>`` tool calls.

    Values are typed by the tool's JSON schema (from ``tools``): a ``string`` parameter keeps its exact
    text; any other type must be valid JSON of that type (``5``, ``true``, ``null``, ``[1, 2]``); in a
    union the non-string types are tried first (in schema order) and a string last. A parameter with no
    usable schema, or of an unknown tool, stays a string. A missing name, an unclosed tag, a duplicate
    key, text outside the tags or a value of the wrong type gives a malformed call with the exact raw
    text and a one-line error; nothing is repaired.
    """

    name = "glm"

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls typed by the schemas in ``tools``."""
        split = self._split(text, reasoning_open)
        schemas = input_schemas(tools) if split.calls else {}
        calls = [self._parse_call(call, schemas) for call in split.calls]
        return ParsedOutput(content=split.content, reasoning=split.reasoning, calls=calls)

    def _find_call_end(self, text: str, body_start: int) -> int | None:
        try:
            search_from = _scan(text, body_start, self.tool_end).end
        except _ScanError:
            search_from = body_start
        return index_past(text, self.tool_end, search_from)

    def _parse_call(self, call: RawCall, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall:
        if not call.closed:
            return self._malformed(call, f"tool call is not closed: no {self.tool_end} before the end of the output")
        try:
            scanned = _scan(call.body, 0, self.tool_end)
        except _ScanError as exc:
            return self._malformed(call, str(exc))
        try:
            arguments = schema_typed_arguments(scanned.name, scanned.pairs, schemas, _typed, "argument")
        except ValueError as exc:
            return malformed_call(call.raw, str(exc), scanned.name)
        return ToolCall(id=new_call_id(), name=scanned.name, input=arguments, raw=call.raw)

    @staticmethod
    def _malformed(call: RawCall, error: str) -> ToolCall:
        found = _NAME_SALVAGE.search(call.raw)
        name = found.group(1) if found and valid_name(found.group(1)) else None
        return malformed_call(call.raw, error, name)

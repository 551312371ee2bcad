"""Qwen3-Coder / Qwen3.5 XML tool calls, typed by the tool's JSON schema.

Format (one newline around each value, added by the chat template)::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tito_core.conversation import ToolSpec
from tito_core.grammar import Ebnf, literal, one_call_of, schema_rule
from tito_core.grammar import input_schema as spec_input_schema
from tito_core.tool_parsers._common import input_schemas, schema_typed_arguments, snippet
from tito_core.tool_parsers._reasoning import DelimitedToolParser, RawCall, index_past, skip_whitespace
from tito_core.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    json_type_name,
    loads_json_strict,
    malformed_call,
    new_call_id,
)

_FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAM_OPEN = "<parameter="
_PARAM_CLOSE = "</parameter>"
_NAME_SALVAGE = re.compile(r"<function=([^\s<>]+)>")
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?", re.ASCII)


class _Function(NamedTuple):
    name: str
    params: list[tuple[str, str]]
    end: int


class _ScanError(Exception):
    pass


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _bad_tag_name(name: str) -> bool:
    return not name or any(ch.isspace() or ch == "<" for ch in name)


def _scan_function(text: str, start: int) -> _Function:
    """Read ``<function=NAME>`` and its parameters from ``text[start:]`` up to ``</function>``."""
    pos = skip_whitespace(text, start)
    if not text.startswith(_FUNCTION_OPEN, pos):
        raise _ScanError(f"tool call has no {_FUNCTION_OPEN}NAME> tag")
    close = text.find(">", pos)
    name = text[pos + len(_FUNCTION_OPEN) : close]
    if close == -1 or _bad_tag_name(name):
        raise _ScanError(f"invalid {_FUNCTION_OPEN}NAME> tag: {snippet(text[pos : pos + 60])}")
    params: list[tuple[str, str]] = []
    seen: set[str] = set()
    pos = close + 1
    while True:
        pos = skip_whitespace(text, pos)
        if text.startswith(_PARAM_OPEN, pos):
            close = text.find(">", pos)
            key = text[pos + len(_PARAM_OPEN) : close]
            if close == -1 or _bad_tag_name(key):
                raise _ScanError(f"invalid {_PARAM_OPEN}KEY> tag: {snippet(text[pos : pos + 60])}")
            value_end = text.find(_PARAM_CLOSE, close + 1)
            if value_end == -1:
                raise _ScanError(f'parameter "{key}" is not closed: no {_PARAM_CLOSE}')
            if key in seen:
                raise _ScanError(f'duplicate parameter "{key}"')
            seen.add(key)
            params.append((key, _strip_one_newline(text[close + 1 : value_end])))
            pos = value_end + len(_PARAM_CLOSE)
        elif text.startswith(_FUNCTION_CLOSE, pos):
            return _Function(name, params, pos + len(_FUNCTION_CLOSE))
        elif pos >= len(text):
            raise _ScanError(f"{_FUNCTION_OPEN}{name}> is not closed: no {_FUNCTION_CLOSE}")
        else:
            raise _ScanError(f"unexpected text inside {_FUNCTION_OPEN}{name}>: {snippet(text[pos : pos + 60])}")


def _convert(value: str, json_type: str) -> Any:
    """``value`` as ``json_type``; raises ValueError when it is not one."""
    if json_type == "string":
        return value
    text = value.strip()
    if json_type == "integer":
        if _INTEGER.fullmatch(text):
            return int(text)
    elif json_type == "number":
        if _NUMBER.fullmatch(text):
            if _INTEGER.fullmatch(text):
                return int(text)
            number = float(text)
            if number not in (float("inf"), float("-inf")):
                return number
    elif json_type == "boolean":
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
    elif json_type == "null":
        if text.lower() in ("null", "none"):
            return None
    elif json_type in ("object", "array"):
        decoded = loads_json_strict(text)
        if json_type_name(decoded) == json_type:
            return decoded
        raise ValueError(f"got a JSON {json_type_name(decoded)}")
    raise ValueError("")


def _xml_value(ebnf: Ebnf, schema: Any, hint: str, document: Mapping[str, Any]) -> str:
    """EBNF for a parameter value as this parser reads it.

    Strings (and enum / const strings) are raw text; other values are the canonical JSON of their schema.
    """
    if isinstance(schema, Mapping):
        choices = (
            schema["enum"] if isinstance(schema.get("enum"), list) else [schema["const"]] if "const" in schema else None
        )
        if choices:
            return "( " + " | ".join(literal(v if isinstance(v, str) else json.dumps(v)) for v in choices) + " )"
        options = schema.get("anyOf") or schema.get("oneOf")
        kind = schema.get("type")
        texty = kind == "string" or (isinstance(kind, list) and "string" in kind)
        if isinstance(options, list):
            texty = texty or any(isinstance(o, Mapping) and o.get("type") == "string" for o in options)
        if not texty and (kind is not None or options or "$ref" in schema):
            return schema_rule(ebnf, schema, hint, document=document)
    return ebnf.shared("xml_text", '( [^<] | "<" [^/] )*')


class QwenXMLToolParser(DelimitedToolParser):
    """Strict parser for the Qwen3-Coder / Qwen3.5 XML tool-call format.

    Values are typed by the tool's JSON schema (from ``tools``): a ``string`` parameter keeps its
    exact text minus one leading and one trailing newline (``"007"`` stays ``"007"``); ``integer``,
    ``number``, ``boolean`` (``true`` / ``false``, any case), ``null`` (``null`` / ``None``) and
    ``object`` / ``array`` (JSON) are converted and must be well-formed; unions (a type list,
    ``anyOf`` / ``oneOf``, an ``enum``) are tried in schema order. A parameter with no usable
    schema, or of an unknown tool, stays a string. A missing ``<function=...>``, an unclosed tag, a
    duplicate parameter, text outside the tags or a value of the wrong type gives a malformed call
    with the exact raw text and a one-line error; nothing is repaired.

    Args:
        think_start: Opening reasoning delimiter.
        think_end: Closing reasoning delimiter.
        tool_start: Opening tool-call delimiter.
        tool_end: Closing tool-call delimiter.

    """

    name = "qwen_xml"

    def call_grammar(self, tools: Sequence[ToolSpec]) -> str:
        """EBNF for one call in the template's layout (one newline around each value).

        Parameters come in schema order, required ones always written. A string value is any text without
        ``</``; other values are the canonical JSON of their schema.
        """

        def call(ebnf: Ebnf, spec: ToolSpec) -> str:
            schema = spec_input_schema(spec)
            props = schema.get("properties")
            required = set(schema.get("required") or ())
            parts = [literal(f"{self.tool_start}\n{_FUNCTION_OPEN}{spec['name']}>\n")]
            for key, sub in props.items() if isinstance(props, Mapping) else ():
                value = _xml_value(ebnf, sub, f"{spec['name']}_{key}", schema)
                open_tag, close_tag = literal(f"{_PARAM_OPEN}{key}>\n"), literal(f"\n{_PARAM_CLOSE}\n")
                param = f"{open_tag} {value} {close_tag}"
                parts.append(param if key in required else f"( {param} )?")
            parts.append(literal(f"{_FUNCTION_CLOSE}\n{self.tool_end}"))
            return " ".join(parts)

        return one_call_of(tools, call)

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls typed by the schemas in ``tools``."""
        split = self._split(text, reasoning_open)
        schemas = input_schemas(tools) if split.calls else {}
        calls = [self._parse_call(call, schemas) for call in split.calls]
        return ParsedOutput(content=split.content, reasoning=split.reasoning, calls=calls)

    def _find_call_end(self, text: str, body_start: int) -> int | None:
        """Find the first end tag after ``</function>`` when the call reads well, else the first one."""
        try:
            search_from = _scan_function(text, body_start).end
        except _ScanError:
            search_from = body_start
        return index_past(text, self.tool_end, search_from)

    def _parse_call(self, call: RawCall, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall:
        if not call.closed:
            return self._malformed(call, f"tool call is not closed: no {self.tool_end} before the end of the output")
        try:
            function = _scan_function(call.body, 0)
        except _ScanError as exc:
            return self._malformed(call, str(exc))
        trailing = call.body[function.end :]
        if trailing.strip():
            return self._malformed(call, f"unexpected text after {_FUNCTION_CLOSE}: {snippet(trailing.strip())}")
        try:
            arguments = schema_typed_arguments(function.name, function.params, schemas, self._typed, "parameter")
        except ValueError as exc:
            return malformed_call(call.raw, str(exc), function.name)
        return ToolCall(id=new_call_id(), name=function.name, input=arguments, raw=call.raw)

    @staticmethod
    def _typed(value: str, types: list[str]) -> Any:
        if not types:
            return value
        details: list[str] = []
        for json_type in types:
            try:
                return _convert(value, json_type)
            except ValueError as exc:
                if str(exc):
                    details.append(str(exc))
        detail = f" ({details[0]})" if details else ""
        raise ValueError(f"expected {' or '.join(types)}, got {snippet(value)}{detail}")

    @staticmethod
    def _malformed(call: RawCall, error: str) -> ToolCall:
        found = _NAME_SALVAGE.search(call.raw)
        return malformed_call(call.raw, error, found.group(1) if found else None)

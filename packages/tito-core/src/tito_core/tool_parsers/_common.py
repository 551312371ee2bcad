"""Helpers shared by the parsers: JSON values and calls, tool names, schema-typed arguments."""

# ruff: noqa: RUF001  (DeepSeek's markers are spelled with full-width characters)

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tito_core.conversation import ToolSpec
from tito_core.tool_parsers._reasoning import skip_whitespace
from tito_core.tool_parsers.base import ToolCall, json_type_name, loads_json_strict, malformed_call, new_call_id

_LENIENT = json.JSONDecoder()
_NAME = re.compile(r"[^\s<>\[\]{}\"'`|｜]+")


def json_end(text: str, pos: int) -> int | None:
    """Index just past the JSON value starting at ``pos`` (after whitespace), or None when none decodes."""
    start = skip_whitespace(text, pos)
    try:
        _, end = _LENIENT.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return int(end)


def json_object(text: str, what: str = "arguments") -> dict[str, Any]:
    """Decode ``text`` (surrounding whitespace allowed) as one JSON object, strictly.

    Raises:
        ValueError: With a one-line message naming ``what`` and what is wrong.

    """
    body = text.strip()
    if not body:
        raise ValueError(f"{what} are empty (write {{}} for none)")
    try:
        value = loads_json_strict(body)
    except ValueError as exc:
        raise ValueError(f"{what} are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, got {json_type_name(value)}")
    return value


def call_with_json_arguments(raw: str, name: str, arguments: str, call_id: str | None = None) -> ToolCall:
    """A call to ``name`` whose ``arguments`` text is one JSON object (see :func:`json_object`), or a malformed call."""
    try:
        parsed = json_object(arguments)
    except ValueError as exc:
        return malformed_call(raw, f'tool call "{name}": {exc}', name)
    return ToolCall(id=call_id or new_call_id(), name=name, input=parsed, raw=raw)


def decode_call_object(body: str) -> dict[str, Any]:
    """Decode a tool call written as one JSON object (``{"name": ..., ...}``), strictly.

    Raises:
        ValueError: With a one-line message: not valid JSON, or not an object.

    """
    try:
        value = loads_json_strict(body)
    except ValueError as exc:
        raise ValueError(f"tool call is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"tool call must be a JSON object, got {json_type_name(value)}")
    return value


def unexpected_keys(obj: Mapping[str, Any], allowed: Sequence[str]) -> str:
    """The keys of ``obj`` outside ``allowed``, JSON-quoted and comma-separated (empty when none)."""
    return ", ".join(json.dumps(key, ensure_ascii=False) for key in obj if key not in allowed)


def call_from_json_object(
    obj: Mapping[str, Any], raw: str, name: str, arguments_key: str, *, allow_missing: bool = False
) -> ToolCall:
    """The call to ``name`` in a decoded ``{"name": ..., arguments_key: {...}}`` object, or a malformed call.

    Any other key, or arguments that are not a JSON object, make the call malformed; so does a missing
    ``arguments_key`` unless ``allow_missing`` (then the call has no arguments).
    """
    keys = unexpected_keys(obj, ("name", arguments_key))
    if keys:
        error = f'unexpected key(s) {keys} in tool call: only "name" and "{arguments_key}" are allowed'
        return malformed_call(raw, error, name)
    if arguments_key not in obj:
        if allow_missing:
            return ToolCall(id=new_call_id(), name=name, input={}, raw=raw)
        error = f'tool call has no "{arguments_key}" (write "{arguments_key}": {{}} for none)'
        return malformed_call(raw, error, name)
    arguments = obj[arguments_key]
    if not isinstance(arguments, dict):
        error = f"tool call {arguments_key} must be a JSON object, got {json_type_name(arguments)}"
        return malformed_call(raw, error, name)
    return ToolCall(id=new_call_id(), name=name, input=arguments, raw=raw)


def scan_call_section(
    body: str, call_begin: str, call_end: str, arguments_marker: str, *, unexpected: str, object_arguments: bool
) -> tuple[list[tuple[str, str]], ToolCall | None]:
    """Read the ``call_begin ... call_end`` calls of a tool-call section's ``body``, in order.

    Returns each call's raw text and inner text (between the two markers), then a malformed call for
    the rest of the body when that is not a call (its error starts with ``unexpected``) or not closed.
    A ``call_end`` quoted in the JSON after ``arguments_marker`` (with ``object_arguments``, only when
    that JSON is an object) does not end the call.
    """
    found: list[tuple[str, str]] = []
    pos = 0
    while True:
        pos = skip_whitespace(body, pos)
        if pos >= len(body):
            return found, None
        if not body.startswith(call_begin, pos):
            return found, malformed_call(body[pos:], f"{unexpected}: {snippet(body[pos:])}")
        close = body.find(call_end, pos)
        if close == -1:
            return found, malformed_call(body[pos:], f"tool call is not closed: no {call_end}")
        marker = body.find(arguments_marker, pos, close)
        json_start = marker + len(arguments_marker)
        if marker != -1 and (not object_arguments or body.startswith("{", skip_whitespace(body, json_start))):
            json_close = json_end(body, json_start)
            if json_close is not None and json_close > close:  # the end marker was quoted inside the arguments
                later = body.find(call_end, json_close)
                close = later if later != -1 else close
        end = close + len(call_end)
        found.append((body[pos:end], body[pos + len(call_begin) : close]))
        pos = end


def valid_name(name: str) -> bool:
    """A tool name as the formats write it: non-empty, no whitespace, quotes or markup characters."""
    return bool(_NAME.fullmatch(name))


def snippet(value: str, limit: int = 40) -> str:
    """``value`` as short, one-line JSON for error messages."""
    return json.dumps(value if len(value) <= limit else value[:limit] + "...", ensure_ascii=False)


def input_schemas(tools: Sequence[ToolSpec] | None) -> dict[str, Mapping[str, Any]]:
    """Tool name -> root JSON schema of its input."""
    schemas: dict[str, Mapping[str, Any]] = {}
    for spec in tools or ():
        input_schema: Any = spec.get("inputSchema")
        if isinstance(input_schema, Mapping):
            root = input_schema.get("json", input_schema)
            if isinstance(root, Mapping):
                schemas.setdefault(spec.get("name", ""), root)
    return schemas


_KNOWN_TYPES = ("string", "integer", "number", "boolean", "object", "array", "null")
_MAX_REF_DEPTH = 32


def _resolve_ref(schema: Any, root: Mapping[str, Any]) -> Any:
    """Follow local ``$ref`` pointers (``#/...``); anything unresolvable becomes an empty schema."""
    for _ in range(_MAX_REF_DEPTH):
        if not isinstance(schema, Mapping) or not isinstance(schema.get("$ref"), str):
            return schema
        ref: str = schema["$ref"]
        if not ref.startswith("#"):
            return {}
        target: Any = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                return {}
            target = target[part]
        schema = target
    return {}


def schema_types(schema: Any, root: Mapping[str, Any], depth: int = 0) -> list[str]:
    """List the JSON types a schema admits, in schema order (empty when it says nothing usable)."""
    schema = _resolve_ref(schema, root)
    if not isinstance(schema, Mapping) or depth > _MAX_REF_DEPTH:
        return []
    declared = schema.get("type")
    found: list[str] = []
    if isinstance(declared, str):
        found = [declared]
    elif isinstance(declared, list):
        found = [t for t in declared if isinstance(t, str)]
    elif "const" in schema:
        found = [json_type_name(schema["const"])]
    elif isinstance(schema.get("enum"), list):
        found = [json_type_name(value) for value in schema["enum"]]
    else:
        for keyword in ("anyOf", "oneOf", "allOf"):
            options = schema.get(keyword)
            if isinstance(options, list):
                for option in options:
                    found.extend(schema_types(option, root, depth + 1))
    return list(dict.fromkeys(t for t in found if t in _KNOWN_TYPES))


def schema_typed_arguments(
    name: str,
    pairs: Iterable[tuple[str, str]],
    schemas: Mapping[str, Mapping[str, Any]],
    convert: Callable[[str, list[str]], Any],
    noun: str,
) -> dict[str, Any]:
    """The ``(key, text)`` pairs of a call to ``name`` as arguments, each text converted to its schema's types.

    ``convert(text, types)`` gets an empty type list for a key without a usable schema (or a tool
    missing from ``schemas``) and raises ValueError for a text that is none of ``types``.

    Raises:
        ValueError: Naming each failed ``noun`` (``parameter``, ``argument``) and why.

    """
    root = schemas.get(name)
    properties = root.get("properties") if root is not None else None
    if not isinstance(properties, Mapping):
        properties = {}
    arguments: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in pairs:
        types = schema_types(properties.get(key), root) if root is not None else []
        try:
            arguments[key] = convert(value, types)
        except ValueError as exc:
            errors.append(f'{noun} "{key}": {exc}')
    if errors:
        raise ValueError(f'invalid arguments for "{name}": ' + "; ".join(errors))
    return arguments

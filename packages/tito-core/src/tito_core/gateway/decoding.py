"""The checks every front makes on what it decoded, on neutral values and under the caller's own field names.

A front reads its wire format itself (:mod:`tito_core.gateway.fronts`); what it finds (a function tool, a tool
choice, tool-call arguments, sampling fields, a JSON schema for the answer) is checked here the same way for every
front, each 400 naming the field the caller wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..conversation import ToolSpec
from .errors import bad_request, bounded_depth, too_deep

__all__ = [
    "Sampling",
    "any_tool",
    "arguments_object",
    "check_parallel",
    "function_tool",
    "named_tool",
    "no_tool",
    "schema_answer",
    "stop_strings",
]


def function_tool(name: Any, description: Any, parameters: Any, *, name_field: str, parameters_field: str) -> ToolSpec:
    """A function tool offered to the model, checked: a name, and a JSON schema object for its arguments."""
    if not isinstance(name, str) or not name:
        raise bad_request(name_field, "every function tool needs a name")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise bad_request(parameters_field, "must be a JSON schema object")
    text = description if isinstance(description, str) else ""
    return {"name": name, "description": text, "inputSchema": {"json": dict(parameters)}}


def named_tool(name: Any, tools: Sequence[ToolSpec] | None, field: str) -> dict[str, Any]:
    """Tito's tool choice for one named tool, which must be offered."""
    if not isinstance(name, str) or not name:
        raise bad_request(field, "a named tool choice needs the tool's name")
    if not any(spec["name"] == name for spec in tools or ()):
        raise bad_request(field, f"{name!r} is not one of the offered tools")
    return {"tool": {"name": name}}


def any_tool(tools: Sequence[ToolSpec] | None, field: str) -> dict[str, Any]:
    """Tito's tool choice for "call some tool", which needs tools."""
    if not tools:
        raise bad_request(field, "calling a tool is required, but no tool is offered")
    return {"any": {}}


def no_tool(tools: Sequence[ToolSpec] | None, field: str) -> dict[str, Any]:
    """Tito's tool choice for "call no tool": only honoured without tools (they would stay in the prompt)."""
    if tools:
        raise bad_request(
            field,
            "'none' with tools offered is not supported: the tools stay in the prompt, so leave them out of the "
            "request instead",
        )
    return {"auto": {}}


def check_parallel(parallel: bool | None, choice: dict[str, Any] | None, tools: Any, field: str) -> None:
    """Refuse "no parallel calls" where tito cannot honour it: only a constrained output is one call."""
    if parallel is False and tools and (choice is None or "auto" in choice):
        raise bad_request(
            field,
            "false is only honoured when a tool call is required (the constraint allows one call); an "
            "unconstrained output is never cut or rewritten",
        )


def arguments_object(arguments: Any, field: str) -> dict[str, Any]:
    """A tool call's arguments as an object: JSON text parsed (empty text is ``{}``), nesting bounded."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except RecursionError:
            raise too_deep(field) from None
        except ValueError as exc:
            raise bad_request(field, f"is not JSON: {exc}") from None
        bounded_depth(arguments, field)
    if not isinstance(arguments, Mapping):
        raise bad_request(field, "must be a JSON object")
    return dict(arguments)


def schema_answer(schema: Any, field: str) -> dict[str, Any]:
    """The JSON schema a structured answer follows (None or absent: any JSON value)."""
    if schema is None:
        return {}
    if not isinstance(schema, Mapping):
        raise bad_request(field, "must be a JSON schema object")
    return dict(schema)


def stop_strings(value: Any, field: str) -> tuple[str, ...] | None:
    """Stop strings: a non-empty string or a list of them (None when absent)."""
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request(field, "must be a non-empty string or a list of them")
    return tuple(stops)


class Sampling:
    """The sampling fields a request sets, by tito's name, with the caller's name for each (errors name it)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.fields: dict[str, str] = {}

    def set(self, name: str, value: Any, field: str) -> None:
        """Set tito's sampling field ``name`` from the caller's ``field`` (nothing when ``value`` is None)."""
        if value is not None:
            self.values[name] = value
            self.fields[name] = field

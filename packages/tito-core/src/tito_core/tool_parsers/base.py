"""The tool-parser contract: model output text in, reasoning / content / tool calls out."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from tito_core.conversation import ToolSpec


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call found in a model output.

    Attributes:
        id: Unique id given to the call (Strands ``toolUseId``).
        name: Tool name as generated (``"unknown_tool"`` when it could not be read).
        input: Parsed arguments; empty when the call is malformed.
        raw: The exact text of the call as the model generated it, markup included.
        error: Why the call could not be parsed, or None. A call with an error is never executed:
            the model is shown ``raw`` and this message as the tool result.
    """

    id: str
    name: str
    input: dict[str, Any]
    raw: str
    error: str | None = None

    @property
    def is_error(self) -> bool:
        """True when the call is malformed and must not run."""
        return self.error is not None


class ParsedOutput(msgspec.Struct, frozen=True, kw_only=True):
    """A model output split into its parts.

    Attributes:
        content: Visible answer text: the output without reasoning and without tool-call markup,
            stripped of surrounding whitespace.
        reasoning: Reasoning text (inside ``<think>...</think>``, or before a lone ``</think>``), or
            None when the output has none.
        calls: Tool calls in the order generated. Calls inside reasoning are never included.
    """

    content: str
    reasoning: str | None = None
    calls: list[ToolCall] = msgspec.field(default_factory=list)


UNKNOWN_TOOL_NAME = "unknown_tool"


def new_call_id() -> str:
    """A fresh, unique tool-call id."""
    return f"call_{uuid.uuid4().hex[:16]}"


def malformed_call(raw: str, error: str, name: str | None = None) -> ToolCall:
    """Build a call that must not run: fresh id, empty input, ``name`` or ``unknown_tool``."""
    return ToolCall(id=new_call_id(), name=name or UNKNOWN_TOOL_NAME, input={}, raw=raw, error=error)


def json_type_name(value: object) -> str:
    """Name the JSON type of a decoded value: object, array, string, integer, number, boolean, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class _StrictJSONError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _StrictJSONError(f"duplicate key {json.dumps(key, ensure_ascii=False)}")
        obj[key] = value
    return obj


def _no_constants(name: str) -> Any:
    raise _StrictJSONError(f"{name} is not valid JSON")


_STRICT_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constants)


def loads_json_strict(text: str) -> Any:
    """Decode one JSON document, rejecting NaN / Infinity and duplicate object keys.

    Raises:
        ValueError: With a one-line message saying what is wrong and where.

    """
    try:
        return _STRICT_DECODER.decode(text)
    except _StrictJSONError:
        raise
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


@runtime_checkable
class ToolParser(Protocol):
    """Finds tool calls in model output text.

    Parsers are strict (a call that does not follow the format exactly is reported as malformed,
    never repaired) and think-aware (calls drafted inside reasoning are not returned).
    """

    name: str

    def parse(self, text: str, tools: Sequence[ToolSpec] | None = None) -> ParsedOutput:
        """Split ``text`` (the decoded output, stop token removed) into reasoning, content and calls.

        Args:
            text: The model output.
            tools: The tool specs offered on this call; parsers may use their JSON schemas to type
                arguments (``qwen_xml`` does).
        """
        ...

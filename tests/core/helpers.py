"""Small builders shared by the core tests."""

from __future__ import annotations

import json
from typing import Any

from strands import tool

SYSTEM = "You are a careful assistant."


def hermes_call(name: str, arguments: dict[str, Any], *, compact: bool = False) -> str:
    sep = (",", ":") if compact else (", ", ": ")
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, separators=sep)
    return f"<tool_call>\n{body}\n</tool_call>"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text

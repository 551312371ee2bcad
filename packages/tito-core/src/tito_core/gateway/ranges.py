"""The ranges of the sampling fields the fronts take, checked under the caller's own field names.

Each front checks its fields before mapping them onto the chat-completions request it stands for (whose checks
would name the chat field): OpenAI's documented ranges on chat completions and Responses (``temperature`` in
[0, 2]), Anthropic's on Messages (``temperature`` in [0, 1]). A value out of range, of the wrong type, or not
finite is a 400 naming the field; before, ``temperature: 1e308`` and ``max_tokens: 10**26`` were answered 200.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import bad_request

__all__ = ["MAX_TOKENS", "integer", "number", "token_limit"]

MAX_TOKENS = 2**31 - 1
"""The largest token limit taken (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``): what engines
take (int32). A limit past the room left in the model's context window is cut to that room by the core, so a
client's generous default (Claude Code's 32,000) still works on a small model."""


def token_limit(body: Mapping[str, Any], field: str) -> int | None:
    """``body[field]``, a token limit: an integer from 1 to :data:`MAX_TOKENS`, or None when absent."""
    value = body.get(field)
    if value is not None and (type(value) is not int or not 1 <= value <= MAX_TOKENS):
        raise bad_request(field, f"must be an integer from 1 to {MAX_TOKENS}, got {value!r}")
    return value


def number(body: Mapping[str, Any], field: str, low: float, high: float, *, above_low: bool = False) -> Any:
    """``body[field]``: a number in [low, high] (``(low, high]`` with ``above_low``), or None when absent."""
    value = body.get(field)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (low < value if above_low else low <= value) or not value <= high:  # NaN fails both
        interval = f"{'(' if above_low else '['}{low:g}, {high:g}]"
        raise bad_request(field, f"must be a number in {interval}, got {value!r}")
    return value


def integer(body: Mapping[str, Any], field: str, low: int, high: int, *, also: int | None = None) -> int | None:
    """``body[field]``: an integer in [low, high] (or ``also``), or None when absent."""
    value = body.get(field)
    if value is not None and (type(value) is not int or not (low <= value <= high or value == also)):
        extra = f" (or {also})" if also is not None else ""
        raise bad_request(field, f"must be an integer from {low} to {high}{extra}, got {value!r}")
    return value

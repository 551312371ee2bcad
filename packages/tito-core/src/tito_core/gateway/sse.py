"""The one server-sent-events writer of the gateway's fronts: ``event: NAME`` (when named) and ``data: JSON``.

Every front streams a recorded answer as a list of :class:`Event` (its own wire types, msgspec structs or plain
objects); :func:`encode` writes them with msgspec, as the JSON answers are written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = ["DONE", "Event", "encode"]

_ENCODER = msgspec.json.Encoder()


class Event(msgspec.Struct, frozen=True):
    """One event: its data (JSON-encodable), and its ``event:`` name (None: a bare ``data:`` line)."""

    data: Any
    name: str | None = None


DONE = Event(msgspec.Raw(b"[DONE]"))
"""OpenAI's end of a chat-completions stream: ``data: [DONE]``."""


def encode(events: Iterable[Event]) -> list[bytes]:
    """The events as the bytes of a ``text/event-stream`` body, one item each."""
    out = []
    for event in events:
        data = b"data: " + _ENCODER.encode(event.data) + b"\n\n"
        out.append(data if event.name is None else b"event: " + event.name.encode() + b"\n" + data)
    return out

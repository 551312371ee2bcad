"""Matching a replayed assistant message with what the gateway returned, so the core sees the exact reply.

The gateway answers with a ChatCompletion message; the client sends it back in its next request's history,
re-serialised by its own library. The core's sync compares messages exactly (:func:`~tito_core.conversation.
canonical`), so before the core sees them, every assistant message that matches one the gateway returned is
replaced by the rollout's own :meth:`~tito_core.rollout_core.output.CallResult.reply` of that output. Two messages
match when they agree after this normalisation (docs/gateway.md, "Matching rules"):

- content: ``None``, a string or a list of text parts, joined, with surrounding whitespace stripped;
- tool calls: the same names in the same order, arguments compared as parsed JSON (key order and spacing do not
  matter); tool-call ids do not matter (the gateway's own are put back, and the tool messages answering the
  client's ids are renamed to match);
- ``reasoning_content``: the same text (stripped), or absent (clients that drop the field keep matching).

Anything else (another text, other arguments, a call added or removed) does not match: the message goes to the
core as the client wrote it, and the rollout forks there. Nothing is realigned or masked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..conversation import ChatMessage

__all__ = ["ReplyBook", "arguments_key", "reply_key"]

_Key = tuple[str, str | None, tuple[tuple[str, str], ...]]


def arguments_key(arguments: Any) -> str:
    """Tool-call arguments (a JSON string or a mapping) as canonical JSON; unparsable text stays as it is."""
    value = arguments
    try:
        if isinstance(arguments, str):
            value = json.loads(arguments) if arguments.strip() else {}
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):  # not JSON, or nested too deep (the request's check answers it: a 400)
        return "\0" + str(arguments)  # never equal to the canonical JSON of a parsed value


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, Sequence):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping)).strip()
    return str(content)


def reply_key(message: Mapping[str, Any], *, reasoning: bool = True) -> _Key:
    """What a message is compared by (``reasoning=False`` leaves ``reasoning_content`` out)."""
    calls = tuple(
        (str(call.get("function", {}).get("name", "")), arguments_key(call.get("function", {}).get("arguments")))
        for call in message.get("tool_calls") or ()
        if isinstance(call, Mapping)
    )
    thought = message.get("reasoning_content") if reasoning else None
    return (_text(message.get("content")), _text(thought) or None, calls)


class ReplyBook:
    """The assistant messages one rollout returned, in order, each with the core's exact reply for it.

    A replayed message is matched by its position first: the n-th assistant message of a request is the n-th reply
    returned, when it agrees with it. A screenshot agent that calls the same tool with the same arguments twice gets
    two equal messages back; by content alone the second would stand for both, and the first's tool-call ids would
    be wrong (a fork). A message that does not agree with the reply at its position (a client that dropped
    messages from its history) is looked up by content among all the replies, the latest first.
    """

    def __init__(self) -> None:
        self._order: list[tuple[frozenset[_Key], ChatMessage]] = []
        self._replies: dict[_Key, ChatMessage] = {}

    def remember(self, returned: Mapping[str, Any], reply: ChatMessage) -> None:
        """``returned`` (the ChatCompletion message) was answered for the output whose reply is ``reply``."""
        keys = {reply_key(returned)}
        if returned.get("reasoning_content"):
            keys.add(reply_key(returned, reasoning=False))
        self._order.append((frozenset(keys), reply))
        for key in keys:
            self._replies[key] = reply

    def resolve(self, message: Mapping[str, Any], position: int | None = None) -> ChatMessage | None:
        """The core's reply for a replayed assistant ``message``, or None when it matches none returned.

        ``position``: the message is its request's ``position``-th assistant message, counted from 0.
        """
        key = reply_key(message)
        if position is not None and position < len(self._order):
            keys, reply = self._order[position]
            if key in keys:
                return reply
        return self._replies.get(key)

    def __len__(self) -> int:
        return len(self._order)

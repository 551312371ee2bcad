"""A request's history as tito's conversation: what every front does with its messages once decoded.

A front decodes each message of its wire format into tito's chat form and hands it here, with where the caller
wrote it (``input[3]``, ``messages[1].content[0]``): :class:`History` joins the leading system messages into the
system prompt, replaces each replayed assistant message by the rollout's exact reply (:class:`~tito_core.gateway.
matching.ReplyBook`, renaming the tool results that answer the client's call ids), and checks tool results as
OpenAI checks them: each answers one call of the assistant message before it, once, and every call is answered
before the next message that is not a tool result. Tool results reach the core in the order of the calls they
answer. Every 400 names the caller's own field.
"""

from __future__ import annotations

from typing import Any

from ..conversation import ChatMessage, Conversation, ToolSpec
from .errors import bad_request
from .matching import ReplyBook

__all__ = ["History"]


class History:
    """The messages of one request, in order, checked as they come.

    Args:
        book: The rollout's returned replies (replayed assistant messages are matched against them).
        field: The caller's field that holds the history (``messages``, ``input``, ``contents``): a call left
            unanswered is a 400 naming it.
    """

    def __init__(self, book: ReplyBook, field: str = "messages") -> None:
        self._book = book
        self._field = field
        self._systems: list[str] = []
        self._out: list[ChatMessage] = []
        self._assistants = 0  # assistant messages so far: a replayed one is matched by its position first
        self._renamed: dict[str, str] = {}  # the client's call ids of the last assistant message -> the reply's
        self._order: list[str] = []  # the reply's call ids, in order
        self._open: list[str] = []  # the client's call ids not yet answered
        self._answered: set[str] = set()
        self._results: list[ChatMessage] = []

    def system(self, text: str, where: str) -> None:
        """A system (or developer) message written at ``where``.

        Before any other message it is part of the system prompt; later, a system message where it stands.
        """
        self._close_turn(where)
        if self._out:
            self._out.append({"role": "system", "content": text})
        else:
            self._systems.append(text)

    def user(self, content: str | list[Any], where: str) -> None:
        """A user message (text, or parts with images) written at ``where``."""
        self._close_turn(where)
        self._out.append({"role": "user", "content": content})

    def assistant(self, message: ChatMessage, where: str) -> None:
        """An assistant message in tito's form (tool-call arguments as objects) written at ``where``.

        A replayed reply becomes the rollout's exact one; the client's tool-call ids are remembered for the tool
        results that follow.
        """
        self._close_turn(where)
        theirs = [c["id"] for c in message.get("tool_calls") or ()]
        reply = self._book.resolve(message, self._assistants)
        self._assistants += 1
        if reply is not None:
            ours = [c["id"] for c in reply.get("tool_calls", ())]
            self._renamed = dict(zip(theirs, ours, strict=False))
            message = reply
        else:
            self._renamed = {}
        self._order = [c["id"] for c in message.get("tool_calls", ())]
        self._open, self._answered = theirs, set()
        self._out.append(message)

    def tool(self, call_id: str, content: str | list[Any], *, id_field: str, kind_field: str) -> None:
        """A tool result answering the client's call ``call_id``.

        ``id_field`` is where the caller wrote the call id, ``kind_field`` the field that makes it a tool result (a
        chat message's ``role``, an item's ``type``): the 400s name them.

        Raises:
            GatewayError: 400 for a result that answers no call of the assistant message before it, or one twice.
        """
        if not self._open:
            raise bad_request(kind_field, "a tool result must answer a tool call of the assistant message before it")
        if call_id not in self._open:
            known = ", ".join(map(repr, self._open))
            raise bad_request(id_field, f"{call_id!r} is not a tool call of the assistant message before it ({known})")
        if call_id in self._answered:
            raise bad_request(id_field, f"tool call {call_id!r} is answered twice")
        self._answered.add(call_id)
        tool_call_id = self._renamed.get(call_id, call_id)
        self._results.append({"role": "tool", "tool_call_id": tool_call_id, "content": content})

    def conversation(self, tools: list[ToolSpec] | None) -> Conversation:
        """The whole history as the core's conversation, offering ``tools``.

        Raises:
            GatewayError: 400 when a tool call of the last assistant message is not answered.
        """
        self._close_turn(f"the end of {self._field}")
        system = "\n\n".join(self._systems) if self._systems else None
        return Conversation(messages=self._out, system=system, tool_specs=tools)

    def _close_turn(self, before: str) -> None:
        """Before a message that is no tool result: every call answered, the results in the calls' order."""
        missing = [c for c in self._open if c not in self._answered]
        if missing:
            raise bad_request(
                self._field,
                f"tool call {missing[0]!r} of the assistant message is not answered before {before}: each tool call "
                "needs a tool result with its id",
            )
        rank = {call_id: i for i, call_id in enumerate(self._order)}
        self._out.extend(sorted(self._results, key=lambda m: rank.get(m["tool_call_id"], len(rank))))
        self._results.clear()
        self._open, self._answered = [], set()

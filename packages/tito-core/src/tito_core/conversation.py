"""tito's own conversation form: what the rollout core takes from any front.

A front (:class:`~tito_core.strands_front.model.TitoModel` for Strands, the OpenAI-compatible gateway) turns its
framework's messages into a :class:`Conversation`: chat-template messages (``role``, ``content``, ``tool_calls``,
``tool_call_id``, ``reasoning_content``) in the order the model sees them, tool results already in the order of
the calls they answer, the system prompt, and the offered tools. The core renders, syncs and records this form
and nothing else; it never sees a framework's types.

A user or tool message may hold images: its ``content`` is then a list of parts, ``{"type": "text", "text": ...}``
and ``{"type": "image", "image": Image}`` (:func:`~tito_core.media.image_part`), the form Hugging Face chat
templates take. Text-only messages keep a string ``content``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import msgspec

from .media import Image, image_part

__all__ = [
    "ChatCache",
    "ChatMessage",
    "Conversation",
    "ToolSpec",
    "canonical",
    "message_content",
    "reply_message",
    "tool_specs_to_chat",
]

ChatMessage = dict[str, Any]
"""One chat-template message, as the model family's chat template takes it."""


class ToolSpec(TypedDict):
    """A tool offered to the model, as tool parsers and grammars read it (Strands' tool specs have this shape)."""

    name: str
    description: str
    inputSchema: dict[str, Any]


class Conversation(msgspec.Struct, frozen=True, kw_only=True):
    """One model call's input, in tito's own form.

    Attributes:
        messages: The chat messages after the system prompt (user, assistant, tool, and system messages that
            came later in the conversation), oldest first.
        system: The system prompt, or None.
        tool_specs: The tools offered on this call: ``{"name", "description", "inputSchema": {"json": schema}}``
            (what tool parsers and grammars read); the chat template gets them as OpenAI function tools.
    """

    messages: Sequence[ChatMessage]
    system: str | None = None
    tool_specs: Sequence[ToolSpec] | None = None

    def chat(self) -> list[ChatMessage]:
        """The whole conversation as the chat template renders it: the system message first, when there is one."""
        if self.system is None:
            return list(self.messages)
        return [{"role": "system", "content": self.system}, *self.messages]

    def late_system_joined(self) -> Conversation:
        """This conversation with its system messages after the first one joined into the system prompt.

        For a chat template that cannot render a system message where it stands (it raises, drops or moves it):
        each one's text is added to the system prompt, in order, after a blank line.
        """
        late = [m for m in self.messages if m.get("role") == "system"]
        if not late:
            return self
        texts = [self.system] if self.system is not None else []
        texts += [str(m.get("content") or "") for m in late]
        rest = [m for m in self.messages if m.get("role") != "system"]
        return msgspec.structs.replace(self, messages=rest, system="\n\n".join(texts))


def tool_specs_to_chat(tool_specs: Sequence[ToolSpec] | None) -> list[dict[str, Any]] | None:
    """Tool specs to the OpenAI ``{"type": "function", "function": ...}`` form chat templates expect."""
    if not tool_specs:
        return None
    tools = []
    for spec in tool_specs:
        schema: Any = spec.get("inputSchema", {})
        parameters = schema.get("json", schema) if isinstance(schema, Mapping) else {}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec["name"],
                    "description": spec.get("description", ""),
                    "parameters": parameters,
                },
            }
        )
    return tools


def reply_message(content: str, reasoning: str | None, calls: Sequence[tuple[str, str, Any]]) -> ChatMessage:
    """The assistant message a front hands back for an output of ``content``, ``reasoning`` and ``calls``.

    ``calls`` are ``(id, name, arguments)``. The rollout expects exactly this message (compared with
    :func:`canonical`) after its output; anything else is a rewritten history and forks.
    """
    message: ChatMessage = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments or {}}}
            for call_id, name, arguments in calls
        ]
    return message


def _encode_image(obj: Any) -> Any:
    if isinstance(obj, Image):
        return {"image_sha256": obj.sha256}
    raise TypeError(f"cannot encode {type(obj).__name__}")


_CANONICAL = msgspec.json.Encoder(order="sorted", enc_hook=_encode_image)


def canonical(message: Mapping[str, Any]) -> bytes | Mapping[str, Any]:
    """What determines a message's tokens, kept to tell later whether it was rewritten.

    Canonical JSON (sorted keys) where msgspec can encode the message: bytes are never walked by the garbage
    collector, which matters with hundreds of rollouts in one process. An :class:`~tito_core.media.Image` is
    encoded as its content hash, never its bytes (a changed or dropped image is a rewritten message). A message
    it cannot encode is kept as itself (compared by equality).
    """
    try:
        return _CANONICAL.encode(message)
    except (TypeError, ValueError, OverflowError):
        return message


def message_content(parts: Sequence[str | Image], joiner: str = "\n") -> str | list[dict[str, Any]]:
    """Text pieces and images as a message's ``content``, the form every front builds.

    A string when there is no image (text-only messages are unchanged); else a list of parts in order, adjacent text
    pieces joined with ``joiner`` (as they are in a text-only message).
    """
    if not any(isinstance(p, Image) for p in parts):
        return joiner.join(p for p in parts if isinstance(p, str))
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
            continue
        if texts:
            out.append({"type": "text", "text": joiner.join(texts)})
            texts = []
        out.append(image_part(part))
    if texts:
        out.append({"type": "text", "text": joiner.join(texts)})
    return out


class ChatCache:
    """The chat messages of a front's recent conversations, so that a call's unchanged messages are last call's objects.

    A front converts the whole conversation on every call (Strands sends all of it). :meth:`reuse` replaces each
    leading message that is the same as the one at its place in the previous call of that conversation by that one, so
    the fresh copies are freed at once and only the new messages' objects stay alive while the engine generates: with
    hundreds of rollouts in one process, objects that live across that wait are what the garbage collector's
    generation-0 collections follow. "The same" is what the rollout's sync compares (:func:`canonical`: ``1``,
    ``1.0`` and ``True`` differ), so a message that changed in any way that can change its tokens is never replaced. A
    conversation is known by its first message; the ``size`` most recently used are kept (a parent agent and its
    sub-agents on one model).
    """

    def __init__(self, size: int = 4) -> None:
        self._size = max(1, size)
        self._chats: list[list[ChatMessage]] = []  # most recent first
        self._forms: list[list[bytes | Mapping[str, Any]]] = []  # their messages' canonical forms

    def clear(self) -> None:
        """Forget every conversation (a new rollout)."""
        self._chats.clear()
        self._forms.clear()

    def reuse(self, chat: list[ChatMessage]) -> list[ChatMessage]:
        """``chat``, its leading messages that did not change since the last call replaced by that call's objects."""
        if not chat:
            return chat
        chats, forms = self._chats, self._forms
        first = chat[0]
        known: list[ChatMessage] = []
        known_forms: list[bytes | Mapping[str, Any]] = []
        for i, candidate in enumerate(chats):
            if candidate[0] is first or _unchanged(candidate[0], forms[i][0], first):
                known, known_forms = chats.pop(i), forms.pop(i)
                break
        same, n = 0, min(len(known), len(chat))
        while same < n and (known[same] is chat[same] or _unchanged(known[same], known_forms[same], chat[same])):
            chat[same] = known[same]
            same += 1
        del known_forms[same:]
        known_forms.extend(canonical(message) for message in chat[same:])
        chats.insert(0, chat)
        forms.insert(0, known_forms)
        del chats[self._size :], forms[self._size :]
        return chat


def _unchanged(old: ChatMessage, old_form: bytes | Mapping[str, Any], new: ChatMessage) -> bool:
    """Whether ``new`` is ``old`` again: equal, and equal in canonical form (which tells ``1`` from ``1.0``)."""
    return old == new and canonical(new) == old_form

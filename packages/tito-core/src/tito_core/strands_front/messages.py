"""The Strands front's conversion: Strands messages, system prompt and tool specs to tito's :class:`Conversation`.

Only this module (and :mod:`tito_core.strands_front.model`) knows Strands' message types. A user message becomes
tool messages (in the order of the calls they answer) and/or user messages; an assistant message becomes one chat
message with its text, reasoning and tool calls. Image blocks (in user messages and in tool results, e.g. a screenshot
tool's ``{"image": ...}`` item) become image content parts (:func:`~tito_core.media.image_part`); a message's
``content`` becomes a list of parts only when it holds an image, so text-only conversions are unchanged. Content
tito cannot render (video, documents, redacted reasoning) is an :class:`UnsupportedContentError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from strands.types.content import ContentBlock, Message, Messages
from strands.types.tools import ToolResultContent, ToolSpec

from ..conversation import ChatCache, ChatMessage, Conversation, message_content
from ..errors import UnsupportedContentError
from ..media import Image, ImageError

__all__ = ["TEXT_JOINER", "strands_image", "system_text", "to_chat_messages", "to_conversation"]

TEXT_JOINER = "\n"
"""Several text blocks of one message (or items of one tool result) are joined with this."""

_IGNORED_BLOCKS = frozenset({"cachePoint"})


def system_text(system_prompt: str | None, system_prompt_content: Sequence[Mapping[str, Any]] | None) -> str | None:
    """The system prompt as one string (content blocks take priority; cache points are ignored)."""
    if system_prompt_content:
        parts = []
        for block in system_prompt_content:
            if "text" in block:
                parts.append(block["text"])
            elif not set(block) <= _IGNORED_BLOCKS:
                raise UnsupportedContentError(f"system prompt block {sorted(block)} is not supported (text only)")
        return TEXT_JOINER.join(parts)
    return system_prompt


def strands_image(block: Mapping[str, Any]) -> Image:
    """A Strands image block's value (``{"format": "png", "source": {"bytes": b"..."}}``) as an :class:`Image`.

    Raises:
        ImageError: the source is not inline bytes, the format is not supported, or the bytes do not decode.
    """
    source = block.get("source") if isinstance(block, Mapping) else None
    data = source.get("bytes") if isinstance(source, Mapping) else None
    if data is None:
        kinds = ", ".join(sorted(source)) if isinstance(source, Mapping) else type(source).__name__
        raise ImageError(f"an image block needs its bytes in source.bytes (got source {kinds})")
    fmt = block.get("format")
    return Image.of(data, fmt if isinstance(fmt, str) else None)  # the bytes of an earlier call: no new hash


def _content(parts: list[str | Image]) -> str | list[dict[str, Any]]:
    """Text pieces and images as a message's content, adjacent text joined with :data:`TEXT_JOINER`."""
    return message_content(parts, TEXT_JOINER)


def _tool_result_content(content: Sequence[ToolResultContent], tool_use_id: str) -> str | list[dict[str, Any]]:
    if len(content) == 1 and "text" in content[0]:
        return content[0]["text"]
    parts: list[str | Image] = []
    for item in content:
        if "text" in item:
            parts.append(item["text"])
        elif "json" in item:
            parts.append(json.dumps(item["json"], ensure_ascii=False))
        elif "image" in item:
            parts.append(strands_image(item["image"]))
        else:
            kinds = ", ".join(sorted(item))
            raise UnsupportedContentError(
                f"tool result {tool_use_id!r} holds a {kinds} item; only text, json and image tool results "
                "are supported"
            )
    return _content(parts)


def _unsupported(block: ContentBlock, role: str) -> UnsupportedContentError:
    kinds = ", ".join(sorted(block)) or "empty"
    if {"image", "video", "document"} & set(block):
        where = "user messages and tool results" if "image" in block else "no message"
        return UnsupportedContentError(
            f"{kinds} content in a {role} message is not supported: tito takes images in {where}"
        )
    return UnsupportedContentError(f"unsupported content block {kinds!r} in a {role} message")


def _assistant_to_chat(message: Message) -> tuple[ChatMessage, list[str]]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message["content"]:
        if "text" in block:
            texts.append(block["text"])
        elif "toolUse" in block:
            use = block["toolUse"]
            calls.append(
                {
                    "id": use["toolUseId"],
                    "type": "function",
                    "function": {"name": use["name"], "arguments": use.get("input") or {}},
                }
            )
        elif "reasoningContent" in block:
            text = block["reasoningContent"].get("reasoningText", {}).get("text")
            if text is None:
                raise UnsupportedContentError("redacted reasoning content cannot be rendered into tokens")
            reasoning.append(text)
        elif not set(block) <= _IGNORED_BLOCKS:
            raise _unsupported(block, "assistant")
    chat: ChatMessage = {"role": "assistant", "content": TEXT_JOINER.join(texts)}
    if reasoning:
        chat["reasoning_content"] = TEXT_JOINER.join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    return chat, [c["id"] for c in calls]


def _user_to_chat(message: Message, call_order: Sequence[str]) -> list[ChatMessage]:
    """A user message becomes tool messages (in call order) and/or user messages, in block order."""
    content = message["content"]
    if len(content) == 1:  # the common case (one text, one tool result), converted every call: no ordering needed
        block = content[0]
        if "text" in block:
            return [{"role": "user", "content": block["text"]}]
        if "toolResult" in block:
            result = block["toolResult"]
            call_id = result["toolUseId"]
            return [
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": _tool_result_content(result.get("content", []), call_id),
                }
            ]
    out: list[ChatMessage] = []
    texts: list[str | Image] = []
    results: list[tuple[str, ChatMessage]] = []

    def flush_text() -> None:
        if texts:
            out.append({"role": "user", "content": _content(texts)})
            texts.clear()

    def flush_results() -> None:
        if results:
            rank = {call_id: i for i, call_id in enumerate(call_order)}
            # Stable: results of unknown calls keep their order, after the known ones.
            ordered = sorted(results, key=lambda r: rank.get(r[0], len(rank)))
            out.extend(chat for _, chat in ordered)
            results.clear()

    for block in message["content"]:
        if "toolResult" in block:
            flush_text()
            result = block["toolResult"]
            call_id = result["toolUseId"]
            text = _tool_result_content(result.get("content", []), call_id)
            results.append((call_id, {"role": "tool", "tool_call_id": call_id, "content": text}))
        elif "text" in block:
            flush_results()
            texts.append(block["text"])
        elif "image" in block:
            flush_results()
            texts.append(strands_image(block["image"]))
        elif not set(block) <= _IGNORED_BLOCKS:
            raise _unsupported(block, "user")
    flush_results()
    flush_text()
    return out


def to_chat_messages(
    messages: Messages, *, system_prompt: str | None = None, call_order: Sequence[str] = ()
) -> list[ChatMessage]:
    """Convert Strands messages to chat-template messages.

    Args:
        messages: Strands messages.
        system_prompt: Prepended as a system message when given.
        call_order: Tool-call ids of the assistant turn just before ``messages`` (for ordering the
            results of parallel calls when that assistant message is not part of ``messages``).

    Raises:
        UnsupportedContentError: for content tito cannot render (video, documents, images outside user messages
            and tool results, redacted reasoning); an :class:`~tito_core.media.ImageError` for an image it
            cannot use.
    """
    chat: list[ChatMessage] = []
    if system_prompt is not None:
        chat.append({"role": "system", "content": system_prompt})
    order: Sequence[str] = call_order
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            converted, order = _assistant_to_chat(message)
            chat.append(converted)
        elif role == "user":
            chat.extend(_user_to_chat(message, order))
        else:
            raise UnsupportedContentError(f"unsupported message role {role!r}")
    return chat


def to_conversation(
    messages: Messages,
    tool_specs: Sequence[ToolSpec] | None = None,
    system_prompt: str | None = None,
    system_prompt_content: Sequence[Mapping[str, Any]] | None = None,
    *,
    cache: ChatCache | None = None,
) -> Conversation:
    """One Strands model call's input (what ``Model.stream`` receives) as tito's :class:`Conversation`.

    ``cache``: the model's :class:`~tito_core.conversation.ChatCache` (unchanged messages keep last call's objects).
    """
    chat = to_chat_messages(messages)
    return Conversation(
        messages=cache.reuse(chat) if cache is not None else chat,
        system=system_text(system_prompt, system_prompt_content),
        tool_specs=tool_specs or None,
    )

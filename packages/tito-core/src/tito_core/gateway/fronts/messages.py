"""The Anthropic Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``): the front's codec.

Decoding: ``system`` (a string or text blocks) is the system prompt; a user message's ``tool_result`` blocks are tool
results (text or image content) and its ``text`` and base64 ``image`` blocks a user message; an assistant message's
``thinking``, ``text`` and ``tool_use`` blocks are one assistant turn; a ``system`` message in ``messages`` (Claude
Code sends them) is a system message where it stands; ``tools`` (``input_schema``), ``tool_choice`` (``auto``,
``any``, ``tool``, ``none``), ``max_tokens`` (required), ``stop_sequences``, ``temperature`` (Anthropic's [0, 1]),
``top_p``, ``top_k`` and ``output_format`` / ``output_config.format`` map one to one. Every 400 names the Messages
field, in Anthropic's error shape.

The answer is a ``Message`` (``thinking`` blocks signed, ``text``, ``tool_use``; ``stop_reason`` ``end_turn``,
``tool_use``, ``max_tokens`` or ``stop_sequence``), streamed as the API's events (``message_start`` ...
``message_stop``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from ...conversation import ChatMessage, ToolSpec
from ...media import Image
from ..call import CallAnswer, CallRequest
from ..decoding import (
    Sampling,
    any_tool,
    check_parallel,
    function_tool,
    named_tool,
    no_tool,
    schema_answer,
    stop_strings,
)
from ..errors import GatewayError, bad_request, known_fields
from ..history import History
from ..images import ImageReader, message_content
from ..ranges import integer, number, token_limit
from ..sse import Event
from .base import Context, Decoded, Front, Route

__all__ = ["Messages", "signature"]

# Accepted and without effect on tokens: what the SDKs and Claude Code send.
_IGNORED = frozenset({"model", "metadata", "thinking", "service_tier", "context_management"})
_MAPPED = frozenset(
    {"messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences", "temperature", "top_p",
     "top_k", "stream", "output_format", "output_config"}
)  # fmt: skip
_KNOWN = _MAPPED | _IGNORED
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}
# Anthropic's error types by status (docs.claude.com/en/api/errors; the SDK's ErrorType, which adds 409's and
# 504's): another 4xx is an invalid_request_error (as Anthropic says it answers them), another 5xx an api_error.
# A 503 (the gateway shutting down, its engine unreachable) is overloaded_error, "temporarily unable to serve",
# not an unexpected fault.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


# ------------------------------------------------------------------------------------------------ wire types
class Thinking(msgspec.Struct, frozen=True, tag="thinking"):
    thinking: str
    signature: str


class Text(msgspec.Struct, frozen=True, tag="text"):
    text: str


class ToolUse(msgspec.Struct, frozen=True, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


Block = Thinking | Text | ToolUse


class Usage(msgspec.Struct, frozen=True):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(msgspec.Struct, frozen=True):
    id: str
    model: str
    content: list[Block]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
    tito: dict[str, Any]
    type: str = "message"
    role: str = "assistant"


class ErrorDetail(msgspec.Struct, frozen=True):
    type: str
    message: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct, frozen=True, tag="error", tag_field="type"):
    error: ErrorDetail


# ----------------------------------------------------------------------------------------------------- front
class Messages(Front):
    """The Anthropic Messages API."""

    name = "messages"
    routes = (Route("/v1/messages"), Route("/v1/messages/count_tokens", kind="count"))

    def decode(self, body: Any, context: Context) -> Decoded:
        """The neutral call of a Messages request (a ``count_tokens`` one has no ``max_tokens``)."""
        counting = context.route.kind == "count"
        body = known_fields(body, _KNOWN, "Messages API")
        tools = _tools(body.get("tools"))
        context.images.begin()
        history = context.history("messages")
        system = _system(body.get("system"), "system")
        if system is not None:
            history.system(system, "system")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad_request("messages", "must be a non-empty list of messages")
        for i, message in enumerate(raw):
            _message(message, f"messages[{i}]", history, context.images)
        sampling = Sampling()
        limit = token_limit(body, "max_tokens")
        if limit is None and not counting:
            raise bad_request("max_tokens", "is required")
        sampling.set("max_new_tokens", limit, "max_tokens")
        sampling.set("temperature", number(body, "temperature", 0, 1), "temperature")  # Anthropic's range
        sampling.set("top_p", number(body, "top_p", 0, 1, above_low=True), "top_p")
        sampling.set("top_k", integer(body, "top_k", 1, 2**31 - 1), "top_k")
        sampling.set("stop", stop_strings(body.get("stop_sequences"), "stop_sequences"), "stop_sequences")
        choice = _tool_choice(body.get("tool_choice"), tools)
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise bad_request("stream", f"must be true or false, got {stream!r}")
        model = body.get("model")
        request = CallRequest(
            conversation=history.conversation(tools),
            sampling=sampling.values,
            fields=sampling.fields,
            tool_choice=choice,
            answer_schema=_output_format(body),
            stream=bool(stream),
            model=model if isinstance(model, str) else "",
        )
        return Decoded(request)

    def encode(self, answer: CallAnswer, decoded: Decoded, context: Context) -> Message:
        """The ``Message`` of a recorded call; ``stop_sequence`` when it ended on one of the request's."""
        content: list[Block] = []
        if answer.reasoning:
            content.append(Thinking(answer.reasoning, signature(answer.reasoning)))
        if answer.content:
            content.append(Text(answer.content))
        content += [ToolUse(call.id, call.name, call.arguments) for call in answer.tool_calls]
        stop_reason = "stop_sequence" if answer.stop_sequence is not None else _STOP_REASONS[answer.finish]
        usage = Usage(answer.prompt_tokens, answer.completion_tokens)
        return Message(f"msg_{answer.id}", answer.model, content, stop_reason, answer.stop_sequence, usage, answer.tito)

    def events(self, answer: CallAnswer, decoded: Decoded, context: Context) -> list[Event]:
        """The ``Message`` replayed as the API's events."""
        message = self.encode(answer, decoded, context)
        events: list[Event] = []

        def send(kind: str, **data: Any) -> None:
            events.append(Event({"type": kind, **data}, kind))

        start = msgspec.structs.replace(
            message, content=[], stop_reason=None, usage=msgspec.structs.replace(message.usage, output_tokens=0)
        )
        send("message_start", message=start)
        for index, block in enumerate(message.content):
            if isinstance(block, Text):
                send("content_block_start", index=index, content_block=Text(""))
                send("content_block_delta", index=index, delta={"type": "text_delta", "text": block.text})
            elif isinstance(block, Thinking):
                send("content_block_start", index=index, content_block=Thinking("", ""))
                send("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": block.thinking})
                send(
                    "content_block_delta", index=index, delta={"type": "signature_delta", "signature": block.signature}
                )
            else:
                send("content_block_start", index=index, content_block=msgspec.structs.replace(block, input={}))
                partial = msgspec.json.encode(block.input).decode()
                send("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial})
            send("content_block_stop", index=index)
        delta = {"stop_reason": message.stop_reason, "stop_sequence": message.stop_sequence}
        send("message_delta", delta=delta, usage={"output_tokens": message.usage.output_tokens})
        send("message_stop")
        return events

    def error(self, error: GatewayError) -> ErrorBody:
        """Anthropic's error JSON: ``{"type": "error", "error": {"type", "message", "param", "code"}}``."""
        kind = _ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
        return ErrorBody(ErrorDetail(kind, error.message, error.param, error.code))

    def count(self, tokens: int) -> dict[str, int]:
        """``count_tokens``' answer."""
        return {"input_tokens": tokens}


def signature(thinking: str) -> str:
    """The ``signature`` of a thinking block tito answers: an opaque digest of its text.

    Anthropic's clients keep it and send the block back with it. tito checks nothing with it: a replayed block is
    matched by its text (docs/gateway.md, "Matching rules"), and one sent back with any signature, or none, is taken.
    """
    return "tito-sha256-" + hashlib.sha256(thinking.encode()).hexdigest()


# -------------------------------------------------------------------------------------------------- request
def _system(system: Any, where: str) -> str | None:
    """A system prompt: a string, or text blocks joined by blank lines (None when absent or empty)."""
    if system is None:
        return None
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise bad_request(where, "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad_request(f"{where}[{j}]", "must be a text block")
        texts.append(block["text"])
    return "\n\n".join(texts) if texts else None


def _message(message: Any, where: str, history: History, images: ImageReader) -> None:
    if not isinstance(message, Mapping):
        raise bad_request(where, "must be a message object")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise bad_request(f"{where}.role", f"must be 'user', 'assistant' or 'system', got {role!r}")
    if role == "system":  # Claude Code sends these in the history: a system message where it stands
        history.system(_system(content, f"{where}.content") or "", where)
    elif isinstance(content, str):
        if role == "user":
            history.user(content, where)
        else:
            history.assistant({"role": "assistant", "content": content}, where)
    elif not isinstance(content, list):
        raise bad_request(f"{where}.content", "must be a string or a list of content blocks")
    elif role == "assistant":
        history.assistant(_assistant(content, where), where)
    else:
        _user(content, where, history, images)


def _user(blocks: list[Any], where: str, history: History, images: ImageReader) -> None:
    """Tool results for the ``tool_result`` blocks, then a user message of the rest (when there is any)."""
    pieces: list[str | Image] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_result":
            if pieces:
                raise bad_request(at, "tool_result blocks must come before the message's other blocks")
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{at}.tool_use_id", "a tool_result needs the id of the tool_use it answers")
            result = block.get("content", "")
            content = result if isinstance(result, str) else _blocks(result, f"{at}.content", images)
            history.tool(call_id, content, id_field=f"{at}.tool_use_id", kind_field=f"{at}.type")
        else:
            pieces.append(_block(block, at, images))
    if pieces:
        history.user(message_content(pieces), where)


def _blocks(blocks: Any, where: str, images: ImageReader) -> str | list[Any]:
    """A tool result's content blocks (text and base64 images) as the core's content."""
    if not isinstance(blocks, list):
        raise bad_request(where, "must be a string or a list of text and image blocks")
    return message_content([_block(block, f"{where}[{j}]", images) for j, block in enumerate(blocks)])


def _block(block: Any, at: str, images: ImageReader) -> str | Image:
    kind = block.get("type") if isinstance(block, Mapping) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    if kind == "image":
        source = block.get("source")
        if not isinstance(source, Mapping) or source.get("type") != "base64":
            raise bad_request(f"{at}.source.type", "only base64 image sources are taken (the gateway fetches nothing)")
        data = source.get("data")
        if not isinstance(data, str):
            raise bad_request(f"{at}.source.data", "must be the image's base64 text")
        media = source.get("media_type")
        return images.read_base64(data, media if isinstance(media, str) else None, f"{at}.source.data", at)
    raise bad_request(f"{at}.type", f"content block {kind!r} is not supported here (text, image, tool_result)")


def _assistant(blocks: list[Any], where: str) -> ChatMessage:
    turn: ChatMessage = {"role": "assistant", "content": ""}
    texts: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            turn["reasoning_content"] = block["thinking"]
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, Mapping):
                raise bad_request(at, "a tool_use needs an id, a name and an input object")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": dict(arguments)}}
            turn.setdefault("tool_calls", []).append(call)
        else:
            raise bad_request(f"{at}.type", f"assistant block {kind!r} is not supported (text, thinking, tool_use)")
    turn["content"] = "".join(texts) if texts or "tool_calls" not in turn else None
    return turn


def _tools(tools: Any) -> list[ToolSpec] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", "must be a list of tools")
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise bad_request(f"tools[{i}].type", f"only custom tools with an input_schema are supported, got {kind!r}")
        specs.append(
            function_tool(
                tool.get("name"),
                tool.get("description"),
                tool["input_schema"],
                name_field=f"tools[{i}].name",
                parameters_field=f"tools[{i}].input_schema",
            )
        )
    return specs or None


def _tool_choice(choice: Any, tools: list[ToolSpec] | None) -> dict[str, Any] | None:
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    value: dict[str, Any]
    if kind == "auto":
        value = {"auto": {}}
    elif kind == "any":
        value = any_tool(tools, "tool_choice.type")
    elif kind == "none":
        value = no_tool(tools, "tool_choice.type")
    elif kind == "tool":
        value = named_tool(choice.get("name"), tools, "tool_choice.name")
    else:
        raise bad_request("tool_choice.type", f"must be 'auto', 'any', 'tool' or 'none', got {kind!r}")
    if choice.get("disable_parallel_tool_use"):
        check_parallel(False, value, tools, "tool_choice.disable_parallel_tool_use")
    return value


def _output_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer's schema of ``output_format`` or ``output_config.format`` (``output_config.effort``: no effect)."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, Mapping):
        raise bad_request("output_config", "must be an object")
    field = "output_format" if body.get("output_format") is not None else "output_config.format"
    fmt = body.get("output_format") or (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        raise bad_request(f"{field}.type", "must be 'json_schema'")
    return schema_answer(fmt.get("schema"), f"{field}.schema")

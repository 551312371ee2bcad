"""The Anthropic Messages API over the chat-completions front: the same conversation, the same rollout core.

:func:`chat_body` turns a Messages request into the chat-completions request it stands for, naming the Messages
field in its 400s: ``system`` (a string or text blocks) leads; a user message's ``tool_result`` blocks are tool
messages (text or image content) and its ``text`` and base64 ``image`` blocks a user message; an assistant
message's ``thinking``, ``text`` and ``tool_use`` blocks are one assistant turn; ``tools`` (``input_schema``),
``tool_choice`` (``auto``, ``any``, ``tool``, ``none``), ``max_tokens``, ``stop_sequences``, ``temperature``,
``top_p``, ``top_k`` and ``output_format`` / ``output_config.format`` (structured outputs) map one to one; a
``system`` message in ``messages`` (Claude Code sends them) is a system message where it stands.

:func:`message_of` writes the recorded call back as a ``Message`` (``thinking``, ``text``, ``tool_use`` blocks,
``stop_reason`` ``end_turn`` / ``tool_use`` / ``max_tokens`` / ``stop_sequence``), and :func:`sse_events` replays
it as the API's stream (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``,
``message_stop``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .errors import GatewayError, bad_request, known_fields
from .ranges import integer, number, token_limit

__all__ = ["chat_body", "error_body", "message_of", "signature", "sse_events"]

# Accepted and without effect on tokens: what the SDKs and Claude Code send.
_IGNORED = frozenset({"model", "metadata", "thinking", "service_tier", "context_management"})
_MAPPED = frozenset(
    {"messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences", "temperature", "top_p",
     "top_k", "stream", "output_format", "output_config"}
)  # fmt: skip
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}
_KNOWN = _MAPPED | _IGNORED
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


def chat_body(body: Any, *, counting: bool = False) -> dict[str, Any]:
    """The chat-completions body a Messages request stands for.

    ``counting``: a ``count_tokens`` body, which has no ``max_tokens``.

    Raises:
        GatewayError: 400 naming the Messages field tito cannot honour.
    """
    body = known_fields(body, _KNOWN, "Messages API")
    messages: list[dict[str, Any]] = [{"role": "system", "content": text} for text in _system(body.get("system"))]
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages", "must be a non-empty list of messages")
    for i, message in enumerate(raw):
        messages += _message(message, f"messages[{i}]")
    chat: dict[str, Any] = {"messages": messages}
    limit = token_limit(body, "max_tokens")
    number(body, "temperature", 0, 1)  # Anthropic's range
    number(body, "top_p", 0, 1, above_low=True)
    integer(body, "top_k", 1, 2**31 - 1)
    if limit is None and not counting:
        raise bad_request("max_tokens", "is required")
    if limit is not None:
        chat["max_completion_tokens"] = limit
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(body["tool_choice"]))
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    for key in ("temperature", "top_p", "top_k", "stream"):
        if body.get(key) is not None:
            chat[key] = body[key]
    config = body.get("output_config")
    if config is not None and not isinstance(config, Mapping):
        raise bad_request("output_config", "must be an object")
    fmt = body.get("output_format") or (config or {}).get("format")  # output_config.effort: without effect
    if fmt is not None:
        if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
            raise bad_request("output_format.type", "must be 'json_schema'")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}
    return chat


def _system(system: Any) -> list[str]:
    if system is None:
        return []
    if isinstance(system, str):
        return [system]
    if not isinstance(system, list):
        raise bad_request("system", "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad_request(f"system[{j}]", "must be a text block")
        texts.append(block["text"])
    return ["\n\n".join(texts)] if texts else []


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, Mapping):
        raise bad_request(where, "must be a message object")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise bad_request(f"{where}.role", f"must be 'user', 'assistant' or 'system', got {role!r}")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "system":  # Claude Code sends these in the history: a system message where it stands
        return [{"role": "system", "content": "\n\n".join(_system(content))}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", "must be a string or a list of content blocks")
    return _assistant(content, where) if role == "assistant" else _user(content, where)


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """Tool messages for the ``tool_result`` blocks, then a user message of the rest (when there is any)."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_result":
            if parts:
                raise bad_request(at, "tool_result blocks must come before the message's other blocks")
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{at}.tool_use_id", "a tool_result needs the id of the tool_use it answers")
            result = block.get("content", "")
            content = result if isinstance(result, str) else _parts(result, f"{at}.content")
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            parts += _parts([block], f"{where}.content", first=j)
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _parts(blocks: Any, where: str, *, first: int = 0) -> list[dict[str, Any]]:
    """Chat-completions parts of text and base64 image blocks."""
    if not isinstance(blocks, list):
        raise bad_request(where, "must be a string or a list of text and image blocks")
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks, start=first):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            source = block.get("source")
            if not isinstance(source, Mapping) or source.get("type") != "base64":
                raise bad_request(f"{where}[{j}].source.type", "only base64 image sources are taken (the gateway "
                                  "fetches nothing)")  # fmt: skip
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise bad_request(f"{where}[{j}].type", f"content block {kind!r} is not supported here (text, image, "
                              "tool_result)")  # fmt: skip
    return parts


def _assistant(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    turn: dict[str, Any] = {"role": "assistant", "content": ""}
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
    return [turn]


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("tools", "must be a list of tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise bad_request(f"tools[{i}].type", f"only custom tools with an input_schema are supported, got {kind!r}")
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    names = {"auto": "auto", "any": "required", "none": "none"}
    if kind in names:
        value: Any = names[kind]
    elif kind == "tool":
        value = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise bad_request("tool_choice.type", f"must be 'auto', 'any', 'tool' or 'none', got {kind!r}")
    out = {"tool_choice": value}
    if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


def error_body(error: GatewayError) -> dict[str, Any]:
    """Anthropic's error JSON for ``error``: ``{"type": "error", "error": {"type", "message", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    detail = {"type": kind, "message": error.message, "param": error.param, "code": error.code}
    return {"type": "error", "error": detail}


# ---------------------------------------------------------------------------------------------------- answer
def message_of(completion: Mapping[str, Any], stop_sequences: Any = None) -> dict[str, Any]:
    """The ``Message`` of a recorded call, from its ChatCompletion body and the request's ``stop_sequences``.

    ``stop_reason`` is ``stop_sequence`` when the engine says generation ended on one of them (``matched_stop``).
    """
    choice = completion["choices"][0]
    stop_reason, stop_sequence = _STOP_REASONS[choice["finish_reason"]], None
    matched = completion["tito"].get("matched_stop")
    if stop_reason == "end_turn" and isinstance(matched, str) and matched in (stop_sequences or ()):
        stop_reason, stop_sequence = "stop_sequence", matched
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        thinking = message["reasoning_content"]
        content.append({"type": "thinking", "thinking": thinking, "signature": signature(thinking)})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        arguments = json.loads(function["arguments"])
        content.append({"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments})
    usage = completion["usage"]
    return {
        "id": "msg_" + completion["id"].removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": completion["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
        "tito": completion["tito"],
    }


def signature(thinking: str) -> str:
    """The ``signature`` of a thinking block tito answers: an opaque digest of its text.

    Anthropic's clients keep it and send the block back with it. tito checks nothing with it: a replayed block is
    matched by its text (docs/gateway.md, "Matching rules"), and one sent back with any signature, or none, is taken.
    """
    return "tito-sha256-" + hashlib.sha256(thinking.encode()).hexdigest()


def sse_events(message: Mapping[str, Any]) -> list[bytes]:
    """``message`` replayed as the Messages API's server-sent events."""
    events: list[bytes] = []

    def send(kind: str, **data: Any) -> None:
        payload = {"type": kind, **data}
        events.append(f"event: {kind}\ndata: ".encode() + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n")

    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    send("message_start", message=start)
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            send("content_block_start", index=index, content_block={"type": "text", "text": ""})
            send("content_block_delta", index=index, delta={"type": "text_delta", "text": block["text"]})
        elif block["type"] == "thinking":
            send(
                "content_block_start", index=index, content_block={"type": "thinking", "thinking": "", "signature": ""}
            )
            send("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": block["thinking"]})
            send("content_block_delta", index=index, delta={"type": "signature_delta", "signature": block["signature"]})
        else:
            send("content_block_start", index=index, content_block={**block, "input": {}})
            partial = json.dumps(block["input"], ensure_ascii=False)
            send("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial})
        send("content_block_stop", index=index)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    send("message_delta", delta=delta, usage={"output_tokens": usage["output_tokens"]})
    send("message_stop")
    return events

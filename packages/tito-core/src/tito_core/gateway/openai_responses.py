"""The OpenAI Responses API over the chat-completions front: the same conversation, the same rollout core.

:func:`chat_body` turns a Responses request into the chat-completions request it stands for, checking the
Responses fields and naming them in its 400s: ``instructions`` and system / developer items are the leading
system messages, a string ``input`` or message items are user (``input_text``, ``input_image``) and assistant
(``output_text``) messages, ``reasoning`` + assistant ``message`` + ``function_call`` items in a row are one
assistant turn (as a response's ``output`` holds them), ``function_call_output`` items are tool messages; function
``tools``, ``tool_choice``, ``text.format`` (``response_format``), ``max_output_tokens`` and sampling map one to
one. ``previous_response_id`` puts the input and output of that response (kept per rollout by
:class:`ResponseChain`) before the new ``input``; ``store: false`` with the whole history in ``input`` works too.

:func:`response_of` writes the recorded call back as a ``Response`` (``reasoning``, ``message`` and
``function_call`` output items), and :func:`sse_events` replays it as the API's stream events (``response.created``
... ``response.completed``, or ``response.incomplete`` at the token limit).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from .errors import bad_request, known_fields
from .ranges import number, token_limit

__all__ = ["ResponseChain", "chat_body", "response_of", "sse_events"]

# Accepted and without effect on tokens: what the SDKs send by default.
_IGNORED = frozenset(
    {"model", "user", "metadata", "store", "include", "reasoning", "service_tier", "prompt_cache_key",
     "safety_identifier", "prompt_cache_retention", "stream_options", "client_metadata"}
)  # fmt: skip
_MAPPED = frozenset(
    {"input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature",
     "top_p", "text", "stream", "previous_response_id", "truncation", "top_logprobs", "background"}
)  # fmt: skip
_ASSISTANT_ORDER = {"reasoning": 0, "message": 1, "function_call": 2}
_KEEP_RESPONSES = 64  # per rollout: previous_response_id reaches this far back
_KNOWN = _MAPPED | _IGNORED


class ResponseChain:
    """The responses of one rollout: each one's whole input and output items, for ``previous_response_id``."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, list[Any]] = OrderedDict()

    def history(self, response_id: Any) -> list[Any]:
        """The items before a request's ``input`` that continues ``response_id``.

        Raises:
            GatewayError: 400 for an id this rollout did not answer (or answered more than 64 responses ago).
        """
        if not isinstance(response_id, str) or response_id not in self._items:
            raise bad_request("previous_response_id", f"{response_id!r} is not a response of this rollout")
        return list(self._items[response_id])

    def answer(self, completion: Mapping[str, Any], body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        """The ``Response`` of a recorded call (:func:`response_of`).

        Kept with its whole input ``items`` unless the request says ``store: false``.
        """
        response_id = "resp_" + str(completion["id"]).removeprefix("chatcmpl-")
        response = response_of(completion, body, response_id)
        if body.get("store") is not False:
            self._items[response_id] = [*items, *response["output"]]
            while len(self._items) > _KEEP_RESPONSES:
                self._items.popitem(last=False)
        return response


def chat_body(body: Any, chain: ResponseChain) -> tuple[dict[str, Any], list[Any]]:
    """The chat-completions body a Responses request stands for, and its whole input (the chain's, then its own).

    Raises:
        GatewayError: 400 naming the Responses field tito cannot honour.
    """
    body = known_fields(body, _KNOWN, "Responses API")
    if body.get("background"):
        raise bad_request("background", "background responses are not supported (a rollout's calls are awaited)")
    if body.get("truncation") not in (None, "disabled"):
        raise bad_request("truncation", "only 'disabled' is supported: tito never drops context silently")
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise bad_request("input", "must be a string or a list of input items")
    previous = body.get("previous_response_id")
    items = [*(chain.history(previous) if previous is not None else ()), *raw]
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions", "must be a string")
        messages.append({"role": "system", "content": instructions})
    messages += _messages(items, offset=len(items) - len(raw))
    chat: dict[str, Any] = {"messages": messages}
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    include = body.get("include") or ()
    if isinstance(include, list) and "message.output_text.logprobs" in include:
        chat["logprobs"] = True
    number(body, "temperature", 0, 2)  # OpenAI's ranges, checked here to name the Responses field
    number(body, "top_p", 0, 1, above_low=True)
    for key in ("parallel_tool_calls", "temperature", "top_p", "stream", "top_logprobs"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if token_limit(body, "max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    if text is not None:
        if not isinstance(text, Mapping):
            raise bad_request("text", "must be an object")
        if text.get("format") is not None:
            chat["response_format"] = text["format"]
    return chat, items


def _messages(items: list[Any], *, offset: int) -> list[dict[str, Any]]:
    """Chat messages of input items; ``offset``: the index in ``input`` of ``items[offset]`` (errors name it)."""
    messages: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant turn being gathered
    last = -1  # the kind of its last item (_ASSISTANT_ORDER)
    for i, item in enumerate(items):
        where = f"input[{i - offset}]" if i >= offset else f"previous_response_id (its item {i})"
        if not isinstance(item, Mapping):
            raise bad_request(where, "must be an input item object")
        kind = item.get("type", "message")
        role = item.get("role")
        if (kind == "message" and role == "assistant") or kind in ("reasoning", "function_call"):
            order = _ASSISTANT_ORDER[kind]
            if turn is None or order < last or (order == last and order < 2):
                turn = {"role": "assistant", "content": None}
                messages.append(turn)
            last = order
            _add_to_turn(turn, item, kind, where)
            continue
        turn, last = None, -1
        if kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.call_id", "a function_call_output needs the call_id it answers")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _content(item.get("output"), where)})
        elif kind == "message" and role in ("user", "system", "developer"):
            messages.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "message":
            raise bad_request(f"{where}.role", f"must be 'user', 'assistant', 'system' or 'developer', got {role!r}")
        else:
            raise bad_request(f"{where}.type", f"input item {kind!r} is not supported (message, function_call, "
                              "function_call_output, reasoning)")  # fmt: skip
    return messages


def _add_to_turn(turn: dict[str, Any], item: Mapping[str, Any], kind: str, where: str) -> None:
    if kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        if not isinstance(parts, list):
            raise bad_request(f"{where}.content", "must be a list of reasoning parts")
        turn["reasoning_content"] = "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping))
    elif kind == "message":
        content = item.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "output_text":
                    what = part.get("type") if isinstance(part, Mapping) else part
                    raise bad_request(f"{where}.content[{j}].type", f"assistant content {what!r} is not supported "
                                      "(output_text)")  # fmt: skip
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise bad_request(f"{where}.content", "must be a string or a list of output_text parts")
        turn["content"] = (turn["content"] or "") + content
    else:
        name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
        if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, str):
            raise bad_request(where, "a function_call needs call_id, name and arguments (a JSON string)")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        turn.setdefault("tool_calls", []).append(call)


def _content(content: Any, where: str) -> Any:
    """A user / system / tool content: text, or chat-completions parts for ``input_text`` and ``input_image``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", "must be a string or a list of content parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise bad_request(f"{where}.content[{j}].type", f"content part {kind!r} is not supported (input_text, "
                              "input_image with a data: URL)")  # fmt: skip
    return parts


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("tools", "must be a list of function tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise bad_request(f"tools[{i}].type", f"only function tools are supported, got {kind!r}")
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    raise bad_request("tool_choice", f"must be 'auto', 'none', 'required' or a function, got {value!r}")


# ---------------------------------------------------------------------------------------------------- answer
def response_of(completion: Mapping[str, Any], body: Mapping[str, Any], response_id: str) -> dict[str, Any]:
    """The ``Response`` of a recorded call, from its ChatCompletion body and the Responses request."""
    choice = completion["choices"][0]
    message = choice["message"]
    short = response_id.removeprefix("resp_")
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        text = message["reasoning_content"]
        output.append({"type": "reasoning", "id": f"rs_{short}", "summary": [],
                       "content": [{"type": "reasoning_text", "text": text}], "status": "completed"})  # fmt: skip
    if message.get("content"):
        part: dict[str, Any] = {"type": "output_text", "text": message["content"], "annotations": []}
        if choice.get("logprobs"):
            part["logprobs"] = [
                {"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"], "top_logprobs": []}
                for t in choice["logprobs"]["content"]
            ]
        output.append({"type": "message", "id": f"msg_{short}", "role": "assistant", "status": "completed",
                       "content": [part]})  # fmt: skip
    for n, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        item = {"type": "function_call", "id": f"fc_{short}_{n}", "call_id": call["id"], "name": function["name"]}
        output.append({**item, "arguments": function["arguments"], "status": "completed"})
    usage = completion["usage"]
    incomplete = choice["finish_reason"] == "length"
    text = body.get("text") if isinstance(body.get("text"), Mapping) else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": completion["created"],
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": completion["model"],
        "output": output,
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "text": {"format": (text or {}).get("format") or {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "tito": completion["tito"],
    }


def sse_events(response: Mapping[str, Any]) -> list[bytes]:
    """``response`` replayed as the Responses API's server-sent events."""
    events: list[bytes] = []

    def send(kind: str, **data: Any) -> None:
        payload = {"type": kind, "sequence_number": len(events), **data}
        events.append(f"event: {kind}\ndata: ".encode() + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n")

    started = {**response, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
    send("response.created", response=started)
    send("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            send(
                "response.output_item.added", output_index=index, item={**item, "content": [], "status": "in_progress"}
            )
            part = item["content"][0]
            send("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            logprobs = part.get("logprobs", [])
            send("response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=logprobs)
            send("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=logprobs)
            send("response.content_part.done", **at, content_index=0, part=part)
        elif item["type"] == "function_call":
            send(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            send("response.function_call_arguments.delta", **at, delta=item["arguments"])
            send("response.function_call_arguments.done", **at, arguments=item["arguments"], name=item["name"])
        else:
            send("response.output_item.added", output_index=index, item=item)
        send("response.output_item.done", output_index=index, item=item)
    send("response.incomplete" if response["status"] == "incomplete" else "response.completed", response=response)
    return events

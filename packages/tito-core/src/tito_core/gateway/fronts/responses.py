"""The OpenAI Responses API (``POST /v1/responses``): the front's codec.

Decoding: ``instructions`` and system / developer items are the leading system messages, a string ``input`` or
message items are user (``input_text``, ``input_image``) and assistant (``output_text``) messages, ``reasoning`` +
assistant ``message`` + ``function_call`` items in a row are one assistant turn (as a response's ``output`` holds
them), ``function_call_output`` items are tool results; function ``tools``, ``tool_choice``, ``text.format``,
``max_output_tokens`` and the sampling fields map one to one. ``previous_response_id`` puts the input and output of
that response (kept per rollout by :class:`ResponseChain`) before the new ``input``; ``store: false`` with the whole
history in ``input`` works too. Every 400 names the Responses field.

The answer is a ``Response`` (``reasoning``, ``message`` and ``function_call`` output items; ``incomplete`` at the
token limit), streamed as the API's events (``response.created`` ... ``response.completed``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from ...conversation import ChatMessage, ToolSpec
from ...media import Image
from ..call import CallAnswer, CallRequest
from ..decoding import (
    Sampling,
    any_tool,
    arguments_object,
    check_parallel,
    function_tool,
    named_tool,
    no_tool,
    schema_answer,
)
from ..errors import GatewayError, bad_request, error_body, known_fields
from ..history import History
from ..images import ImageReader, message_content
from ..ranges import number, token_limit
from ..sse import Event
from .base import Context, Decoded, Front, Route

__all__ = ["ResponseChain", "Responses"]

# Accepted and without effect on tokens: what the SDKs send by default.
_IGNORED = frozenset(
    {"model", "user", "metadata", "store", "include", "reasoning", "service_tier", "prompt_cache_key",
     "safety_identifier", "prompt_cache_retention", "stream_options", "client_metadata"}
)  # fmt: skip
_MAPPED = frozenset(
    {"input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature",
     "top_p", "text", "stream", "previous_response_id", "truncation", "top_logprobs", "background"}
)  # fmt: skip
_KNOWN = _MAPPED | _IGNORED
_ASSISTANT_ORDER = {"reasoning": 0, "message": 1, "function_call": 2}
_KEEP_RESPONSES = 64  # per rollout: previous_response_id reaches this far back


# ------------------------------------------------------------------------------------------------ wire types
class OutputText(msgspec.Struct, frozen=True, tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[dict[str, Any]] | UnsetType = UNSET


class ReasoningText(msgspec.Struct, frozen=True, tag="reasoning_text"):
    text: str


class MessageItem(msgspec.Struct, frozen=True, tag="message"):
    id: str
    content: list[OutputText]
    role: str = "assistant"
    status: str = "completed"


class ReasoningItem(msgspec.Struct, frozen=True, tag="reasoning"):
    id: str
    content: list[ReasoningText]
    summary: list[Any] = msgspec.field(default_factory=list)
    status: str = "completed"


class FunctionCallItem(msgspec.Struct, frozen=True, tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


class Response(msgspec.Struct, frozen=True):
    id: str
    created_at: int
    status: str
    incomplete_details: dict[str, str] | None
    model: str
    output: list[OutputItem]
    instructions: Any
    tools: Any
    tool_choice: Any
    parallel_tool_calls: Any
    temperature: Any
    top_p: Any
    max_output_tokens: Any
    previous_response_id: Any
    store: Any
    text: dict[str, Any]
    metadata: Any
    usage: dict[str, Any] | None
    tito: dict[str, Any]
    truncation: str = "disabled"
    error: None = None
    object: str = "response"


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

    def keep(self, response_id: str, items: list[Any]) -> None:
        """Keep a response's whole input and output ``items``."""
        self._items[response_id] = items
        while len(self._items) > _KEEP_RESPONSES:
            self._items.popitem(last=False)


class _Echo(msgspec.Struct, frozen=True):
    body: Mapping[str, Any]
    items: list[Any]  # the whole input: the chain's, then the request's


# ----------------------------------------------------------------------------------------------------- front
class Responses(Front):
    """The OpenAI Responses API."""

    name = "responses"
    routes = (Route("/v1/responses"),)

    def new_state(self) -> ResponseChain:
        """The rollout's past responses."""
        return ResponseChain()

    def decode(self, body: Any, context: Context) -> Decoded:
        """The neutral call of a Responses request; its echo is the body and its whole input."""
        body = known_fields(body, _KNOWN, "Responses API")
        if body.get("background"):
            raise bad_request("background", "background responses are not supported (a rollout's calls are awaited)")
        if body.get("truncation") not in (None, "disabled"):
            raise bad_request("truncation", "only 'disabled' is supported: tito never drops context silently")
        if body.get("top_logprobs") not in (None, 0):
            raise bad_request("top_logprobs", "alternatives are not recorded; only the sampled tokens' logprobs are")
        raw = body.get("input")
        if isinstance(raw, str):
            raw = [{"role": "user", "content": raw}]
        if not isinstance(raw, list):
            raise bad_request("input", "must be a string or a list of input items")
        previous = body.get("previous_response_id")
        chain: ResponseChain = context.state
        items = [*(chain.history(previous) if previous is not None else ()), *raw]
        tools = _tools(body.get("tools"))
        context.images.begin()
        history = context.history("input")
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise bad_request("instructions", "must be a string")
            history.system(instructions, "instructions")
        _items(items, len(items) - len(raw), history, context.images)
        choice = _tool_choice(body.get("tool_choice"), tools)
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise bad_request("parallel_tool_calls", f"must be true or false, got {parallel!r}")
        check_parallel(parallel, choice, tools, "parallel_tool_calls")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise bad_request("stream", f"must be true or false, got {stream!r}")
        include = body.get("include") or ()
        sampling = Sampling()
        sampling.set("max_new_tokens", token_limit(body, "max_output_tokens"), "max_output_tokens")
        sampling.set("temperature", number(body, "temperature", 0, 2), "temperature")  # OpenAI's ranges
        sampling.set("top_p", number(body, "top_p", 0, 1, above_low=True), "top_p")
        model = body.get("model")
        request = CallRequest(
            conversation=history.conversation(tools),
            sampling=sampling.values,
            fields=sampling.fields,
            tool_choice=choice,
            answer_schema=_text_format(body.get("text")),
            logprobs=isinstance(include, list) and "message.output_text.logprobs" in include,
            stream=bool(stream),
            model=model if isinstance(model, str) else "",
        )
        return Decoded(request, _Echo(body, items))

    def encode(self, answer: CallAnswer, decoded: Decoded, context: Context) -> Response:
        """The ``Response`` of a recorded call, kept for ``previous_response_id`` unless ``store`` is false."""
        echo: _Echo = decoded.echo
        body = echo.body
        response_id = f"resp_{answer.id}"
        output = _output(answer)
        if body.get("store") is not False:
            chain: ResponseChain = context.state
            chain.keep(response_id, [*echo.items, *msgspec.to_builtins(output)])
        incomplete = answer.finish == "length"
        text = body.get("text") if isinstance(body.get("text"), Mapping) else None
        return Response(
            id=response_id,
            created_at=answer.created,
            status="incomplete" if incomplete else "completed",
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            model=answer.model,
            output=output,
            instructions=body.get("instructions"),
            tools=body.get("tools") or [],
            tool_choice=body.get("tool_choice") or "auto",
            parallel_tool_calls=body.get("parallel_tool_calls", True),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            max_output_tokens=body.get("max_output_tokens"),
            previous_response_id=body.get("previous_response_id"),
            store=body.get("store", True),
            text={"format": (text or {}).get("format") or {"type": "text"}},
            metadata=body.get("metadata") or {},
            usage={
                "input_tokens": answer.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": answer.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": answer.prompt_tokens + answer.completion_tokens,
            },
            tito=answer.tito,
        )

    def events(self, answer: CallAnswer, decoded: Decoded, context: Context) -> list[Event]:
        """The ``Response`` replayed as the API's events, each with its ``sequence_number``."""
        response = self.encode(answer, decoded, context)
        events: list[Event] = []

        def send(kind: str, **data: Any) -> None:
            events.append(Event({"type": kind, "sequence_number": len(events), **data}, kind))

        started = msgspec.structs.replace(
            response, status="in_progress", output=[], incomplete_details=None, usage=None
        )
        send("response.created", response=started)
        send("response.in_progress", response=started)
        for index, item in enumerate(response.output):
            at = {"output_index": index, "item_id": item.id}
            if isinstance(item, MessageItem):
                send("response.output_item.added", output_index=index,
                     item=msgspec.structs.replace(item, content=[], status="in_progress"))  # fmt: skip
                part = item.content[0]
                logprobs = part.logprobs or []
                send("response.content_part.added", **at, content_index=0, part=OutputText(""))
                send("response.output_text.delta", **at, content_index=0, delta=part.text, logprobs=logprobs)
                send("response.output_text.done", **at, content_index=0, text=part.text, logprobs=logprobs)
                send("response.content_part.done", **at, content_index=0, part=part)
            elif isinstance(item, FunctionCallItem):
                send("response.output_item.added", output_index=index,
                     item=msgspec.structs.replace(item, arguments="", status="in_progress"))  # fmt: skip
                send("response.function_call_arguments.delta", **at, delta=item.arguments)
                send("response.function_call_arguments.done", **at, arguments=item.arguments, name=item.name)
            else:
                send("response.output_item.added", output_index=index, item=item)
            send("response.output_item.done", output_index=index, item=item)
        send("response.incomplete" if response.status == "incomplete" else "response.completed", response=response)
        return events

    def error(self, error: GatewayError) -> Any:
        """OpenAI's error JSON."""
        return error_body(error)


def _output(answer: CallAnswer) -> list[OutputItem]:
    output: list[OutputItem] = []
    if answer.reasoning:
        output.append(ReasoningItem(f"rs_{answer.id}", [ReasoningText(answer.reasoning)]))
    if answer.content:
        logprobs: Any = UNSET
        if answer.tokens is not None:
            logprobs = [
                {"token": t.text, "logprob": t.logprob if t.logprob is not None else -9999.0,
                 "bytes": list(t.text.encode()), "top_logprobs": []}
                for t in answer.tokens
            ]  # fmt: skip
        output.append(MessageItem(f"msg_{answer.id}", [OutputText(answer.content, logprobs=logprobs)]))
    for n, call in enumerate(answer.tool_calls):
        output.append(FunctionCallItem(f"fc_{answer.id}_{n}", call.id, call.name, call.arguments_json))
    return output


# -------------------------------------------------------------------------------------------------- request
def _items(items: list[Any], offset: int, history: History, images: ImageReader) -> None:
    """Input items into ``history``; ``offset``: the index in ``input`` of ``items[offset]`` (errors name it)."""
    turn: ChatMessage | None = None  # the assistant turn being gathered
    turn_at = ""
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
                if turn is not None:
                    history.assistant(turn, turn_at)
                turn, turn_at = {"role": "assistant", "content": None}, where
            last = order
            _add_to_turn(turn, item, kind, where)
            continue
        if turn is not None:
            history.assistant(turn, turn_at)
        turn, last = None, -1
        if kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.call_id", "a function_call_output needs the call_id it answers")
            content = _content(item.get("output"), where, images)
            history.tool(call_id, content, id_field=f"{where}.call_id", kind_field=f"{where}.type")
        elif kind == "message" and role in ("system", "developer"):
            content = _content(item.get("content"), where, None)
            history.system(content if isinstance(content, str) else "", where)
        elif kind == "message" and role == "user":
            history.user(_content(item.get("content"), where, images), where)
        elif kind == "message":
            raise bad_request(f"{where}.role", f"must be 'user', 'assistant', 'system' or 'developer', got {role!r}")
        else:
            raise bad_request(f"{where}.type", f"input item {kind!r} is not supported (message, function_call, "
                              "function_call_output, reasoning)")  # fmt: skip
    if turn is not None:
        history.assistant(turn, turn_at)


def _add_to_turn(turn: ChatMessage, item: Mapping[str, Any], kind: str, where: str) -> None:
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
        name, call_id = item.get("name"), item.get("call_id")
        if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(item.get("arguments"), str):
            raise bad_request(where, "a function_call needs call_id, name and arguments (a JSON string)")
        arguments = arguments_object(item["arguments"], f"{where}.arguments")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        turn.setdefault("tool_calls", []).append(call)


def _content(content: Any, where: str, images: ImageReader | None) -> str | list[Any]:
    """A user / system / tool content: text, or parts with images (``input_image`` data URLs)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", "must be a string or a list of content parts")
    pieces: list[str | Image] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            if images is None:
                raise bad_request(f"{at}.type", "images are taken in user messages and tool outputs only")
            if part.get("detail") not in (None, "auto", "low", "high"):
                raise bad_request(f"{at}.detail", f"must be 'auto', 'low' or 'high', got {part.get('detail')!r}")
            pieces.append(images.read_url(part["image_url"], f"{at}.image_url", at))
        else:
            raise bad_request(f"{at}.type", f"content part {kind!r} is not supported (input_text, "
                              "input_image with a data: URL)")  # fmt: skip
    return message_content(pieces)


def _tools(tools: Any) -> list[ToolSpec] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", "must be a list of function tools")
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise bad_request(f"tools[{i}].type", f"only function tools are supported, got {kind!r}")
        where = f"tools[{i}]"
        specs.append(
            function_tool(
                tool.get("name"),
                tool.get("description"),
                tool.get("parameters"),
                name_field=f"{where}.name",
                parameters_field=f"{where}.parameters",
            )
        )
    return specs or None


def _tool_choice(value: Any, tools: list[ToolSpec] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if value == "auto":
        return {"auto": {}}
    if value == "none":
        return no_tool(tools, "tool_choice")
    if value == "required":
        return any_tool(tools, "tool_choice")
    if isinstance(value, Mapping) and value.get("type") == "function":
        return named_tool(value.get("name"), tools, "tool_choice.name")
    raise bad_request("tool_choice", f"must be 'auto', 'none', 'required' or a function, got {value!r}")


def _text_format(text: Any) -> dict[str, Any] | None:
    """The answer's schema of ``text.format`` (None for text)."""
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise bad_request("text", "must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise bad_request("text.format", "must be an object with a `type`")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        return schema_answer(fmt.get("schema"), "text.format.schema")
    raise bad_request("text.format.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")

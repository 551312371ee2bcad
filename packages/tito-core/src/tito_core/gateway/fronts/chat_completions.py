"""OpenAI chat completions (``POST /v1/chat/completions``): the front's codec.

Decoding checks every field and converts it: the messages (system / developer first, user, assistant with
``tool_calls`` and ``reasoning_content``, tool; text content parts, and ``image_url`` parts of user and tool
messages), the function ``tools``, ``tool_choice``, ``response_format`` and the sampling fields (OpenAI's ranges).
Anything tito cannot honour exactly is a 400 naming the field. The answer is a ``ChatCompletion`` whose message is
the parsed output (``content``, ``reasoning_content``, ``tool_calls`` with arguments as JSON text), ``finish_reason``
``length`` at the token limit, ``tool_calls`` when it calls tools, else ``stop``; with ``logprobs`` every output
token (the stop token included) comes with its logprob; the ``tito`` field carries the output ids, the rollout,
branch and turn. A stream is the same answer as ``chat.completion.chunk`` events and ``data: [DONE]``. Errors are
OpenAI's error JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    stop_strings,
)
from ..errors import GatewayError, bad_request, error_body, known_fields
from ..history import History
from ..images import DETAILS, ImageReader, message_content
from ..ranges import integer, number, token_limit
from ..sse import DONE, Event
from .base import Context, Decoded, Front, Route

__all__ = ["ChatCompletions", "answer_schema"]

# Fields accepted and without effect on tokens or sampling.
_IGNORED = frozenset({"model", "user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"})
_HANDLED = frozenset(
    {"messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens", "temperature",
     "top_p", "top_k", "stop", "seed", "n", "stream", "stream_options", "logprobs", "top_logprobs",
     "frequency_penalty", "presence_penalty", "logit_bias", "response_format"}
)  # fmt: skip
_KNOWN = _HANDLED | _IGNORED
_MESSAGE_KEYS = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "reasoning_content", "refusal", "annotations"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}


# ------------------------------------------------------------------------------------------------ wire types
class Function(msgspec.Struct, frozen=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, frozen=True):
    id: str
    function: Function
    type: str = "function"


class ToolCallDelta(msgspec.Struct, frozen=True):
    index: int
    id: str
    function: Function
    type: str = "function"


class Message(msgspec.Struct, frozen=True):
    content: str | None
    role: str = "assistant"
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | UnsetType = UNSET


class TokenLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[Any]


class Logprobs(msgspec.Struct, frozen=True):
    content: list[TokenLogprob]
    refusal: None = None


class Choice(msgspec.Struct, frozen=True):
    message: Message
    finish_reason: str
    logprobs: Logprobs | None
    index: int = 0


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(msgspec.Struct, frozen=True):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    tito: dict[str, Any]
    object: str = "chat.completion"
    system_fingerprint: None = None


class Delta(msgspec.Struct, frozen=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(msgspec.Struct, frozen=True):
    delta: Delta
    logprobs: Logprobs | None = None
    finish_reason: str | None = None
    index: int = 0


class Chunk(msgspec.Struct, frozen=True):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: str = "chat.completion.chunk"
    system_fingerprint: None = None
    usage: Usage | UnsetType = UNSET
    tito: dict[str, Any] | UnsetType = UNSET


# ----------------------------------------------------------------------------------------------------- front
class ChatCompletions(Front):
    """OpenAI chat completions."""

    name = "chat_completions"
    routes = (Route("/v1/chat/completions"),)

    def decode(self, body: Any, context: Context) -> Decoded:
        """The neutral call of a chat-completions request; its echo is ``stream_options.include_usage``."""
        body = known_fields(body, _KNOWN, "chat completions API")
        _check_unsupported(body)
        tools = _tool_specs(body.get("tools"))
        context.images.begin()
        history = context.history("messages")
        _messages(body.get("messages"), history, context.images)
        choice = _tool_choice(body.get("tool_choice"), tools)
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise bad_request("parallel_tool_calls", f"must be true or false, got {parallel!r}")
        check_parallel(parallel, choice, tools, "parallel_tool_calls")
        options = body.get("stream_options")
        if options is not None and not isinstance(options, Mapping):
            raise bad_request("stream_options", "must be an object")
        model = body.get("model")
        sampling = _sampling(body)
        request = CallRequest(
            conversation=history.conversation(tools),
            sampling=sampling.values,
            fields=sampling.fields,
            tool_choice=choice,
            answer_schema=answer_schema(body.get("response_format"), "response_format"),
            logprobs=_bool(body, "logprobs"),
            stream=_bool(body, "stream"),
            model=model if isinstance(model, str) else "",
        )
        return Decoded(request, bool(options and options.get("include_usage")))

    def encode(self, answer: CallAnswer, decoded: Decoded, context: Context) -> ChatCompletion:
        """The ``ChatCompletion`` of a recorded call."""
        choice = Choice(_message(answer), answer.finish, _logprobs(answer))
        return ChatCompletion(
            f"chatcmpl-{answer.id}", answer.created, answer.model, [choice], _usage(answer), answer.tito
        )

    def events(self, answer: CallAnswer, decoded: Decoded, context: Context) -> list[Event]:
        """The answer as ``chat.completion.chunk`` events, the usage chunk when asked, and ``[DONE]``."""
        cid, created, model = f"chatcmpl-{answer.id}", answer.created, answer.model

        def chunk(delta: Delta, **choice: Any) -> Event:
            return Event(Chunk(cid, created, model, [ChunkChoice(delta, **choice)]))

        events = [chunk(Delta(role="assistant", content=""))]
        if answer.reasoning:
            events.append(chunk(Delta(reasoning_content=answer.reasoning)))
        logprobs = _logprobs(answer)
        if answer.content:
            events.append(chunk(Delta(content=answer.content), logprobs=logprobs))
        elif logprobs is not None:
            events.append(chunk(Delta(), logprobs=logprobs))
        for index, call in enumerate(answer.tool_calls):
            delta = ToolCallDelta(index, call.id, Function(call.name, call.arguments_json))
            events.append(chunk(Delta(tool_calls=[delta])))
        events.append(
            Event(Chunk(cid, created, model, [ChunkChoice(Delta(), finish_reason=answer.finish)], tito=answer.tito))
        )
        if decoded.echo:  # stream_options.include_usage
            events.append(Event(Chunk(cid, created, model, [], usage=_usage(answer))))
        events.append(DONE)
        return events

    def error(self, error: GatewayError) -> Any:
        """OpenAI's error JSON."""
        return error_body(error)


def _message(answer: CallAnswer) -> Message:
    calls = [ToolCall(c.id, Function(c.name, c.arguments_json)) for c in answer.tool_calls]
    return Message(
        answer.content or (None if calls else ""),
        reasoning_content=answer.reasoning if answer.reasoning else UNSET,
        tool_calls=calls or UNSET,
    )


def _logprobs(answer: CallAnswer) -> Logprobs | None:
    if answer.tokens is None:
        return None
    return Logprobs(
        [
            TokenLogprob(t.text, t.logprob if t.logprob is not None else -9999.0, list(t.text.encode()), [])
            for t in answer.tokens
        ]
    )


def _usage(answer: CallAnswer) -> Usage:
    return Usage(answer.prompt_tokens, answer.completion_tokens, answer.prompt_tokens + answer.completion_tokens)


# -------------------------------------------------------------------------------------------------- request
def _bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(key, f"must be true or false, got {value!r}")
    return value


def _check_unsupported(body: Mapping[str, Any]) -> None:
    if body.get("n") not in (None, 1):
        raise bad_request("n", "only one choice per request is supported (a rollout is one sequence)")
    if body.get("top_logprobs") not in (None, 0):
        raise bad_request("top_logprobs", "alternatives are not recorded; only the sampled tokens' logprobs are")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad_request(key, "penalties are not supported (set them in the config's `sampling.extra`)")
    if body.get("logit_bias"):
        raise bad_request("logit_bias", "logit biases are not supported")


def _sampling(body: Mapping[str, Any]) -> Sampling:
    sampling = Sampling()
    max_tokens, max_completion = token_limit(body, "max_tokens"), token_limit(body, "max_completion_tokens")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise bad_request("max_completion_tokens", "differs from max_tokens; give one of them")
    if max_completion is not None:
        sampling.set("max_new_tokens", max_completion, "max_completion_tokens")
    else:
        sampling.set("max_new_tokens", max_tokens, "max_tokens")
    # OpenAI's ranges; top_p 0 and top_k 0 are refused by the engines; top_k is vLLM's and SGLang's extension
    sampling.set("temperature", number(body, "temperature", 0, 2), "temperature")
    sampling.set("top_p", number(body, "top_p", 0, 1, above_low=True), "top_p")
    sampling.set("top_k", integer(body, "top_k", 1, 2**31 - 1, also=-1), "top_k")
    sampling.set("seed", integer(body, "seed", -(2**63), 2**63 - 1), "seed")
    sampling.set("stop", stop_strings(body.get("stop"), "stop"), "stop")
    return sampling


def answer_schema(fmt: Any, where: str) -> dict[str, Any] | None:
    """The JSON schema of a ``response_format`` (chat completions) or ``text.format`` (Responses): None for text.

    ``json_object`` is any JSON object; ``json_schema`` takes its ``schema`` (under ``json_schema`` in chat
    completions, at the top in Responses). The answer is constrained to it whether ``strict`` or not.
    """
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise bad_request(where, "must be an object with a `type`")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema", fmt)
        return schema_answer(spec.get("schema") if isinstance(spec, Mapping) else None, f"{where}.json_schema.schema")
    raise bad_request(f"{where}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _tool_specs(tools: Any) -> list[ToolSpec] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", "must be a list of function tools")
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise bad_request(f"{where}.type", "only 'function' tools are supported")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise bad_request(f"{where}.function.name", "every function tool needs a name")
        specs.append(
            function_tool(
                function.get("name"),
                function.get("description"),
                function.get("parameters"),
                name_field=f"{where}.function.name",
                parameters_field=f"{where}.function.parameters",
            )
        )
    return specs or None


def _tool_choice(value: Any, tools: Sequence[ToolSpec] | None) -> dict[str, Any] | None:
    if value is None:
        return None  # the configured tool_choice applies
    if value == "auto":
        return {"auto": {}}
    if value == "none":
        return no_tool(tools, "tool_choice")
    if value == "required":
        return any_tool(tools, "tool_choice")
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function")
        return named_tool(
            function.get("name") if isinstance(function, Mapping) else None, tools, "tool_choice.function.name"
        )
    raise bad_request("tool_choice", f"must be 'auto', 'none', 'required' or a named function, got {value!r}")


# ------------------------------------------------------------------------------------------------- messages
def _messages(raw: Any, history: History, images: ImageReader) -> None:
    """The request's ``messages`` into ``history``.

    Leading system and developer messages (pydantic-ai's ``system_prompt`` and ``instructions``, LangChain's
    several ``SystemMessage`` s) are the system prompt; later ones are system messages in the history
    (pydantic-ai's output-validator retry sends one).
    """
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages", "must be a non-empty list of messages")
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in _MESSAGE_KEYS:
            raise bad_request(f"{where}.role", f"unsupported role {role!r}")
        extra = sorted(k for k in message if k not in _MESSAGE_KEYS[role] and message[k] is not None)
        if extra:
            raise bad_request(f"{where}.{extra[0]}", f"this field is not supported in a {role} message")
        if role in ("system", "developer"):
            history.system(_text(message.get("content"), where), where)
        elif role == "user":
            history.user(_parts(message.get("content"), where, images), where)
        elif role == "assistant":
            history.assistant(_assistant(message, where), where)
        else:
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
            content = _parts(message.get("content"), where, images)
            history.tool(call_id, content, id_field=f"{where}.tool_call_id", kind_field=f"{where}.role")


def _text(content: Any, where: str, *, allow_none: bool = False) -> str:
    """A text-only message's content (system, developer, assistant): an image part is a 400."""
    text = _parts(content, where, None, allow_none=allow_none)
    assert isinstance(text, str)  # no reader: every image part raised
    return text


def _parts(content: Any, where: str, images: ImageReader | None, *, allow_none: bool = False) -> str | list[Any]:
    """A message's content for the core: a string, or a list of parts when ``images`` read an image in it."""
    if content is None:
        if allow_none:
            return ""
        raise bad_request(f"{where}.content", "is missing")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", "must be a string or a list of content parts")
    pieces: list[str | Image] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "image_url":
            if images is None:
                raise bad_request(f"{at}.type", "images are taken in user and tool messages only")
            url, field = _image_url(part, at)
            pieces.append(images.read_url(url, field, at))
        else:
            raise bad_request(f"{at}.type", f"content part {kind!r} is not supported (text, and image_url)")
    return message_content(pieces)


def _image_url(part: Mapping[str, Any], where: str) -> tuple[str, str]:
    """An ``image_url`` part's URL and the field that holds it."""
    extra = sorted(k for k in part if k not in ("type", "image_url") and part[k] is not None)
    if extra:
        raise bad_request(f"{where}.{extra[0]}", "this field is not supported in an image_url part")
    value = part.get("image_url")
    if isinstance(value, str):
        return value, f"{where}.image_url"
    if not isinstance(value, Mapping):
        raise bad_request(f"{where}.image_url", "must be an object with a `url` (or the URL string)")
    unknown = sorted(k for k in value if k not in ("url", "detail") and value[k] is not None)
    if unknown:
        raise bad_request(f"{where}.image_url.{unknown[0]}", "this field is not supported (only url and detail)")
    detail = value.get("detail")
    if detail is not None and detail not in DETAILS:
        raise bad_request(f"{where}.image_url.detail", f"must be 'auto', 'low' or 'high', got {detail!r}")
    url = value.get("url")
    if not isinstance(url, str):
        raise bad_request(f"{where}.image_url.url", "must be a string")
    return url, f"{where}.image_url.url"


def _assistant(message: Mapping[str, Any], where: str) -> ChatMessage:
    """An assistant message in tito's form (arguments as objects)."""
    if message.get("refusal"):
        raise bad_request(f"{where}.refusal", "refusals are not generated by tito and cannot be rendered")
    chat: ChatMessage = {"role": "assistant", "content": _text(message.get("content"), where, allow_none=True)}
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise bad_request(f"{where}.reasoning_content", "must be a string")
        chat["reasoning_content"] = reasoning
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls", "must be a list")
        chat["tool_calls"] = [_tool_call(call, f"{where}.tool_calls[{j}]", j) for j, call in enumerate(calls)]
    return chat


def _tool_call(call: Any, at: str, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise bad_request(f"{at}.function", "a tool call needs a function with a name")
    arguments = arguments_object(function.get("arguments"), f"{at}.function.arguments")
    call_id = call.get("id")
    call_id = call_id if isinstance(call_id, str) else f"call_{index}"
    return {"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": arguments}}

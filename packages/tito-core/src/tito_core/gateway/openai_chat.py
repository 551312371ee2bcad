"""An OpenAI chat-completions request to tito's :class:`~tito_core.conversation.Conversation` and call options.

:func:`parse_request` checks every field of the request body and converts it: the messages (system / developer
first, user, assistant with ``tool_calls`` and ``reasoning_content``, tool; text content parts, and ``image_url``
parts of user and tool messages through :mod:`~tito_core.gateway.images`) into the chat messages the core takes,
the ``tools`` into tool specs, ``tool_choice`` into tito's form (``{"any": {}}``, ``{"tool": {"name": ...}}``)
and the sampling fields over the configured sampling. Replayed assistant messages
are replaced by the rollout's exact replies (:class:`~tito_core.gateway.matching.ReplyBook`). Anything tito
cannot honour exactly is a :class:`~tito_core.gateway.errors.GatewayError` 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..backend import SamplingParams
from ..conversation import ChatMessage, Conversation, ToolSpec
from ..errors import ConfigError
from ..media import Image
from .errors import bad_request, bounded_depth, known_fields, too_deep
from .images import ImageReader, message_content
from .matching import ReplyBook
from .ranges import integer, number, token_limit

__all__ = ["ChatRequest", "answer_schema", "parse_request"]

# Fields accepted and without effect on tokens or sampling.
_IGNORED = frozenset({"model", "user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"})
_HANDLED = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "seed",
        "n",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "response_format",
    }
)
_NO_IMAGES = "image parts are not taken here (no image reader: a text-only model)"
_MESSAGE_KEYS = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "reasoning_content", "refusal", "annotations"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}
_KNOWN = _HANDLED | _IGNORED


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One checked chat-completions request.

    Attributes:
        conversation: The messages in tito's form (replayed replies already exact).
        sampling: The configured sampling with the request's fields over it.
        tool_choice: tito's ``tool_choice`` (``{"auto": {}}`` the model decides; None: the configured one).
        answer_schema: The JSON schema a structured answer follows (``response_format``), None for free text.
        logprobs: Return the logprob of every output token.
        stream: Answer as server-sent events.
        include_usage: With ``stream``, send a last chunk with the usage (``stream_options.include_usage``).
        model: The ``model`` the client named (echoed back).
    """

    conversation: Conversation
    sampling: SamplingParams
    tool_choice: dict[str, Any] | None = None
    answer_schema: dict[str, Any] | None = None
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    model: str = ""


def parse_request(
    body: Any, book: ReplyBook, sampling: SamplingParams, images: ImageReader | None = None
) -> ChatRequest:
    """Check and convert a chat-completions request body.

    Args:
        body: The decoded JSON body.
        book: The rollout's returned replies (replayed assistant messages are matched against them).
        sampling: The configured sampling the request's fields override.
        images: The rollout's reader of ``image_url`` parts (None: every image part is a 400).

    Raises:
        GatewayError: 400 naming the first field tito cannot honour exactly.
    """
    body = known_fields(body, _KNOWN, "chat completions API")
    _check_unsupported(body)
    tools = _tool_specs(body.get("tools"))
    if images is not None:
        images.begin()
    system, messages = _messages(body.get("messages"), book, images or ImageReader(_NO_IMAGES))
    choice = _tool_choice(body.get("tool_choice"), tools)
    _check_parallel(body.get("parallel_tool_calls"), choice, tools)
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise bad_request("stream_options", "must be an object")
    include_usage = bool(options and options.get("include_usage"))
    model = body.get("model")
    return ChatRequest(
        conversation=Conversation(messages=messages, system=system, tool_specs=tools),
        sampling=_sampling(body, sampling),
        tool_choice=choice,
        answer_schema=answer_schema(body.get("response_format"), "response_format"),
        logprobs=_bool(body, "logprobs"),
        stream=stream,
        include_usage=include_usage,
        model=model if isinstance(model, str) else "",
    )


def _bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(key, f"must be true or false, got {value!r}")
    return value


def _check_unsupported(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    if n not in (None, 1):
        raise bad_request("n", "only one choice per request is supported (a rollout is one sequence)")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise bad_request("top_logprobs", "alternatives are not recorded; only the sampled tokens' logprobs are")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad_request(key, "penalties are not supported (set them in the config's `sampling.extra`)")
    if body.get("logit_bias"):
        raise bad_request("logit_bias", "logit biases are not supported")


def _sampling(body: Mapping[str, Any], base: SamplingParams) -> SamplingParams:
    changes: dict[str, Any] = {}
    max_tokens, max_completion = token_limit(body, "max_tokens"), token_limit(body, "max_completion_tokens")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise bad_request("max_completion_tokens", "differs from max_tokens; give one of them")
    limit = max_completion if max_completion is not None else max_tokens
    if limit is not None:
        changes["max_new_tokens"] = limit
    checked = {  # OpenAI's ranges; top_p 0 and top_k 0 are refused by the engines
        "temperature": number(body, "temperature", 0, 2),
        "top_p": number(body, "top_p", 0, 1, above_low=True),
        "top_k": integer(body, "top_k", 1, 2**31 - 1, also=-1),  # vLLM's and SGLang's extension; -1: none
        "seed": integer(body, "seed", -(2**63), 2**63 - 1),
    }
    changes.update({key: value for key, value in checked.items() if value is not None})
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_request("stop", "must be a non-empty string or a list of them")
        changes["stop"] = tuple(stops)
    if not changes:
        return base
    try:
        return msgspec.structs.replace(base, **changes)
    except (ConfigError, msgspec.ValidationError, TypeError) as exc:
        keys = ("temperature", "top_p", "top_k", "seed", "stop")
        field = next((k for k in keys if k in changes and k in str(exc)), "body")
        raise bad_request(field, str(exc)) from None


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
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            schema = {}  # OpenAI's default: any JSON value
        if not isinstance(schema, Mapping):
            raise bad_request(f"{where}.json_schema.schema", "must be a JSON schema object")
        return dict(schema)
    raise bad_request(f"{where}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")


# ----------------------------------------------------------------------------------------------------- tools
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
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_request(f"{where}.function.name", "every function tool needs a name")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, Mapping):
            raise bad_request(f"{where}.function.parameters", "must be a JSON schema object")
        description = function.get("description")
        specs.append(
            {
                "name": function["name"],
                "description": description if isinstance(description, str) else "",
                "inputSchema": {"json": dict(parameters)},
            }
        )
    return specs or None


def _tool_choice(value: Any, tools: Sequence[ToolSpec] | None) -> dict[str, Any] | None:
    if value is None:
        return None  # the configured tool_choice applies
    if value == "auto":
        return {"auto": {}}
    if value == "none":
        if tools:
            raise bad_request(
                "tool_choice",
                "'none' with tools offered is not supported: the tools stay in the prompt, so leave "
                "them out of the request instead",
            )
        return {"auto": {}}
    if value == "required":
        if not tools:
            raise bad_request("tool_choice", "'required' needs at least one tool in `tools`")
        return {"any": {}}
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise bad_request("tool_choice.function.name", "a named tool_choice needs the function's name")
        if not any(spec["name"] == name for spec in tools or ()):
            raise bad_request("tool_choice.function.name", f"{name!r} is not one of the offered tools")
        return {"tool": {"name": name}}
    raise bad_request("tool_choice", f"must be 'auto', 'none', 'required' or a named function, got {value!r}")


def _check_parallel(value: Any, choice: dict[str, Any] | None, tools: Sequence[ToolSpec] | None) -> None:
    if value is None or value is True:
        return
    if value is not False:
        raise bad_request("parallel_tool_calls", f"must be true or false, got {value!r}")
    if tools and (choice is None or "auto" in choice):
        raise bad_request(
            "parallel_tool_calls",
            "false is only honoured with tool_choice 'required' or a named function (the constraint allows one "
            "call); an unconstrained output is never cut or rewritten",
        )


# -------------------------------------------------------------------------------------------------- messages
def _content(content: Any, where: str, *, allow_none: bool = False) -> str:
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
            pieces.append(images.read(part, at))
        else:
            raise bad_request(f"{at}.type", f"content part {kind!r} is not supported (text, and image_url)")
    return message_content(pieces)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls", "must be a list")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad_request(f"{at}.function", "a tool call needs a function with a name")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except RecursionError:
                raise too_deep(f"{at}.function.arguments") from None
            except ValueError as exc:
                raise bad_request(f"{at}.function.arguments", f"is not JSON: {exc}") from None
            bounded_depth(arguments, f"{at}.function.arguments")
        if not isinstance(arguments, Mapping):
            raise bad_request(f"{at}.function.arguments", "must be a JSON object")
        call_id = call.get("id")
        out.append(
            {
                "id": call_id if isinstance(call_id, str) else f"call_{j}",
                "type": "function",
                "function": {"name": function["name"], "arguments": dict(arguments)},
            }
        )
    return out


def _assistant(
    message: Mapping[str, Any], where: str, book: ReplyBook, position: int
) -> tuple[ChatMessage, dict[str, str]]:
    """The assistant message for the core, and how the client's tool-call ids map to the reply's.

    ``position``: the message is its request's ``position``-th assistant message, counted from 0.
    """
    if message.get("refusal"):
        raise bad_request(f"{where}.refusal", "refusals are not generated by tito and cannot be rendered")
    reply = book.resolve(message, position)
    if reply is not None:
        theirs = [c.get("id") for c in message.get("tool_calls") or () if isinstance(c, Mapping)]
        ours = [c["id"] for c in reply.get("tool_calls", ())]
        return reply, {t: o for t, o in zip(theirs, ours, strict=False) if isinstance(t, str)}
    chat: ChatMessage = {"role": "assistant", "content": _content(message.get("content"), where, allow_none=True)}
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise bad_request(f"{where}.reasoning_content", "must be a string")
        chat["reasoning_content"] = reasoning
    if message.get("tool_calls"):
        chat["tool_calls"] = _tool_calls(message["tool_calls"], where)
    return chat, {}


def _messages(raw: Any, book: ReplyBook, images: ImageReader) -> tuple[str | None, list[ChatMessage]]:
    """The system prompt and the core's messages of a request's ``messages``.

    Leading system and developer messages (pydantic-ai's ``system_prompt`` and ``instructions``, LangChain's
    several ``SystemMessage``s) are joined, in order, with a blank line between them; later ones are system
    messages in the history (pydantic-ai's output-validator retry sends one). Tool messages are checked
    as OpenAI checks them: each answers one call of the assistant message before it, once, and every call is
    answered before the next message that is not a tool result (a 400 naming the message otherwise, with nothing
    recorded).
    """
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages", "must be a non-empty list of messages")
    systems: list[str] = []
    out: list[ChatMessage] = []
    renamed: dict[str, str] = {}
    order: list[str] = []
    results: list[ChatMessage] = []
    calls = _Calls()
    assistants = 0  # the assistant messages so far: a replayed one is matched by its position first

    def flush() -> None:  # tool results go to the core in the order of the calls they answer
        rank = {call_id: i for i, call_id in enumerate(order)}
        out.extend(sorted(results, key=lambda m: rank.get(m["tool_call_id"], len(rank))))
        results.clear()

    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in _MESSAGE_KEYS:
            raise bad_request(f"{where}.role", f"unsupported role {role!r}")
        extra = sorted(k for k in message if k not in _MESSAGE_KEYS[role] and message[k] is not None)
        if extra:
            raise bad_request(f"{where}.{extra[0]}", f"this field is not supported in a {role} message")
        if role != "tool":
            calls.all_answered(where)
            flush()
        if role in ("system", "developer") and not out:
            systems.append(_content(message.get("content"), where))
        elif role in ("system", "developer"):  # rendered where it stands, or joined by the gateway (service.py)
            out.append({"role": "system", "content": _content(message.get("content"), where)})
        elif role == "user":
            out.append({"role": "user", "content": _parts(message.get("content"), where, images)})
        elif role == "assistant":
            chat, renamed = _assistant(message, where, book, assistants)
            assistants += 1
            order = [c["id"] for c in chat.get("tool_calls", ())]
            calls.expect(message)
            out.append(chat)
        else:
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
            calls.answer(call_id, where)
            content = _parts(message.get("content"), where, images)
            results.append({"role": "tool", "tool_call_id": renamed.get(call_id, call_id), "content": content})
    calls.all_answered("the end of messages")
    flush()
    return ("\n\n".join(systems) if systems else None), out


class _Calls:
    """The tool calls of the last assistant message (the client's ids) and which are answered."""

    def __init__(self) -> None:
        self.open: list[str] = []
        self.answered: set[str] = set()

    def expect(self, message: Mapping[str, Any]) -> None:
        calls = message.get("tool_calls") or ()
        self.open = [c["id"] for c in calls if isinstance(c, Mapping) and isinstance(c.get("id"), str)]
        self.answered = set()

    def answer(self, call_id: str, where: str) -> None:
        if not self.open:
            message = "a tool message must answer a tool call of the assistant message before it"
            raise bad_request(f"{where}.role", message)
        if call_id not in self.open:
            known = ", ".join(map(repr, self.open))
            message = f"{call_id!r} is not a tool call of the assistant message before it ({known})"
            raise bad_request(f"{where}.tool_call_id", message)
        if call_id in self.answered:
            raise bad_request(f"{where}.tool_call_id", f"tool call {call_id!r} is answered twice")
        self.answered.add(call_id)

    def all_answered(self, where: str) -> None:
        missing = [c for c in self.open if c not in self.answered]
        if missing:
            raise bad_request(
                "messages", f"tool call {missing[0]!r} of the assistant message is not answered before {where}: each "
                "tool call needs a tool message with its tool_call_id"
            )  # fmt: skip
        self.open, self.answered = [], set()

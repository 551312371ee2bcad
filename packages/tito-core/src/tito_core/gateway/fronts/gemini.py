"""Google's Gemini API (``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent``, ``:countTokens``).

``systemInstruction``'s text parts (joined by newlines) are the system prompt; a ``user`` content's ``functionResponse``
parts are tool results and its ``text`` and ``inlineData`` image parts the user message after them; a ``model``
content's ``text``, ``thought`` text and ``functionCall`` parts are one assistant turn. A function response answers
the call of the model turn before it with its ``id``, else the first unanswered call of its ``name``; it is its
``response`` (the ``output`` value when that is its only key, else the object as JSON), then its ``parts``' images.
``functionDeclarations`` (``parameters``: Gemini's OpenAPI subset, as JSON schema), ``toolConfig`` and
``generationConfig`` map one to one. Fields may be camelCase or snake_case (the SDK sends both); every 400 names the
field as written, in Google's error shape. The answer is a ``GenerateContentResponse``, streamed (the route decides)
as one SSE chunk per part, the last with ``finishReason`` and ``usageMetadata``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from ...conversation import ChatMessage, ToolSpec
from ...media import Image
from ..call import CallAnswer, CallRequest
from ..decoding import Sampling, any_tool, arguments_object, function_tool, named_tool, no_tool, stop_strings
from ..errors import GatewayError, bad_request
from ..history import History
from ..images import ImageReader, message_content
from ..ranges import integer, number, token_limit
from ..sse import Event
from .base import Context, Decoded, Front, Route

__all__ = ["Gemini", "json_schema"]

_MODEL = "/models/{model:[^/:]+}"
# model, safetySettings, labels, serviceTier: accepted and without effect on tokens (tito filters nothing)
_REQUEST = frozenset({"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "model",
                      "safetySettings", "labels", "serviceTier"})  # fmt: skip
_CONFIG = frozenset(
    {"temperature", "topP", "topK", "candidateCount", "maxOutputTokens", "stopSequences", "seed", "presencePenalty",
     "frequencyPenalty", "responseLogprobs", "logprobs", "responseMimeType", "responseSchema", "responseJsonSchema",
     "responseModalities", "thinkingConfig", "mediaResolution"}
)  # fmt: skip
_CONTENT, _THINKING = frozenset({"parts", "role"}), frozenset({"includeThoughts", "thinkingBudget", "thinkingLevel"})
_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode", "codeExecutionResult")
_PART = frozenset({*_DATA, "thought", "thoughtSignature", "mediaResolution"})  # _DATA: a part's one data field
_ROLES = {"user": ("text", "inlineData", "functionResponse"), "model": ("text", "functionCall"), "system": ("text",)}
# a function's response schema (the SDK sends one for a Python function): accepted; no chat template shows it
_DECLARATION = frozenset(
    {"name", "description", "parameters", "parametersJsonSchema", "response", "responseJsonSchema"}
)
_TYPES = {"STRING": "string", "NUMBER": "number", "INTEGER": "integer", "BOOLEAN": "boolean", "ARRAY": "array",
          "OBJECT": "object", "NULL": "null"}  # fmt: skip
_SUBSCHEMAS = ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "not", "prefixItems", "contains", "if",
               "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# google.rpc's codes by HTTP status (Google's API design guide); other 4xx INVALID_ARGUMENT, other 5xx INTERNAL
_STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
             409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "NOT_IMPLEMENTED",
             503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}  # fmt: skip
_URL_SAFE = str.maketrans("-_", "+/")
_RPC = "type.googleapis.com/google.rpc"


# ------------------------------------------------------------------------------------------------ wire types
class FunctionCall(msgspec.Struct, frozen=True):
    name: str
    args: dict[str, Any]
    id: str


class Part(msgspec.Struct, frozen=True, rename="camel"):
    text: str | UnsetType = UNSET
    thought: bool | UnsetType = UNSET
    function_call: FunctionCall | UnsetType = UNSET


class Content(msgspec.Struct, frozen=True):
    parts: list[Part]
    role: str = "model"


class Candidate(msgspec.Struct, frozen=True, rename="camel"):
    content: Content
    finish_reason: str | UnsetType = UNSET
    index: int = 0
    avg_logprobs: float | UnsetType = UNSET
    logprobs_result: dict[str, list[dict[str, Any]]] | UnsetType = UNSET


class UsageMetadata(msgspec.Struct, frozen=True, rename="camel"):
    prompt_token_count: int
    candidates_token_count: int
    total_token_count: int


class GenerateContentResponse(msgspec.Struct, frozen=True, rename="camel"):
    candidates: list[Candidate]
    model_version: str
    response_id: str
    usage_metadata: UsageMetadata | UnsetType = UNSET
    tito: dict[str, Any] | UnsetType = UNSET


# ----------------------------------------------------------------------------------------------------- front
class Gemini(Front):
    """Google's Gemini API, as the google-genai SDKs and Gemini CLI speak it (``v1beta``, and ``v1``)."""

    name = "gemini"
    routes = tuple(
        route
        for version in ("v1beta", "v1")
        for route in (
            Route(f"/{version}{_MODEL}:generateContent", stream=False),
            Route(f"/{version}{_MODEL}:streamGenerateContent", stream=True),
            Route(f"/{version}{_MODEL}:countTokens", kind="count"),
        )
    )
    key_headers = ("x-goog-api-key",)

    def decode(self, body: Any, context: Context) -> Decoded:
        """The neutral call of a request (``countTokens``': ``contents``); the echo: ``includeThoughts``."""
        request = _Fields(body, "", frozenset({"contents"}) if context.route.kind == "count" else _REQUEST)
        tools = _tools(request)
        config = _Fields(request.get("generationConfig") or {}, request.at("generationConfig"), _CONFIG)
        thinking = _Fields(config.get("thinkingConfig") or {}, config.at("thinkingConfig"), _THINKING)
        context.images.begin()
        history = context.history(request.at("contents"))
        if request.get("systemInstruction") is not None:  # its text parts, joined by newlines
            system = _Fields(request.get("systemInstruction"), request.at("systemInstruction"), _CONTENT)
            history.system("\n".join(part.get("text") for part, _ in _parts(system, "system")), system.where)
        _contents(request.get("contents"), request.at("contents"), history, context.images)
        sampling = _sampling(config)
        call = CallRequest(
            conversation=history.conversation(tools),
            sampling=sampling.values,
            fields=sampling.fields,
            tool_choice=_tool_choice(request, tools),
            answer_schema=_answer_schema(config),
            logprobs=_flag(config, "responseLogprobs"),
            stream=bool(context.route.stream),
            model=context.path.get("model", ""),
        )
        return Decoded(call, _flag(thinking, "includeThoughts"))

    def encode(self, answer: CallAnswer, decoded: Decoded, context: Context) -> GenerateContentResponse:
        """The ``GenerateContentResponse``: ``thought`` text (with ``includeThoughts``), text, function calls."""
        parts: list[Part] = []
        if answer.reasoning and decoded.echo:
            parts.append(Part(text=answer.reasoning, thought=True))
        if answer.content or not answer.tool_calls:
            parts.append(Part(text=answer.content))
        parts += [Part(function_call=FunctionCall(c.name, c.arguments, c.id)) for c in answer.tool_calls]
        candidate = Candidate(Content(parts), "MAX_TOKENS" if answer.finish == "length" else "STOP")
        if answer.tokens is not None:  # the chosen tokens' logprobs (a None one left out)
            pairs = zip(answer.tokens, answer.output_ids, strict=False)
            chosen = [{"token": t.text, "tokenId": i, "logProbability": t.logprob} for t, i in pairs]
            known = [t.logprob for t in answer.tokens if t.logprob is not None]
            logprobs = {"chosenCandidates": [{k: v for k, v in c.items() if v is not None} for c in chosen]}
            average = statistics.fmean(known) if known else UNSET
            candidate = msgspec.structs.replace(candidate, avg_logprobs=average, logprobs_result=logprobs)
        prompt, output = answer.prompt_tokens, answer.completion_tokens
        usage = UsageMetadata(prompt, output, prompt + output)
        return GenerateContentResponse([candidate], answer.model, answer.id, usage, answer.tito)

    def events(self, answer: CallAnswer, decoded: Decoded, context: Context) -> list[Event]:
        """The answer as chunks, one per part; the last one ends it (``finishReason``, usage, logprobs, ``tito``)."""
        whole = self.encode(answer, decoded, context)
        (candidate,) = whole.candidates
        *first, last = candidate.content.parts
        replace = msgspec.structs.replace
        chunks = [replace(whole, candidates=[Candidate(Content([p]))], usage_metadata=UNSET, tito=UNSET) for p in first]
        return [Event(c) for c in [*chunks, replace(whole, candidates=[replace(candidate, content=Content([last]))])]]

    def error(self, error: GatewayError) -> dict[str, Any]:
        """Google's error JSON, ``{"error": {"code", "message", "status", "details"}}``.

        The field at fault is a ``google.rpc.BadRequest`` field violation (the core's ``messages`` is ``contents``),
        tito's code a ``google.rpc.ErrorInfo`` reason.
        """
        status = _STATUSES.get(error.status, "INVALID_ARGUMENT" if error.status < 500 else "INTERNAL")
        details: list[dict[str, Any]] = []
        if error.param:
            violation = {
                "field": "contents" if error.param == "messages" else error.param,
                "description": error.message,
            }
            details.append({"@type": f"{_RPC}.BadRequest", "fieldViolations": [violation]})
        if error.code:
            details.append({"@type": f"{_RPC}.ErrorInfo", "reason": error.code, "domain": "tito"})
        return {"error": {"code": error.status, "message": error.message, "status": status, "details": details}}

    def count(self, tokens: int) -> dict[str, int]:
        """``countTokens``' answer."""
        return {"totalTokens": tokens}


# ------------------------------------------------------------------------------------------------ wire objects
class _Fields:
    """A wire object's known fields (null: absent) by camelCase name (snake_case taken), paths as the caller wrote."""

    __slots__ = ("_keys", "_values", "where")

    def __init__(self, value: Any, where: str, known: frozenset[str]) -> None:
        if not isinstance(value, Mapping):
            raise bad_request(where or "body", "must be a JSON object")
        self.where = where
        self._values: dict[str, Any] = {}
        self._keys: dict[str, str] = {}
        for key, item in value.items():
            head, *rest = str(key).split("_")
            name = head + "".join(word[:1].upper() + word[1:] for word in rest)
            if name not in known:
                raise bad_request(self.at(key), "this field is not supported by the tito gateway's Gemini API")
            if name in self._values:
                raise bad_request(self.at(key), f"is given twice (also as {self._keys[name]!r})")
            if item is not None:
                self._values[name], self._keys[name] = item, key

    def get(self, name: str) -> Any:
        """The field's value (None: absent)."""
        return self._values.get(name)

    def at(self, name: str) -> str:
        """The field's path, as the caller spelled it."""
        key = self._keys.get(name, name)
        return f"{self.where}.{key}" if self.where else key


def _flag(fields: _Fields, name: str) -> bool:
    value = fields.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad_request(fields.at(name), f"must be true or false, got {value!r}")
    return bool(value)


def _parts(content: _Fields, role: str) -> list[tuple[_Fields, str]]:
    """A ``role`` content's parts, each with its one data field (a part's ``oneof``), which the role takes."""
    parts, allowed = content.get("parts"), _ROLES[role]
    if not isinstance(parts, list) or not parts:
        raise bad_request(content.at("parts"), "must be a non-empty list of parts")
    out = []
    for j, raw in enumerate(parts):
        part = _Fields(raw, f"{content.at('parts')}[{j}]", _PART)
        kinds = [name for name in _DATA if part.get(name) is not None]
        if len(kinds) != 1:
            raise bad_request(part.where, f"a part holds exactly one data field (got {kinds or 'none'})")
        kind = kinds[0]
        if kind == "fileData":
            raise bad_request(part.at(kind), "the tito gateway fetches nothing: send the image as inlineData")
        if kind not in allowed:
            raise bad_request(part.at(kind), f"is not supported in a {role} content ({', '.join(allowed)})")
        if _flag(part, "thought") and role != "model":
            raise bad_request(part.at("thought"), f"a {role} content holds no thoughts")
        if kind == "text" and not isinstance(part.get(kind), str):
            raise bad_request(part.at(kind), "must be a string")
        out.append((part, kind))
    return out


# -------------------------------------------------------------------------------------------------- contents
def _contents(raw: Any, field: str, history: History, images: ImageReader) -> None:
    if not isinstance(raw, list) or not raw:
        raise bad_request(field, "must be a non-empty list of contents")
    calls: list[tuple[str, str]] = []  # the last model turn's calls: (id, name)
    answered: set[str] = set()
    for i, item in enumerate(raw):
        content = _Fields(item, f"{field}[{i}]", _CONTENT)
        role = content.get("role") or "user"
        if role == "model":
            calls, answered = _model(content, history), set()
        elif role == "user":
            _user(content, history, images, calls, answered)
        else:
            raise bad_request(content.at("role"), f"must be 'user' or 'model', got {role!r}")


def _model(content: _Fields, history: History) -> list[tuple[str, str]]:
    """A model content as one assistant turn; returns its calls' ids (given, or made) and names."""
    said: dict[bool, list[str]] = {True: [], False: []}  # thought text, and text
    calls: list[dict[str, Any]] = []
    for part, kind in _parts(content, "model"):
        if kind == "text":
            said[bool(part.get("thought"))].append(part.get(kind))
            continue
        call = _Fields(part.get(kind), part.at(kind), frozenset({"id", "name", "args"}))
        name, call_id = call.get("name"), call.get("id")
        if not isinstance(name, str) or not name:
            raise bad_request(call.at("name"), "a function call needs the function's name")
        if call_id is not None and (not isinstance(call_id, str) or any(c["id"] == call_id for c in calls)):
            raise bad_request(call.at("id"), "must be a string, unique in its content")
        function = {"name": name, "arguments": arguments_object(call.get("args") or {}, call.at("args"))}
        calls.append({"id": call_id or part.where, "type": "function", "function": function})
    message: ChatMessage = {"role": "assistant", "content": "".join(said[False]) if said[False] or not calls else None}
    if said[True]:
        message["reasoning_content"] = "".join(said[True])
    if calls:
        message["tool_calls"] = calls
    history.assistant(message, content.where)
    return [(c["id"], c["function"]["name"]) for c in calls]


def _user(
    content: _Fields, history: History, images: ImageReader, calls: list[tuple[str, str]], answered: set[str]
) -> None:
    """A user content: tool results for its ``functionResponse`` parts, then a user message of the rest."""
    pieces: list[str | Image] = []
    for part, kind in _parts(content, "user"):
        if kind == "functionResponse":
            _tool_result(part, history, images, calls, answered)
        else:
            pieces.append(part.get(kind) if kind == "text" else _image(part, images))
    if pieces:
        history.user(message_content(pieces), content.where)


def _tool_result(
    part: _Fields, history: History, images: ImageReader, calls: list[tuple[str, str]], answered: set[str]
) -> None:
    """A ``functionResponse``, answering the call with its ``id``, else the first unanswered one of its ``name``."""
    kind_field = part.at("functionResponse")
    result = _Fields(part.get("functionResponse"), kind_field, frozenset({"id", "name", "response", "parts"}))
    name, call_id, response = result.get("name"), result.get("id"), result.get("response") or {}
    if not isinstance(name, str) or not name:
        raise bad_request(result.at("name"), "a function response needs the function's name")
    if not isinstance(response, Mapping):
        raise bad_request(result.at("response"), "must be a JSON object")
    named = [c for c, n in calls if n == name]
    by_id = dict(calls).get(call_id) if isinstance(call_id, str) else None
    if by_id is not None and by_id != name:
        raise bad_request(result.at("name"), f"is {name!r}, but the function call {call_id!r} calls {by_id!r}")
    if by_id is None and calls and not named:
        known = ", ".join(sorted({repr(n) for _, n in calls}))
        raise bad_request(result.at("name"), f"{name!r} is not a function the model turn before it calls ({known})")
    chosen = call_id if by_id is not None else next((c for c in named if c not in answered), (named or [name])[0])
    answered.add(chosen)
    pieces: list[str | Image] = []
    if response or result.get("parts") is None:
        output = response["output"] if set(response) == {"output"} else response
        pieces.append(output if isinstance(output, str) else msgspec.json.encode(output).decode())
    for k, raw in enumerate(result.get("parts") or ()):
        media = _Fields(raw, f"{result.at('parts')}[{k}]", frozenset({"inlineData"}))
        pieces.append(_image(media, images))
    id_field = result.at("id") if by_id is not None else result.at("name")
    history.tool(chosen, message_content(pieces), id_field=id_field, kind_field=kind_field)


def _image(part: _Fields, images: ImageReader) -> Image:
    """A part's ``inlineData`` image; its base64 standard or URL-safe (the Python SDK's), padded or not."""
    blob = _Fields(part.get("inlineData"), part.at("inlineData"), frozenset({"mimeType", "data", "displayName"}))
    media, data = blob.get("mimeType"), blob.get("data")
    if not isinstance(media, str) or not media.lower().startswith("image/"):
        raise bad_request(blob.at("mimeType"), f"must be an image's media type (image/png, ...), got {media!r}")
    if not isinstance(data, str):
        raise bad_request(blob.at("data"), "must be the image's base64 text")
    data = data.translate(_URL_SAFE)
    return images.read_base64(data + "=" * (-len(data) % 4), media, blob.at("data"), part.where)


# ----------------------------------------------------------------------------------------- tools and config
def _tools(request: _Fields) -> list[ToolSpec] | None:
    """The function declarations of ``tools`` (a hosted tool is a 400: tito runs none)."""
    raw = request.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise bad_request(request.at("tools"), "must be a list of tools")
    specs: list[ToolSpec] = []
    for i, item in enumerate(raw or ()):
        tool = _Fields(item, f"{request.at('tools')}[{i}]", frozenset({"functionDeclarations"}))
        declarations = tool.get("functionDeclarations") or []
        if not isinstance(declarations, list):
            raise bad_request(tool.at("functionDeclarations"), "must be a list")
        for k, declaration in enumerate(declarations):
            function = _Fields(declaration, f"{tool.at('functionDeclarations')}[{k}]", _DECLARATION)
            parameters, given = function.get("parameters"), function.get("parametersJsonSchema")
            if parameters is not None and given is not None:
                raise bad_request(function.at("parametersJsonSchema"), "give it or parameters, not both")
            field = function.at("parameters" if parameters is not None else "parametersJsonSchema")
            schema = json_schema(parameters if parameters is not None else given, field, openapi=parameters is not None)
            name, text = function.get("name"), function.get("description")
            specs.append(function_tool(name, text, schema, name_field=function.at("name"), parameters_field=field))
    return specs or None


def _tool_choice(request: _Fields, tools: list[ToolSpec] | None) -> dict[str, Any] | None:
    """``toolConfig.functionCallingConfig``: ``AUTO``, ``NONE`` (without tools), ``ANY`` (one name, or all)."""
    config = _Fields(request.get("toolConfig") or {}, request.at("toolConfig"), frozenset({"functionCallingConfig"}))
    if config.get("functionCallingConfig") is None:
        return None
    calling = _Fields(config.get("functionCallingConfig"), config.at("functionCallingConfig"),
                      frozenset({"mode", "allowedFunctionNames"}))  # fmt: skip
    mode, names = calling.get("mode") or "AUTO", calling.get("allowedFunctionNames")
    field, where = calling.at("mode"), calling.at("allowedFunctionNames")
    listed = isinstance(names, list) and all(isinstance(n, str) for n in names)
    if names is not None and (mode != "ANY" or not listed):
        raise bad_request(where, "must be a list of function names, with mode ANY")
    if mode in ("AUTO", "MODE_UNSPECIFIED"):
        return {"auto": {}}
    if mode == "NONE":
        return no_tool(tools, field)
    if mode != "ANY":  # VALIDATED: calls constrained while the model may also answer, which tito never constrains
        raise bad_request(field, f"must be AUTO, ANY or NONE, got {mode!r}")
    if not names or set(names) == {spec["name"] for spec in tools or ()}:
        return any_tool(tools, field)
    if len(set(names)) != 1:
        raise bad_request(where, "must name one function, or all the offered ones (a subset cannot be constrained)")
    return named_tool(names[0], tools, f"{where}[0]")


def _sampling(config: _Fields) -> Sampling:
    """The sampling fields, in Gemini's ranges; what tito cannot honour is a 400."""

    def one(name: str) -> tuple[dict[str, Any], str]:  # an integral number is an integer, as Google's parser takes it
        value, field = config.get(name), config.at(name)
        whole = isinstance(value, float) and value.is_integer() and name in ("maxOutputTokens", "topK", "seed")
        return {field: int(value) if whole else value}, field

    sampling = Sampling()
    sampling.set("max_new_tokens", token_limit(*one("maxOutputTokens")), config.at("maxOutputTokens"))
    sampling.set("temperature", number(*one("temperature"), 0, 2), config.at("temperature"))  # Gemini's range
    sampling.set("top_p", number(*one("topP"), 0, 1, above_low=True), config.at("topP"))  # the engines refuse 0
    sampling.set("top_k", integer(*one("topK"), 1, 2**31 - 1), config.at("topK"))
    sampling.set("seed", integer(*one("seed"), -(2**31), 2**31 - 1), config.at("seed"))
    stops = config.at("stopSequences")
    sampling.set("stop", stop_strings(config.get("stopSequences"), stops), stops)
    refused = {
        "candidateCount": (1, "only one candidate per request (a rollout is one sequence)"),
        "logprobs": (0, "top candidates are not recorded; responseLogprobs gives the chosen tokens' logprobs"),
        "presencePenalty": (0, "penalties are not supported (set them in the config's `sampling.extra`)"),
        "frequencyPenalty": (0, "penalties are not supported (set them in the config's `sampling.extra`)"),
        "responseModalities": (["TEXT"], "only ['TEXT'] is supported"),
    }
    for name, (allowed, why) in refused.items():
        if config.get(name) not in (None, allowed):
            raise bad_request(config.at(name), why)
    return sampling


def _answer_schema(config: _Fields) -> dict[str, Any] | None:
    """``application/json``'s schema, ``responseSchema`` or ``responseJsonSchema`` (neither: any JSON value)."""
    mime, schema, given = config.get("responseMimeType"), config.get("responseSchema"), config.get("responseJsonSchema")
    if schema is not None and given is not None:
        raise bad_request(config.at("responseJsonSchema"), "give it or responseSchema, not both")
    if mime in (None, "text/plain") and schema is None and given is None:
        return None
    if mime != "application/json":
        raise bad_request(config.at("responseMimeType"), "must be 'text/plain', or 'application/json' with a schema")
    if schema is not None:
        return json_schema(schema, config.at("responseSchema"), openapi=True)
    return json_schema(given, config.at("responseJsonSchema")) if given is not None else {}


# ----------------------------------------------------------------------------------------------------- schemas
def json_schema(value: Any, where: str, *, openapi: bool = False) -> dict[str, Any]:
    """A JSON schema with Gemini's upper-case type names (which Gemini CLI sends) in JSON schema's lower case.

    ``openapi``: a Gemini ``Schema`` (OpenAPI 3.0's subset): its type must be one of Gemini's (any case),
    ``nullable`` adds ``null`` to the type (and enum), ``propertyOrdering`` orders ``properties``, ``example`` is
    ``examples``.
    """
    if not isinstance(value, Mapping):
        raise bad_request(where, "must be a JSON schema object")
    return dict(_converted(value, where, openapi))


def _converted(schema: Any, where: str, openapi: bool) -> Any:
    if isinstance(schema, list):
        return [_converted(sub, f"{where}[{k}]", openapi) for k, sub in enumerate(schema)]
    if not isinstance(schema, Mapping):
        return schema
    out = {
        key: _converted(sub, f"{where}.{key}", openapi) if key in _SUBSCHEMAS else sub for key, sub in schema.items()
    }
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: _converted(sub, f"{where}.{key}.{name}", openapi) for name, sub in out[key].items()}
    kind = out.get("type")
    if isinstance(kind, list):
        out["type"] = [_TYPES.get(k, k) for k in kind]
    elif isinstance(kind, str):
        out["type"] = _TYPES.get(kind.upper() if openapi else kind, kind)
        if openapi and out["type"] == kind and kind not in _TYPES.values():
            if kind != "TYPE_UNSPECIFIED":
                raise bad_request(f"{where}.type", f"must be one of {', '.join(_TYPES)}, got {kind!r}")
            del out["type"]
    if not openapi:
        return out
    if "example" in out:
        out["examples"] = [out.pop("example")]
    order, properties = out.pop("propertyOrdering", None), out.get("properties", {})
    if order is not None:
        names = sorted(properties) if isinstance(properties, Mapping) else None
        if not isinstance(order, list) or sorted(order, key=str) != names:
            raise bad_request(f"{where}.propertyOrdering", "must list the schema's properties, each once")
        out["properties"] = {key: properties[key] for key in order}
    if out.pop("nullable", False):
        if isinstance(out.get("enum"), list):
            out["enum"] = [*out["enum"], None]
        out = {**out, "type": [out["type"], "null"]} if "type" in out else {"anyOf": [out, {"type": "null"}]}
    return out

"""The vLLM backend: one tito generation = one non-streaming request to a vLLM server.

Two modes:

``mode="tokens"`` (default, exact token-in/token-out)
    The core renders the prompt; the backend sends its token ids and gets token ids back. Endpoint
    ``"generate"`` is vLLM's native ``POST /inference/v1/generate`` (servers started with
    ``--enable-scale-out``): ids in, ids and id-tagged logprobs out, no detokenized text, no prompt
    echo unless ``return_prompt_ids=True``. Endpoint ``"completions"`` is ``POST /v1/completions``
    with a token-id ``prompt`` and ``return_token_ids``; it always echoes the prompt ids. ``"auto"``
    (default) uses ``generate`` and falls back to ``completions`` for good when the server does not
    expose it.

``mode="chat"`` (:class:`VLLMChatBackend`, ``renders_prompt = True``; :class:`VLLMBackend` is the tokens mode)
    ``POST /v1/chat/completions`` with the chat-template messages and tools of the request: vLLM
    renders the prompt and echoes its ids (``prompt_token_ids``), which the core checks against the
    trajectory before accepting the output ids.

Logprobs: vLLM returns the logprobs of the *raw* model distribution (before temperature, top-k and
top-p) unless the server was started with ``--logprobs-mode processed_logprobs``. For importance
ratios in RL with a temperature other than 1, start the server with that flag; see
:meth:`VLLMBackend.logprobs_mode` for reading the server's setting.

Cancellation: vLLM aborts a request when its HTTP connection closes. Cancelling
:meth:`VLLMBackend.generate` (or hitting the timeout) closes the connection, so the generation stops
on the server too.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, Unpack

import msgspec

from tito_core.backend import GenerateRequest, GenerateResult
from tito_core.errors import BackendError, BackendResponseError, ConfigError
from tito_core.http import HttpOptions
from tito_core.http.ids_json import IdsJson
from tito_core.media import ImageError
from tito_vllm import _wire
from tito_vllm._images import ImageFeatures
from tito_vllm._server import ROUTE_MISSING, Mode, _VLLMServer

__all__ = ["Endpoint", "Mode", "VLLMBackend", "VLLMChatBackend", "openai_messages", "vllm_backend"]

logger = logging.getLogger(__name__)

Endpoint = Literal["auto", "generate", "completions"]

_GENERATE_PATH = "/inference/v1/generate"
_COMPLETIONS_PATH = "/v1/completions"
_CHAT_PATH = "/v1/chat/completions"

# Fields of a /inference/v1/generate request that live beside `sampling_params`, not inside it.
_GENERATE_REQUEST_FIELDS = frozenset(
    {"cache_salt", "priority", "kv_transfer_params", "ec_transfer_params", "reasoning_ended",
     "reasoning_parser_kwargs", "features", "content_parts", "output_mode"}
)  # fmt: skip


class VLLMBackend(_VLLMServer):
    """A vLLM server (OpenAI-compatible API server, vLLM >= 0.32), token ids in and out (``mode="tokens"``).

    Args:
        base_url: Server root, e.g. ``http://127.0.0.1:8000``.
        model: Served model name; ``None`` takes the first model of ``GET /v1/models``.
        endpoint: ``"generate"``, ``"completions"`` or ``"auto"`` (generate when the server exposes it,
            else completions).
        return_prompt_ids: With the generate endpoint, ask the server to echo the prompt ids so the core
            can check them. Costs response bytes proportional to the trajectory; the completions and
            chat endpoints always echo.
        check_request_id: Refuse an answer whose id is not built from the request id sent (see
            :meth:`_check_echoed_id`); turn off only for a proxy that rewrites response ids.
        **options: The connection options of :class:`~tito_core.http.HttpBackend` (``timeout``,
            ``retry``, ``max_connections``, ``headers``, ``api_key``, ``verify``, ``trust_env``,
            ``client``, ``transport``, ``max_response_bytes``, ...).

    :class:`VLLMChatBackend` is the chat mode (the server renders the prompt); the plugin factory
    :func:`vllm_backend` picks one of the two by ``mode``.
    """

    mode: ClassVar[Mode] = "tokens"
    input_kinds: ClassVar[frozenset[str]] = frozenset({"image"})

    def __init__(
        self,
        base_url: str | None = None,
        *,
        model: str | None = None,
        endpoint: Endpoint = "auto",
        return_prompt_ids: bool = False,
        check_request_id: bool = True,
        **options: Unpack[HttpOptions],
    ) -> None:
        if endpoint not in ("auto", "generate", "completions"):
            raise ConfigError(f"unknown vLLM endpoint {endpoint!r}; choose 'auto', 'generate' or 'completions'")
        super().__init__(base_url, model=model, check_request_id=check_request_id, **options)
        self.endpoint: Endpoint = endpoint
        self.return_prompt_ids = return_prompt_ids
        self._ids_json = IdsJson()
        self._images = ImageFeatures(self.name, self._post_raw)

    def end_sequence(self, sequence: str) -> None:
        """Drop the JSON of ``sequence``'s ids (its branch ended)."""
        self._ids_json.end(sequence)

    # -- generation --------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Send the prompt ids, return the generated ids, logprobs and finish reason exactly."""
        await self._discover()
        if request.media and self.endpoint == "completions":
            raise ImageError(
                f"{self.name}: images go through {_GENERATE_PATH} (servers started with --enable-scale-out); "
                f"{_COMPLETIONS_PATH} takes none"
            )
        if self.endpoint != "completions":
            try:
                return await self._generate_native(request)
            except BackendError as exc:
                if self.endpoint == "generate" or exc.status not in ROUTE_MISSING or request.media:
                    raise
                logger.info(
                    "%s: %s is not available on %s (HTTP %s); using %s",
                    self.name, _GENERATE_PATH, self.base_url, exc.status, _COMPLETIONS_PATH,
                )  # fmt: skip
                self.endpoint = "completions"
        return await self._generate_completions(request)

    async def _generate_native(self, request: GenerateRequest) -> GenerateResult:
        sampling = self._sampling_fields(request, for_generate=True)
        body: dict[str, Any] = {"model": self.model, "request_id": request.rid}
        for key in _GENERATE_REQUEST_FIELDS.intersection(sampling):
            body[key] = sampling.pop(key)
        if request.return_logprobs:
            sampling["logprobs"] = 0
        if request.return_prompt_logprobs:
            sampling["prompt_logprobs"] = 0
        if not request.sampling.stop:
            sampling.setdefault("detokenize", False)  # token ids out: text is never read
        body["sampling_params"] = sampling
        if self.return_prompt_ids:
            body["return_token_ids"] = True
        body["token_ids"] = msgspec.Raw(self._ids_json.encode(request))
        if request.media:
            body["features"] = await self._images.features(request, self.model)
        echoed = len(request.input_ids) if self.return_prompt_ids else 0
        limit = self._answer_limit(request, echoed_tokens=echoed)
        response = await self._post(_GENERATE_PATH, body, _wire.GenerateResponse, max_body=limit)
        self._check_echoed_id(response.request_id, "generate-tokens-", request, "request_id")
        choice = self._answers.only_choice(response.choices, _GENERATE_PATH)
        output_ids = self._answers.output_ids(choice.token_ids, _GENERATE_PATH)
        logprobs: list[float] | None = None
        if request.return_logprobs:
            entries = choice.logprobs.content if choice.logprobs is not None else None
            if entries is None:
                raise self._answers.misaligned(_GENERATE_PATH, "no logprobs although they were requested")
            self._answers.check_length(len(entries), len(output_ids), _GENERATE_PATH)
            for position, (entry, token_id) in enumerate(zip(entries, output_ids, strict=True)):
                if entry.token_id != token_id:
                    raise self._answers.misaligned(
                        _GENERATE_PATH,
                        f"logprob {position} is for token {entry.token_id}, the output token is {token_id}",
                    )
            logprobs = [entry.logprob for entry in entries]
        result = self._answers.result(request, choice, output_ids, logprobs, response.usage,
                                      response.prompt_token_ids, response.prompt_logprobs, _GENERATE_PATH)  # fmt: skip
        if request.media and response.mm_placeholders is not None:
            used = [(r.offset, r.length) for r in response.mm_placeholders.get("image", [])]
            if used != [(i.span.start, i.span.length) for i in request.media]:
                raise BackendResponseError(
                    f"{self.name}: {_GENERATE_PATH}: the engine placed the images at {used}, not at the spans sent",
                    field="mm_placeholders",
                    value=used,
                    backend=self.name,
                )
        if request.media and result.prompt_tokens != len(request.input_ids):
            # The engine consumed another prompt than the trajectory's (an image expanded again?): record nothing.
            raise BackendResponseError(
                f"{self.name}: {_GENERATE_PATH}: the engine counted {result.prompt_tokens} prompt tokens for a "
                f"{len(request.input_ids)}-token prompt with {len(request.media)} image(s)",
                field="prompt_tokens",
                value=result.prompt_tokens,
                backend=self.name,
            )
        return result

    async def _post_raw(self, path: str, body: dict[str, Any], max_body: int) -> bytes:
        return await self._http.post(path, msgspec.json.encode(body), max_body=max_body)

    async def _generate_completions(self, request: GenerateRequest) -> GenerateResult:
        body = self._sampling_fields(request, for_generate=False)
        body.update(model=self.model, request_id=request.rid, return_token_ids=True, stream=False, echo=False)
        if request.return_logprobs:
            body["logprobs"] = 0
            body["return_tokens_as_token_ids"] = True
        if request.return_prompt_logprobs:
            body["prompt_logprobs"] = 0
        body["prompt"] = msgspec.Raw(self._ids_json.encode(request))
        limit = self._answer_limit(request, echoed_tokens=len(request.input_ids))
        response = await self._post(_COMPLETIONS_PATH, body, _wire.CompletionResponse, max_body=limit)
        self._check_echoed_id(response.id, "cmpl-", request, "id")
        choice = self._answers.only_choice(response.choices, _COMPLETIONS_PATH)
        output_ids = self._answers.output_ids(choice.token_ids, _COMPLETIONS_PATH)
        logprobs: list[float] | None = None
        if request.return_logprobs:
            lp = choice.logprobs
            if lp is None or lp.token_logprobs is None:
                raise self._answers.misaligned(_COMPLETIONS_PATH, "no logprobs although they were requested")
            self._answers.check_length(len(lp.token_logprobs), len(output_ids), _COMPLETIONS_PATH)
            if lp.tokens is not None:
                self._answers.check_tagged_tokens(lp.tokens, output_ids, _COMPLETIONS_PATH)
            logprobs = self._answers.floats(lp.token_logprobs, _COMPLETIONS_PATH)
        return self._answers.result(request, choice, output_ids, logprobs, response.usage, choice.prompt_token_ids,
                            choice.prompt_logprobs, _COMPLETIONS_PATH)  # fmt: skip


class VLLMChatBackend(_VLLMServer):
    """vLLM's OpenAI chat endpoint: the server renders the chat template (``renders_prompt = True``).

    Sends ``request.messages`` and ``request.tools`` to ``POST /v1/chat/completions`` (non-streaming)
    with ``return_token_ids``; returns the server's prompt ids (``prompt_token_ids``), which the core
    checks against the trajectory, and the generated ids with their logprobs. Pass chat-template
    options (``chat_template_kwargs``, ``tool_choice``, ...) through ``SamplingParams.extra``.
    """

    renders_prompt: ClassVar[bool] = True
    mode: ClassVar[Mode] = "chat"

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Send the chat messages, return the server's prompt ids and the generated ids exactly."""
        if request.messages is None:
            raise ValueError(f"{type(self).__name__} needs GenerateRequest.messages (chat mode)")
        await self._discover()
        body = self._sampling_fields(request, for_generate=False)
        body.update(model=self.model, request_id=request.rid, return_token_ids=True, stream=False)
        if request.return_logprobs:
            body["logprobs"] = True
            body["return_tokens_as_token_ids"] = True
        if request.return_prompt_logprobs:
            body["prompt_logprobs"] = 0
        body["messages"] = openai_messages(request.messages)
        if request.tools:
            body["tools"] = request.tools
            # Tools are rendered into the prompt; the core parses calls from the output ids. "none" keeps
            # vLLM from parsing them too, and works on servers without --enable-auto-tool-choice (vLLM
            # defaults to "auto" there and refuses the request).
            body.setdefault("tool_choice", "none")
        limit = self._answer_limit(request, echoed_tokens=len(request.input_ids))
        response = await self._post(_CHAT_PATH, body, _wire.ChatResponse, max_body=limit)
        self._check_echoed_id(response.id, "chatcmpl-", request, "id")
        choice = self._answers.only_choice(response.choices, _CHAT_PATH)
        output_ids = self._answers.output_ids(choice.token_ids, _CHAT_PATH)
        if response.prompt_token_ids is None:
            raise BackendResponseError(
                f"{self.name}: {_CHAT_PATH} returned no prompt_token_ids", field="prompt_token_ids", backend=self.name
            )
        logprobs: list[float] | None = None
        if request.return_logprobs:
            entries = choice.logprobs.content if choice.logprobs is not None else None
            if entries is None:
                raise self._answers.misaligned(_CHAT_PATH, "no logprobs although they were requested")
            self._answers.check_length(len(entries), len(output_ids), _CHAT_PATH)
            self._answers.check_tagged_tokens([e.token for e in entries], output_ids, _CHAT_PATH)
            logprobs = [e.logprob for e in entries]
        return self._answers.result(request, choice, output_ids, logprobs, response.usage, response.prompt_token_ids,
                            response.prompt_logprobs, _CHAT_PATH)  # fmt: skip


def vllm_backend(base_url: str | None = None, *, mode: Mode = "tokens", **options: Any) -> _VLLMServer:
    """The ``vllm`` plugin factory: a :class:`VLLMBackend` (``mode="tokens"``) or a :class:`VLLMChatBackend`.

    Its signature (``inspect.signature``) lists ``mode`` and every option of :class:`VLLMBackend`, so the
    plugin registry answers a misspelt option with a ``ConfigError`` naming the valid ones.
    """
    if mode == "tokens":
        return VLLMBackend(base_url, **options)
    if mode == "chat":
        tokens_only = sorted(set(options) & {"endpoint", "return_prompt_ids"})
        if tokens_only:
            raise ConfigError(f"vllm: {', '.join(tokens_only)} apply to mode='tokens' only, not mode='chat'")
        return VLLMChatBackend(base_url, **options)
    raise ConfigError(f"unknown vLLM backend mode {mode!r}; choose 'tokens' or 'chat'")


def _factory_signature() -> inspect.Signature:
    params = list(inspect.signature(VLLMBackend).parameters.values())
    mode = inspect.Parameter("mode", inspect.Parameter.KEYWORD_ONLY, default="tokens", annotation="Mode")
    return inspect.Signature([params[0], mode, *params[1:]], return_annotation="_VLLMServer")


vllm_backend.__signature__ = _factory_signature()  # type: ignore[attr-defined]


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat-template messages as the OpenAI API takes them: tool-call ``arguments`` as JSON strings.

    Chat templates take ``arguments`` as a mapping and render it with ``tojson``; the OpenAI schema
    vLLM validates wants a JSON string. ``json.dumps`` with the ``tojson`` defaults gives the text the
    template would have rendered, so the server's prompt equals a local render of the same messages.
    Messages without tool calls are passed as they are (not copied).
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls or all(isinstance(c.get("function", {}).get("arguments"), str) for c in calls):
            out.append(message)
            continue
        converted = []
        for call in calls:
            function = call.get("function")
            if isinstance(function, dict) and not isinstance(function.get("arguments"), str):
                arguments = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
                call = {**call, "function": {**function, "arguments": arguments}}
            converted.append(call)
        out.append({**message, "tool_calls": converted})
    return out


def _ids(values: Sequence[int]) -> list[int]:
    """Return the prompt as a list (msgspec encodes lists of ints; ``array('i')`` is not JSON)."""
    return values if isinstance(values, list) else list(values)

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
from typing import Any, ClassVar, Literal, TypeVar, Unpack

import msgspec

from tito_core.backend import FinishReason, GenerateRequest, GenerateResult, PauseMode, SamplingParams
from tito_core.errors import BackendError, BackendResponseError, ConfigError, ContextLengthError
from tito_core.http import HttpBackend, HttpOptions
from tito_core.ids_json import IdsJson
from tito_core.versions import decode_spans
from tito_vllm import _wire

__all__ = ["Endpoint", "Mode", "VLLMBackend", "VLLMChatBackend", "openai_messages", "vllm_backend"]

logger = logging.getLogger(__name__)

Mode = Literal["tokens", "chat"]
Endpoint = Literal["auto", "generate", "completions"]

_GENERATE_PATH = "/inference/v1/generate"
_COMPLETIONS_PATH = "/v1/completions"
_CHAT_PATH = "/v1/chat/completions"
_MODELS_PATH = "/v1/models"
_SERVER_INFO_PATH = "/server_info?config_format=json"

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "stop",  # chat endpoint, server-side tool parser matched a call
    "repetition": "stop",  # repetition detection; stop_reason names the pattern
    "length": "length",
    "abort": "abort",
}
# Fields of a /inference/v1/generate request that live beside `sampling_params`, not inside it.
_GENERATE_REQUEST_FIELDS = frozenset(
    {"cache_salt", "priority", "kv_transfer_params", "ec_transfer_params", "reasoning_ended",
     "reasoning_parser_kwargs", "features", "content_parts", "output_mode"}
)  # fmt: skip
# Statuses meaning "this route is not served here" (403: scale-out endpoints disabled).
_ROUTE_MISSING = frozenset({403, 404, 405})

_encoder = msgspec.json.Encoder()
_V = TypeVar("_V")


class _VLLMServer(HttpBackend):
    """What both vLLM modes share: options, model discovery, request id checks, answer decoding."""

    name: ClassVar[str] = "vllm"
    mode: ClassVar[Mode]
    supports_grammar: ClassVar[bool] = True
    supports_pause: ClassVar[bool] = True
    default_base_url: ClassVar[str] = "http://127.0.0.1:8000"

    def __init__(
        self,
        base_url: str | None = None,
        *,
        model: str | None = None,
        check_request_id: bool = True,
        **options: Unpack[HttpOptions],
    ) -> None:
        extra: dict[str, Any] = dict(options)
        if "mode" in extra:  # the class is the mode: say which one to use instead of a bare TypeError
            raise ConfigError(
                f"{type(self).__name__} takes no `mode` (got {extra['mode']!r}): the class is the mode. Use "
                "VLLMChatBackend for the chat mode and VLLMBackend for token ids, or choose by name with "
                "get_backend('vllm', mode='chat' | 'tokens')"
            )
        super().__init__(base_url, **options)
        self.model = model
        # vLLM names a request by the X-Request-Id header when there is one, else by the body's
        # request_id: with a fixed X-Request-Id header the echoed id cannot match the rid.
        self.check_request_id = check_request_id and not any(
            k.lower() == "x-request-id" for k in (options.get("headers") or {})
        )
        self._max_model_len: int | None = None
        self._discovered = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r}, model={self.model!r})"

    # -- weight updates (tito_core.weights.weight_update; the routes need VLLM_SERVER_DEV_MODE=1) ----------

    async def pause_generation(self, mode: PauseMode = "keep") -> None:
        """``POST /pause?mode=keep|abort``; requests sent while paused wait for the resume.

        ``keep``: requests in flight freeze with their KV cache until the resume. ``abort``: they end with the
        tokens generated so far. vLLM 0.32 has no pause that recomputes the requests in flight
        (``mode="recompute"``); its ``wait`` mode (drain first) is not a pause of requests in flight.
        """
        if mode not in ("keep", "abort"):
            raise ConfigError(
                f"vLLM cannot pause in {mode!r} mode: its pause keeps the KV cache (mode='keep') "
                "or aborts (mode='abort')"
            )
        await self._http.post(f"/pause?mode={mode}", b"")

    async def resume_generation(self) -> None:
        """``POST /resume``."""
        await self._http.post("/resume", b"")

    async def set_weight_version(self, version: str) -> None:
        """``POST /update_weight_version``: the label the answers' ``weight_versions`` spans carry from now on."""
        await self._http.post("/update_weight_version", json.dumps({"new_version": version}).encode())

    # -- server facts ------------------------------------------------------------------------------

    async def _discover(self) -> None:
        """Read the model name and its context window from ``GET /v1/models`` (once)."""
        if self._discovered:
            return
        models = self._decode(await self._http.get(_MODELS_PATH), _wire.ModelList, _MODELS_PATH)
        if not models.data:
            raise BackendResponseError(f"{self.name}: {_MODELS_PATH} lists no model", field="data", backend=self.name)
        card = next((m for m in models.data if m.id == self.model), None)
        if card is None:
            if self.model is not None:
                served = ", ".join(m.id for m in models.data)
                raise BackendError(
                    f"{self.name}: model {self.model!r} is not served by {self.base_url} (serves: {served})",
                    backend=self.name,
                )
            card = models.data[0]
        self.model = card.id
        self._max_model_len = card.max_model_len
        self._discovered = True

    async def max_context_length(self) -> int | None:
        """``max_model_len`` of the served model, from ``GET /v1/models``."""
        await self._discover()
        return self._max_model_len

    async def logprobs_mode(self) -> str | None:
        """Return the server's ``--logprobs-mode`` (``"raw_logprobs"`` by default), None if unknown.

        vLLM reports it only on its development endpoint ``GET /server_info`` (servers started with
        ``VLLM_SERVER_DEV_MODE=1``); elsewhere this returns None. ``raw_logprobs`` means the returned
        logprobs ignore temperature, top-k and top-p; ``processed_logprobs`` means they are the
        logprobs of the distribution actually sampled from.
        """
        try:
            body = await self._http.get(_SERVER_INFO_PATH)
        except BackendError as exc:
            if exc.status in _ROUTE_MISSING:
                return None
            raise
        try:
            info = msgspec.json.decode(body)
            mode = info["vllm_config"]["model_config"]["logprobs_mode"]
        except (msgspec.DecodeError, KeyError, TypeError):
            return None
        return mode if isinstance(mode, str) else None

    # -- request building --------------------------------------------------------------------------

    def _sampling_fields(self, request: GenerateRequest, *, for_generate: bool) -> dict[str, Any]:
        """Map the sampling parameters to vLLM's names (the same in every endpoint), ``extra`` last.

        A grammar goes to ``structured_outputs.grammar`` (vLLM's structured-output backend, xgrammar by
        default): top level on the OpenAI endpoints, inside ``sampling_params`` on ``/inference/v1/generate``.
        """
        s: SamplingParams = request.sampling
        out: dict[str, Any] = {}
        max_tokens = s.max_new_tokens
        if max_tokens is None and not for_generate and self.mode == "tokens" and self._max_model_len:
            # /v1/completions defaults to 16 new tokens: ask for the room left instead.
            max_tokens = self._max_model_len - len(request.input_ids)
            if max_tokens < 1:
                raise ContextLengthError(
                    f"{self.name}: the prompt ({len(request.input_ids)} tokens) leaves no room in the "
                    f"context window ({self._max_model_len} tokens)",
                    backend=self.name,
                )
        if max_tokens != s.max_new_tokens:
            s = msgspec.structs.replace(s, max_new_tokens=max_tokens)
        out.update(s.engine_fields(max_new_tokens="max_tokens"))
        out["skip_special_tokens"] = False
        out["include_stop_str_in_output"] = True
        if request.return_routed_experts:
            # Routing rows of the trajectory so far were returned by the previous calls.
            out["routed_experts_prompt_start"] = request.prefix_len
        if request.grammar is not None:
            out["structured_outputs"] = {"grammar": request.grammar}
        out.update(s.extra)
        return out

    # -- response decoding -------------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any], view: type[_V], *, max_body: int) -> _V:
        # No abort callback: vLLM aborts a request when its connection closes, and the transport closes
        # the connection on a timeout, a cancellation or a failed exchange.
        raw = await self._http.post(path, _encoder.encode(body), max_body=max_body)
        return self._decode(raw, view, path)

    def _answer_limit(self, request: GenerateRequest, *, echoed_tokens: int) -> int:
        """Body limit of a generation's answer (see :func:`tito_core.http.response_byte_limit`)."""
        n_prompt = len(request.input_ids)
        routed = 0
        if request.return_routed_experts:
            routed = n_prompt + (request.sampling.max_new_tokens or self._max_model_len or 131_072)
        return self.response_limit(
            request,
            echoed_tokens=echoed_tokens,
            prompt_logprob_tokens=n_prompt if request.return_prompt_logprobs else 0,
            routed_expert_tokens=routed,
            context_length=self._max_model_len,
        )

    def _check_echoed_id(self, echoed: str | None, prefix: str, request: GenerateRequest, field: str) -> None:
        """Refuse an answer whose id says it belongs to another request.

        vLLM (>= 0.32) names a request ``prefix + (X-Request-Id header or the body's request_id)`` and
        answers with that name: ``"generate-tokens-<rid>"`` in ``request_id`` of
        ``/inference/v1/generate``, ``"cmpl-<rid>"`` and ``"chatcmpl-<rid>"`` in ``id`` of the completions
        and chat answers. tito sends the rid as ``request_id`` (and no X-Request-Id), so an id of that
        form naming another rid is an answer mixed up between requests. An id of another form (a proxy,
        another server) or none is not checked: it proves nothing either way.
        """
        if not self.check_request_id or echoed is None or not echoed.startswith(prefix):
            return
        if echoed != prefix + request.rid:
            raise BackendResponseError(
                f"{self.name}: the answer is for request {echoed!r}, not {prefix + request.rid!r} (a vLLM older "
                "than 0.32 ignores the request_id sent: pass check_request_id=False for such a server)",
                field=field,
                value=echoed,
                backend=self.name,
            )

    def _decode(self, raw: bytes, view: type[_V], path: str) -> _V:
        try:
            return msgspec.json.decode(raw, type=view)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            # UnicodeDecodeError: invalid UTF-8 inside a JSON string (msgspec raises it, not a DecodeError)
            text = raw[:2000].decode("utf-8", errors="replace")
            raise BackendResponseError(
                f"{self.name}: unexpected answer from {path}: {exc}", field="body", body=text, backend=self.name
            ) from exc

    def _only_choice(self, choices: Sequence[_V], path: str) -> _V:
        if len(choices) != 1:
            raise BackendResponseError(
                f"{self.name}: {path} returned {len(choices)} choices, expected 1",
                field="choices",
                value=len(choices),
                backend=self.name,
            )
        return choices[0]

    def _output_ids(self, token_ids: list[int] | None, path: str) -> list[int]:
        if token_ids is None:
            raise BackendResponseError(
                f"{self.name}: {path} returned no token_ids (a vLLM older than 0.10.2 ignores return_token_ids)",
                field="token_ids",
                backend=self.name,
            )
        return token_ids

    def _misaligned(self, path: str, detail: str) -> BackendResponseError:
        return BackendResponseError(
            f"{self.name}: {path}: output logprobs misaligned: {detail}", field="logprobs", backend=self.name
        )

    def _check_length(self, n_logprobs: int, n_ids: int, path: str) -> None:
        if n_logprobs != n_ids:
            raise self._misaligned(path, f"{n_logprobs} logprobs for {n_ids} output tokens")

    def _check_tagged_tokens(self, tokens: Sequence[str | None], output_ids: list[int], path: str) -> None:
        """With ``return_tokens_as_token_ids`` each logprob names its token as ``token_id:N``: check it."""
        prefix = _wire.TOKEN_ID_PREFIX
        if len(tokens) != len(output_ids):
            raise self._misaligned(path, f"{len(tokens)} logprob tokens for {len(output_ids)} output tokens")
        for position, (token, token_id) in enumerate(zip(tokens, output_ids, strict=True)):
            if token is None or not token.startswith(prefix):
                return  # the server does not tag tokens with ids: the length check is all we can do
            if token[len(prefix) :] != str(token_id):
                raise self._misaligned(path, f"logprob {position} is for {token!r}, the output token is {token_id}")

    def _floats(self, values: Sequence[float | None], path: str) -> list[float]:
        if any(v is None for v in values):
            raise self._misaligned(path, "a generated token has a null logprob")
        return [v for v in values if v is not None]

    def _result(
        self,
        request: GenerateRequest,
        choice: _wire._Choice,
        output_ids: list[int],
        logprobs: list[float] | None,
        usage: _wire.Usage | None,
        prompt_ids: list[int] | None,
        prompt_logprobs: _wire.PromptLogprobs | None,
        path: str,
    ) -> GenerateResult:
        reason = choice.finish_reason or "stop"
        finish = _FINISH_REASONS.get(reason)
        if finish is None:
            raise BackendResponseError(
                f"{self.name}: {path}: generation failed on the server (finish_reason {reason!r})",
                field="finish_reason",
                value=reason,
                body=str(choice.stop_reason) if choice.stop_reason is not None else None,
                backend=self.name,
            )
        matched: str | int | None = choice.stop_reason
        if matched is None and finish == "stop" and reason == "stop" and output_ids:
            matched = output_ids[-1]  # vLLM reports EOS as stop_reason null; the EOS id is the last id
        routed: bytes | None = None
        routed_shape: tuple[int, int] | None = None
        routed_start = 0
        if request.return_routed_experts and choice.routed_experts:
            routed, shape = _wire.decode_npy_int32(choice.routed_experts, backend=self.name)
            if len(shape) != 3:
                raise BackendResponseError(
                    f"{self.name}: {path}: routed_experts has shape {shape}, not (tokens, layers, top_k)",
                    field="routed_experts",
                    value=shape,
                    backend=self.name,
                )
            routed_shape = (shape[1], shape[2])
            routed_start = request.prefix_len
        prompt_lp: list[float | None] | None = None
        if request.return_prompt_logprobs and prompt_logprobs is not None:
            prompt_lp = self._prompt_logprobs(request, prompt_ids, prompt_logprobs, path)
        cached = None
        if usage is not None and usage.prompt_tokens_details is not None:
            cached = usage.prompt_tokens_details.cached_tokens
        versions = None
        if choice.weight_versions is not None:
            versions = decode_spans(choice.weight_versions, len(output_ids), backend=self.name)
        return GenerateResult(
            output_ids=output_ids,
            output_logprobs=logprobs,
            finish_reason=finish,
            matched_stop=matched,
            prompt_ids=prompt_ids,
            prompt_logprobs=prompt_lp,
            prompt_tokens=usage.prompt_tokens if usage is not None else None,
            cached_tokens=cached,
            routed_experts=routed,
            routed_experts_start=routed_start,
            routed_experts_shape=routed_shape,
            weight_versions=versions,
        )

    def _prompt_logprobs(
        self,
        request: GenerateRequest,
        prompt_ids: list[int] | None,
        entries: _wire.PromptLogprobs,
        path: str,
    ) -> list[float | None]:
        """Logprob of each new prompt token (``input_ids[prefix_len:]``), read by token id."""
        ids: Sequence[int] = prompt_ids if prompt_ids is not None else request.input_ids
        if len(entries) != len(ids):
            raise BackendResponseError(
                f"{self.name}: {path}: {len(entries)} prompt logprobs for a {len(ids)}-token prompt",
                field="prompt_logprobs",
                value=len(entries),
                backend=self.name,
            )
        out: list[float | None] = []
        for position in range(request.prefix_len, len(ids)):
            entry = entries[position]
            item = entry.get(ids[position]) if entry is not None else None
            out.append(item.logprob if item is not None else None)
        return out


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

    def end_sequence(self, sequence: str) -> None:
        """Drop the JSON of ``sequence``'s ids (its branch ended)."""
        self._ids_json.end(sequence)

    # -- generation --------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Send the prompt ids, return the generated ids, logprobs and finish reason exactly."""
        await self._discover()
        if self.endpoint != "completions":
            try:
                return await self._generate_native(request)
            except BackendError as exc:
                if self.endpoint == "generate" or exc.status not in _ROUTE_MISSING:
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
        echoed = len(request.input_ids) if self.return_prompt_ids else 0
        limit = self._answer_limit(request, echoed_tokens=echoed)
        response = await self._post(_GENERATE_PATH, body, _wire.GenerateResponse, max_body=limit)
        self._check_echoed_id(response.request_id, "generate-tokens-", request, "request_id")
        choice = self._only_choice(response.choices, _GENERATE_PATH)
        output_ids = self._output_ids(choice.token_ids, _GENERATE_PATH)
        logprobs: list[float] | None = None
        if request.return_logprobs:
            entries = choice.logprobs.content if choice.logprobs is not None else None
            if entries is None:
                raise self._misaligned(_GENERATE_PATH, "no logprobs although they were requested")
            self._check_length(len(entries), len(output_ids), _GENERATE_PATH)
            for position, (entry, token_id) in enumerate(zip(entries, output_ids, strict=True)):
                if entry.token_id != token_id:
                    raise self._misaligned(
                        _GENERATE_PATH,
                        f"logprob {position} is for token {entry.token_id}, the output token is {token_id}",
                    )
            logprobs = [entry.logprob for entry in entries]
        return self._result(request, choice, output_ids, logprobs, response.usage, response.prompt_token_ids,
                            response.prompt_logprobs, _GENERATE_PATH)  # fmt: skip

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
        choice = self._only_choice(response.choices, _COMPLETIONS_PATH)
        output_ids = self._output_ids(choice.token_ids, _COMPLETIONS_PATH)
        logprobs: list[float] | None = None
        if request.return_logprobs:
            lp = choice.logprobs
            if lp is None or lp.token_logprobs is None:
                raise self._misaligned(_COMPLETIONS_PATH, "no logprobs although they were requested")
            self._check_length(len(lp.token_logprobs), len(output_ids), _COMPLETIONS_PATH)
            if lp.tokens is not None:
                self._check_tagged_tokens(lp.tokens, output_ids, _COMPLETIONS_PATH)
            logprobs = self._floats(lp.token_logprobs, _COMPLETIONS_PATH)
        return self._result(request, choice, output_ids, logprobs, response.usage, choice.prompt_token_ids,
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
        choice = self._only_choice(response.choices, _CHAT_PATH)
        output_ids = self._output_ids(choice.token_ids, _CHAT_PATH)
        if response.prompt_token_ids is None:
            raise BackendResponseError(
                f"{self.name}: {_CHAT_PATH} returned no prompt_token_ids", field="prompt_token_ids", backend=self.name
            )
        logprobs: list[float] | None = None
        if request.return_logprobs:
            entries = choice.logprobs.content if choice.logprobs is not None else None
            if entries is None:
                raise self._misaligned(_CHAT_PATH, "no logprobs although they were requested")
            self._check_length(len(entries), len(output_ids), _CHAT_PATH)
            self._check_tagged_tokens([e.token for e in entries], output_ids, _CHAT_PATH)
            logprobs = [e.logprob for e in entries]
        return self._result(request, choice, output_ids, logprobs, response.usage, response.prompt_token_ids,
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

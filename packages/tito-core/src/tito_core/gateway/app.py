"""The gateway's HTTP routes on aiohttp's web server.

=============================================  ================================================================
``POST /rollouts``                             open one: ``{task_id?, metadata?, id?, group?}`` → 201
                                               ``{id, token, base_url}``
``POST /rollouts/<id>/<a front's route>``      a call on the rollout, through its front (:mod:`~tito_core.gateway.
                                               fronts`: ``/v1/chat/completions``, ``/v1/responses``,
                                               ``/v1/messages`` and its ``/count_tokens``, ...): JSON, or SSE
``POST /<a front's route>``                    the same, the rollout named by its token alone
``GET /rollouts/<id>/v1/models``, ``/v1/models``  the served model
``GET /rollouts/<id>``                         the trajectory JSON (with its status)
``POST /rollouts/<id>/reward``                 ``{"value", "turn"?}``: reward one model call (default: the last) →
                                               ``{"turn", "value"}``; ``{"value", "branch"}``: one branch (its
                                               lineage's training row) → ``{"branch", "value"}``
``POST /rollouts/<id>/finish``                 ``{"reward"?, "turn_rewards"?, "metadata"?, "ended"?}`` → the record,
                                               written to the output; ``ended`` (``{"timed_out_s"}`` or
                                               ``{"error"}``): how the agent ended, which closes it as the runner
                                               closes its own
``GET /ui/``                                   the viewer (:mod:`~tito_core.gateway.ui`): open and finished
                                               rollouts, read-only; its data routes take the viewer key
=============================================  ================================================================

The app routes by the front objects the gateway serves (``Gateway.fronts``) and knows none by name. A front's
routes answer errors in its own shape (:meth:`~tito_core.gateway.fronts.Front.error`), the others in OpenAI's
(:mod:`~tito_core.gateway.errors`); bodies are bounded (413). Every route of a rollout takes its token
(``Authorization: Bearer <token>``, ``x-api-key``, or a header its front names), which ``POST /rollouts`` returns;
with an api key, opening a rollout takes the key (which every rollout's routes take too). A web page is refused (a
foreign ``Host``, an ``Origin`` not allowed, a POST that is not JSON: 403 / 415), and no CORS header is sent.
A 404 or 409 says ``x-should-retry: false``: the OpenAI SDKs would otherwise retry a 409 that cannot succeed.
A rollout id is one path segment, percent-quoted in URLs (``base_url`` quotes it); the routes match it unquoted.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import msgspec
from aiohttp import web

from ..errors import LineageLabelError
from ..records import RolloutRecord
from ..records.schema import ENCODER
from ..rollout_core.labels import LABEL_HEADER, Label, parse_label
from ..status import AgentFailed, Outcome, RolloutTimedOut
from ..viewer import viewer_app
from . import sse
from .access import Access
from .errors import GatewayError, bad_request, bounded_depth, error_body, too_deep
from .fronts import Front, Route
from .registry import GatewayRollout
from .ui import GatewaySource

__all__ = ["Served", "build_app"]


class Served(Protocol):
    """What the routes need of a :class:`~tito_core.gateway.Gateway` (the service imports this module)."""

    access: Access
    model_name: str
    max_body_bytes: int
    fronts: Sequence[Front]

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

    async def call(
        self,
        rollout_id: str,
        front: Front,
        body: Any,
        route: Route | None = None,
        path: dict[str, str] | None = None,
        label: Label | None = None,
    ) -> tuple[Any, bool]:
        """Answer a call through ``front``, labelled ``label``: its answer (data or events), whether it streams."""

    async def count(
        self, rollout_id: str, front: Front, body: Any, route: Route | None = None, path: dict[str, str] | None = None
    ) -> Any:
        """Answer a ``count`` route of ``front``."""

    def reward(self, rollout_id: str, value: Any, turn: Any = None, branch: Any = None) -> int:
        """Reward one model call of a rollout (or one branch); returns its turn index (or the branch number)."""

    async def finish(
        self,
        rollout_id: str,
        reward: float | None = None,
        metadata: dict[str, Any] | None = None,
        turn_rewards: Any = None,
        ended: Outcome | None = None,
    ) -> RolloutRecord:
        """End a rollout (closed as ``ended`` says, when given) and write its record."""


_GATEWAY: web.AppKey[Served] = web.AppKey("gateway")
_FRONTS: web.AppKey[dict[Any, Front]] = web.AppKey("fronts")  # each front's aiohttp routes: its errors' shape
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def _json(data: Any, status: int = 200) -> web.Response:
    # msgspec, not the json module: ~20x faster on a completion's ids, ~2x on a long request (benchmarks/gateway.py)
    return web.Response(body=_ENCODER.encode(data), status=status, content_type="application/json")


def _error(error: GatewayError, front: Front | None) -> web.Response:
    response = _json(front.error(error) if front is not None else error_body(error), error.status)
    # an unknown, finished or busy rollout, a gateway shutting down: retrying the same request cannot help
    if error.status in (404, 409) or error.code == "shutting_down":
        response.headers["x-should-retry"] = "false"
    return response


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _credential(request: web.Request, front: Front | None = None) -> str | None:
    """The request's key or token: ``Authorization: Bearer X``, else ``x-api-key: X``, else a front's own header.

    Anthropic's clients send ``x-api-key``; a front names more (Gemini's ``x-goog-api-key``).
    """
    found = _bearer(request) or request.headers.get("x-api-key")
    for header in front.key_headers if front is not None and not found else ():
        found = request.headers.get(header)
        if found:
            break
    return found or None


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await _checked(request, handler)
    except GatewayError as exc:
        return _error(exc, request.app[_FRONTS].get(request.match_info.route))


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


def _label(request: web.Request) -> Label | None:
    """The call's lineage label (``X-Tito-Lineage``), checked: a 400 ``invalid_lineage_label`` names the header."""
    try:
        return parse_label(request.headers.get(LABEL_HEADER))
    except LineageLabelError as exc:
        raise GatewayError(400, str(exc), param=LABEL_HEADER, code="invalid_lineage_label") from None


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


def _front_handler(front: Front, route: Route) -> _Handler:
    """The handler of one route of ``front``: the rollout in the path or named by the token, the call, the answer."""

    async def handle(request: web.Request) -> web.StreamResponse:
        gateway = request.app[_GATEWAY]
        credential = _credential(request, front)
        path = {k: v for k, v in request.match_info.items() if k != "rollout"}
        if "rollout" in request.match_info:
            rollout_id = request.match_info["rollout"]
            gateway.authorize(rollout_id, credential)
        else:
            rollout_id = gateway.access.rollout_of(credential)
        if route.kind == "count":
            return _json(await gateway.count(rollout_id, front, await _body(request), route, path))
        gateway.get(rollout_id)  # 404 / 409 before reading a large body
        label = _label(request)
        answer, stream = await gateway.call(rollout_id, front, await _body(request), route, path, label)
        if not stream:
            return _json(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for event in sse.encode(answer):
            await response.write(event)
        await response.write_eof()
        return response

    return handle


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
    body = _fields(await _body(request, optional=True), frozenset({"reward", "turn_rewards", "metadata", "ended"}))
    reward = body.get("reward")
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
    ):
        raise bad_request("reward", f"must be a finite number, got {reward!r}")
    turn_rewards = body.get("turn_rewards")
    if turn_rewards is not None and not isinstance(turn_rewards, list):
        raise bad_request("turn_rewards", f"must be a list (one reward per model call), got {turn_rewards!r}")
    record = await gateway.finish(
        request.match_info["rollout"],
        None if reward is None else float(reward),
        body.get("metadata"),
        turn_rewards,
        _ended(body.get("ended")),
    )
    return web.Response(body=ENCODER.encode(record), content_type="application/json")


MAX_ENDED_ERROR = 16 << 10
"""The longest ``ended.error`` a finish takes (characters): an agent's error, with its standard error's tail."""


def _ended(value: Any) -> Outcome | None:
    """How the rollout's agent ended, from ``finish``'s ``ended``: its time limit ran out, or it failed."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) != 1 or not {"timed_out_s", "error"} & value.keys():
        raise bad_request("ended", 'must be {"timed_out_s": SECONDS} or {"error": "why the agent failed"}')
    seconds, error = value.get("timed_out_s"), value.get("error")
    if "timed_out_s" in value:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
            raise bad_request("ended.timed_out_s", f"must be a positive number of seconds, got {seconds!r}")
        return RolloutTimedOut(float(seconds))
    if not isinstance(error, str) or not error.strip() or len(error) > MAX_ENDED_ERROR:
        shown = repr(error)[:80]
        raise bad_request("ended.error", f"must be a non-empty string of at most {MAX_ENDED_ERROR} characters: {shown}")
    return AgentFailed(error)


async def _reward(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    gateway.authorize(request.match_info["rollout"], _credential(request))
    body = _fields(await _body(request), frozenset({"value", "turn", "branch"}))
    if "value" not in body:
        raise bad_request("value", "is required: the reward of the call")
    if "branch" in body:
        if "turn" in body:
            raise bad_request("branch", "give a turn or a branch, not both: a branch's reward is its whole lineage's")
        branch = gateway.reward(request.match_info["rollout"], body["value"], branch=body["branch"])
        return _json({"branch": branch, "value": float(body["value"])})
    turn = gateway.reward(request.match_info["rollout"], body["value"], body.get("turn"))
    return _json({"turn": turn, "value": float(body["value"])})


def build_app(gateway: Served) -> web.Application:
    """The aiohttp application serving ``gateway`` and its fronts."""
    app = web.Application(client_max_size=gateway.max_body_bytes, middlewares=[_errors])
    app[_GATEWAY] = gateway
    owners: dict[Any, Front] = {}
    app.router.add_post("/rollouts", _open)
    for front in gateway.fronts:
        for route in front.routes:
            handler = _front_handler(front, route)
            for prefix in ("/rollouts/{rollout}", ""):  # a rollout by its path, or by its token alone
                owners[app.router.add_post(prefix + route.path, handler)] = front
    app[_FRONTS] = owners
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

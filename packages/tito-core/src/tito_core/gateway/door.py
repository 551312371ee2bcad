"""The front address of ``tito serve --workers N``: ``POST /rollouts`` only, handed to a worker.

The door picks a worker (round robin over the live ones; by a hash of the id when the client names the rollout's
``id``, so that the worker holding that id refuses a second one with a 409, as one gateway does), passes the
request on to that worker's ``POST /rollouts`` (its body, with an ``id`` the door makes when the client named none,
and its credential, nothing else) and returns the worker's answer as it is: ``{id, token, base_url}``, with the
worker's own address in ``base_url``. A worker that dies with the request sent to it: once the supervisor has read
its journal, a rollout the journal never opened is opened on the next worker (the client sees one ``201``); one it
opened has its record written ``failed`` and the client gets a 502 naming it. Every later request of
the rollout goes to that worker directly: no router sits in the call path. The door applies the gateway's browser
rules (Host, Origin, JSON only) and, with an api key, checks it before passing anything on; the worker checks it
again. Any other route is a 404 naming ``base_url``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp
import msgspec
from aiohttp import web

from .access import Access
from .errors import GatewayError, error_body
from .registry import Registry

__all__ = ["Doorway", "door_app"]

MAX_OPEN_BODY = 1 << 20
"""The largest ``POST /rollouts`` body the door takes (a task id, metadata)."""
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


class Doorway(Protocol):
    """What the door needs of the supervisor."""

    access: Access
    closing: bool

    def worker_urls(self, rollout_id: str | None = None) -> list[str]:
        """The base URLs of the live workers, in the order to try them (a given rollout id: always the same)."""

    def session(self) -> aiohttp.ClientSession:
        """The client session the door talks to the workers with."""

    async def never_opened(self, base_url: str, rollout_id: str) -> bool:
        """Whether the worker at ``base_url`` ended without a trace of ``rollout_id`` (it may be opened elsewhere)."""


_POOL: web.AppKey[Doorway] = web.AppKey("pool")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(error: GatewayError) -> web.Response:
    response = web.Response(
        body=_ENCODER.encode(error_body(error)), status=error.status, content_type="application/json"
    )
    if error.status in (404, 409) or error.code == "shutting_down":
        response.headers["x-should-retry"] = "false"
    return response


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        pool = request.app[_POOL]
        headers = request.headers
        host, origin = headers.get("Host", ""), headers.get("Origin")
        pool.access.check_browser_rules(host, origin, request.method, request.content_type)
        return await handler(request)
    except GatewayError as exc:
        return _error(exc)
    except web.HTTPRequestEntityTooLarge:
        message = "the request body is larger than the door's limit (1 MiB)"
        return _error(GatewayError(413, message, code="body_too_large"))
    except web.HTTPException as exc:
        if exc.status == 404 or exc.status == 405:
            message = (f"no route {request.method} {request.path[:200]} here: this address only opens rollouts "
                       "(POST /rollouts); a rollout's calls go to the base_url it answered (its worker)")  # fmt: skip
            return _error(GatewayError(404, message, code="no_such_route"))
        raise


async def _open(request: web.Request) -> web.StreamResponse:
    pool = request.app[_POOL]
    if pool.closing:
        raise GatewayError(503, "the gateway is shutting down: it takes no new rollouts", code="shutting_down")
    credential = request.headers.get("Authorization")
    key = request.headers.get("x-api-key")
    if pool.access.api_key is not None:
        scheme, _, token = (credential or "").partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" else ""
        pool.access.authorize_opening(bearer or key)
    body = await request.read()
    wanted = _wanted_id(body)
    rollout_id, body = (wanted, body) if wanted is not None else _named(body)
    headers = {"Content-Type": "application/json"}
    if credential is not None:
        headers["Authorization"] = credential
    if key is not None:
        headers["x-api-key"] = key
    for url in pool.worker_urls(wanted):
        try:
            async with pool.session().post(f"{url}/rollouts", data=body, headers=headers) as answer:
                data = await answer.read()
                return web.Response(body=data, status=answer.status, content_type="application/json")
        except aiohttp.ClientConnectorError:
            continue  # the worker is gone (the request never reached it): the next one
        except aiohttp.ClientError as exc:  # it may have opened the rollout: its journal says
            if rollout_id is not None and await pool.never_opened(url, rollout_id):
                continue  # it died before opening it: nothing of the rollout exists, the next worker opens it
            if rollout_id is not None:
                message = (
                    f"the worker went away while opening rollout {rollout_id!r} ({type(exc).__name__}): if it had "
                    "opened it, its record is written failed ('gateway worker lost'); open another"
                )
            else:
                message = f"the worker went away while opening the rollout ({type(exc).__name__}): open another"
            raise GatewayError(502, message, code="worker_lost") from None
    raise GatewayError(503, "no gateway worker is serving", code="no_worker")


def _wanted_id(body: bytes) -> str | None:
    """The rollout id the client asked for, if any: one id goes to one worker, which refuses it twice (409)."""
    try:
        data = _DECODER.decode(body) if body else None
    except (msgspec.DecodeError, RecursionError):
        return None  # the worker answers the 400
    wanted = data.get("id") if isinstance(data, dict) else None
    return wanted if isinstance(wanted, str) else None


def _named(body: bytes) -> tuple[str | None, bytes]:
    """The body with a fresh rollout ``id`` added, and that id; a body that is not a JSON object goes as it is."""
    try:
        data = _DECODER.decode(body) if body.strip() else {}
    except (msgspec.DecodeError, RecursionError):
        return None, body
    if not isinstance(data, dict) or "id" in data:
        return None, body
    rollout_id = Registry.new_id()
    return rollout_id, _ENCODER.encode({**data, "id": rollout_id})


def door_app(pool: Doorway) -> web.Application:
    """The door's aiohttp application."""
    app = web.Application(client_max_size=MAX_OPEN_BODY, middlewares=[_errors])
    app[_POOL] = pool
    app.router.add_post("/rollouts", _open)
    return app

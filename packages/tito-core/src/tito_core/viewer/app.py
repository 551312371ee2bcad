"""The viewer's web app: one static page (its script and style ship in the package) and a read-only JSON API.

Routes, under any prefix (``tito view`` serves them at ``/``, ``tito serve`` at ``/ui``):

* ``GET /``: the page; ``GET /static/{name}``: its script and style (no CDN: it works offline);
* ``GET /api/runs``: the runs page's data; ``GET /api/records/{key}``: one record, token by token;
* ``GET /images/{key}/{sha256}``: an image of a record; ``GET /figures/{n}``: a PNG shown on the runs page.

Every answer forbids framing and sniffing and allows scripts, styles and images from the server itself only.
Only GET and HEAD exist. :func:`viewer_app` takes the browser rules of the server it runs in: ``tito view``
checks ``Host`` and ``Origin`` itself (:func:`browser_rules`), the gateway's own checks cover ``/ui``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from .source import Source

__all__ = ["browser_rules", "viewer_app"]

STATIC = Path(__file__).resolve().parent / "static"
_SOURCE: web.AppKey[Source] = web.AppKey("viewer_source", Source)
_AUTHORIZE: web.AppKey[Any] = web.AppKey("viewer_authorize", object)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def browser_rules(hosts: frozenset[str]) -> Callable[[web.Request], str | None]:
    """The checks of a viewer on its own server: a ``Host`` in ``hosts`` (no DNS rebinding), no foreign ``Origin``.

    Returns a function giving the reason to refuse a request, or None.
    """

    def refuse(request: web.Request) -> str | None:
        host = request.headers.get("Host", "").lower()
        if host not in hosts:
            return f"Host {host[:100]!r} is not this viewer's address"
        origin = request.headers.get("Origin")
        if origin is not None and origin.lower() != f"http://{host}":
            return f"requests from other web pages are refused (Origin {origin[:100]!r})"
        return None

    return refuse


def _json(data: Any) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), content_type="application/json")


def _guarded(request: web.Request) -> None:
    """Refuse the data routes without the server's credential (a gateway with a key: ``Authorization: Bearer``)."""
    authorize = request.app[_AUTHORIZE]
    if authorize is not None:
        header = request.headers.get("Authorization", "")
        authorize(header[7:] if header.startswith("Bearer ") else None)


async def _page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Content-Type": "text/html; charset=utf-8"})


async def _static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in _TYPES or not path.is_file():
        raise web.HTTPNotFound()
    return web.FileResponse(path, headers={"Content-Type": f"{_TYPES[path.suffix]}; charset=utf-8"})


async def _runs(request: web.Request) -> web.StreamResponse:
    _guarded(request)
    return _json(request.app[_SOURCE].runs())


async def _record(request: web.Request) -> web.StreamResponse:
    _guarded(request)
    try:
        return _json(request.app[_SOURCE].record(request.match_info["key"]))
    except KeyError:
        raise web.HTTPNotFound(text="no such record") from None


async def _image(request: web.Request) -> web.StreamResponse:
    _guarded(request)
    try:
        data, content_type = request.app[_SOURCE].image(request.match_info["key"], request.match_info["sha"])
    except KeyError:
        raise web.HTTPNotFound(text="no such image") from None
    return web.Response(body=data, content_type=content_type)


async def _figure(request: web.Request) -> web.StreamResponse:
    _guarded(request)
    try:
        path = request.app[_SOURCE].figure(int(request.match_info["n"]))
    except (IndexError, ValueError):
        raise web.HTTPNotFound(text="no such figure") from None
    return web.FileResponse(path, headers={"Content-Type": "image/png"})


def viewer_app(
    source: Source,
    *,
    refuse: Callable[[web.Request], str | None] | None = None,
    authorize: Callable[[str | None], None] | None = None,
) -> web.Application:
    """The viewer of ``source``.

    Args:
        source: What to show.
        refuse: Gives the reason to refuse a request (:func:`browser_rules`), or None to serve it.
        authorize: Checks the bearer credential of a data route (raises to refuse); None: no credential.
    """

    @web.middleware
    async def headers(request: web.Request, handler: _Handler) -> web.StreamResponse:
        reason = refuse(request) if refuse is not None else None
        if reason is not None:
            raise web.HTTPForbidden(text=reason, headers=HEADERS)
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a 404 too: never framed, never sniffed
            exc.headers.update(HEADERS)
            raise
        response.headers.update(HEADERS)
        return response

    app = web.Application(middlewares=[headers])
    app[_SOURCE] = source
    app[_AUTHORIZE] = authorize
    app.router.add_get("/", _page)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/api/runs", _runs)
    app.router.add_get("/api/records/{key}", _record)
    app.router.add_get("/images/{key}/{sha}", _image)
    app.router.add_get("/figures/{n}", _figure)
    return app

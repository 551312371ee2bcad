"""The transport seam: what a transport is and how it reports a failed exchange.

A transport sends one HTTP request to an engine and reads one whole, bounded answer.
:class:`tito_core.http.HttpClient` decides what to retry and which tito error to raise; a transport only
moves bytes and says, with its own exceptions, how far a failed exchange got:

=========================== ====================================================================
:class:`NotSentError`       nothing reached the server (refused, DNS, connect timeout, TLS handshake,
                            proxy refused the tunnel): safe to send again.
:class:`MaybeSentError`     the connection failed after (part of) the request was written: the engine
                            may be running it; never sent again.
:class:`TransportTimeout`   no complete answer within the time allowed.
:class:`FramingError`       the answer is not valid HTTP/1.1 (conflicting or negative
                            ``Content-Length``, garbage status line, bad chunking).
:class:`BodyTooLargeError`  the answer's body is larger than ``max_body``; it was not read whole.
=========================== ====================================================================

Two implementations ship (:mod:`tito_core.http.errors` maps their libraries' exceptions onto the ones
above):

* :class:`~tito_core.http.aiohttp_transport.AiohttpTransport` (the default): an ``aiohttp`` session per
  event loop, keep-alive connections, aiohttp's strict C (llhttp) parser, and a connection that holds *any*
  bytes after a response is closed instead of reused (see ``tito_core.http._aiohttp``).
* :class:`~tito_core.http.httpx_transport.HttpxTransport`: a user's ``httpx.AsyncClient`` or ``httpx``
  transport (proxies, mounts, HTTP/2, ``httpx.MockTransport`` in tests).

Neither re-sends a request: aiohttp retries a request on a reused connection only for idempotent
methods (GET), never for the POST of a generation; httpx/httpcore never retries a request once written.
Any other object with the :class:`Transport` methods can be given to :class:`~tito_core.http.HttpClient`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Protocol

__all__ = [
    "BodyTooLargeError",
    "FramingError",
    "MaybeSentError",
    "NotSentError",
    "Response",
    "Transport",
    "TransportError",
    "TransportTimeout",
    "Verify",
]

Verify = bool | str | ssl.SSLContext
"""TLS verification: True (the system's trust store), False (none), a CA bundle path, or an SSL context."""


# -- results and errors --------------------------------------------------------------------------


class Response:
    """Status, headers (names lower-cased; repeated headers joined with ``", "``) and the whole body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def __repr__(self) -> str:
        return f"Response({self.status}, {len(self.body)} bytes)"


class TransportError(Exception):
    """A request failed below HTTP semantics; the subclass says how far it got."""


class NotSentError(TransportError):
    """No byte of the request reached the server: sending it again cannot run it twice."""


class MaybeSentError(TransportError):
    """The connection failed once (part of) the request was written: the server may be running it."""


class TransportTimeout(TransportError):
    """No complete answer within the time allowed."""


class FramingError(TransportError):
    """The answer violates HTTP/1.1 framing; the connection was closed."""


class BodyTooLargeError(TransportError):
    """The answer's body exceeds ``limit`` bytes; reading stopped there and the connection was closed."""

    def __init__(self, message: str, *, limit: int, size: int | None) -> None:
        self.limit = limit
        self.size = size
        super().__init__(message)


class Transport(Protocol):
    """Sends one request and reads its whole answer, for use from one event loop.

    ``path`` is appended to the server root; ``timeout`` bounds the whole exchange (None: no bound);
    ``max_body`` bounds the answer's body (None: no bound). Failures are :class:`TransportError` subclasses;
    cancellation closes the connection the request was on.
    """

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None,
        max_body: int | None,
    ) -> Response:
        """Send one request and return its whole answer."""
        ...

    async def aclose(self) -> None:
        """Close every connection."""
        ...

    def abandon(self) -> None:
        """Let go of the connections of an event loop that is closed (nothing can be awaited): no warnings."""
        ...


def too_large(limit: int, size: int | None) -> BodyTooLargeError:
    """The error of an answer whose body passed ``limit`` bytes (``size`` when the header said it)."""
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return BodyTooLargeError(f"answer body is {what}, the limit is {limit}", limit=limit, size=size)


def ssl_context(verify: Verify) -> ssl.SSLContext | bool:
    """``verify`` as aiohttp takes it: a context for a CA bundle path, else as given."""
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return verify

"""The transport seam: send one HTTP request to an engine, read one whole, bounded answer.

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

Two implementations:

* :class:`AiohttpTransport` (the default): an ``aiohttp`` session per event loop, keep-alive
  connections, aiohttp's strict C (llhttp) parser, and a connection that holds *any* bytes after a
  response is closed instead of reused (see :class:`_StrictResponseHandler`).
* :class:`HttpxTransport`: a user's ``httpx.AsyncClient`` or ``httpx`` transport (proxies, mounts, HTTP/2,
  ``httpx.MockTransport`` in tests).

Neither re-sends a request: aiohttp retries a request on a reused connection only for idempotent
methods (GET), never for the POST of a generation; httpx/httpcore never retries a request once written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    import aiohttp
    import httpx

__all__ = [
    "AiohttpTransport",
    "BodyTooLargeError",
    "FramingError",
    "HttpxTransport",
    "MaybeSentError",
    "NotSentError",
    "Response",
    "Transport",
    "TransportError",
    "TransportTimeout",
    "Verify",
]

logger = logging.getLogger(__name__)

Verify = bool | str | ssl.SSLContext
"""TLS verification: True (the system's trust store), False (none), a CA bundle path, or an SSL context."""

_READ_CHUNK: Final = 256 * 1024


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


def _too_large(limit: int, size: int | None) -> BodyTooLargeError:
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return BodyTooLargeError(f"answer body is {what}, the limit is {limit}", limit=limit, size=size)


def ssl_context(verify: Verify) -> ssl.SSLContext | bool:
    """``verify`` as aiohttp takes it: a context for a CA bundle path, else as given."""
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return verify


# -- aiohttp -------------------------------------------------------------------------------------


def _strict_handler_class() -> type[Any]:
    """``aiohttp``'s ``ResponseHandler`` made to refuse reuse of a connection with bytes left over.

    Why: aiohttp's connector decides whether an idle pooled connection may carry the next request with
    ``protocol.is_connected()`` only (transport open). Bytes the server sends after a complete response
    are parsed on arrival: a whole forged response then sits in the handler's message queue and is
    handed to the *next* request as its answer. ``should_close`` already reports that state (a queued
    message, an unfinished body, a parse error, bytes held back) and aiohttp consults it when a
    response is released, which catches bytes arriving in the same packet as the response; it is not
    consulted again when the idle connection is taken from the pool. So the subclass answers "not
    connected" whenever ``should_close`` is true, and also once bytes arrived while no request was
    waiting for them (a partial message would otherwise sit in the old parser; aiohttp makes a new
    parser per request and drops it, but the contract is simpler: any stray byte, no reuse).
    """
    from aiohttp.client_proto import ResponseHandler

    class _StrictResponseHandler(ResponseHandler):
        _tito_waiting = False  # a request was sent on this connection and its answer is not complete
        _tito_stray = False  # bytes arrived that no request was waiting for

        def set_response_params(self, **kwargs: Any) -> None:
            self._tito_waiting = True
            super().set_response_params(**kwargs)

        def data_received(self, data: bytes) -> None:
            if data and not self._tito_waiting:
                self._tito_stray = True
            super().data_received(data)
            payload = self._payload
            if self._tito_waiting and payload is not None and payload.is_eof():
                self._tito_waiting = False  # the answer is complete: anything after it is stray

        def is_connected(self) -> bool:
            return bool(super().is_connected() and not self._tito_stray and not self.should_close)

    return _StrictResponseHandler


_STRICT_HANDLER: type[Any] | None = None
_warned_no_factory = False


def _install_strict_handler(connector: aiohttp.TCPConnector) -> None:
    """Make ``connector`` build :func:`_strict_handler_class` protocols (``connector._factory``).

    ``_factory`` is private to aiohttp (the protocol factory handed to ``loop.create_connection``; present
    and unchanged in the 3.10-3.14 range pinned by tito-core). Should a future aiohttp drop it, tito logs
    once and relies on the request-id checks of the adapters; ``tests/core/test_transport.py`` fails
    then, so the regression is seen before release.
    """
    global _STRICT_HANDLER, _warned_no_factory
    factory = getattr(connector, "_factory", None)
    loop = getattr(factory, "keywords", {}).get("loop") or getattr(connector, "_loop", None)
    if factory is None or loop is None:
        if not _warned_no_factory:
            _warned_no_factory = True
            logger.warning(
                "aiohttp %s has no TCPConnector._factory: connections with bytes left over after a "
                "response cannot be refused reuse; relying on request-id checks",
                _aiohttp_version(),
            )
        return
    if _STRICT_HANDLER is None:
        _STRICT_HANDLER = _strict_handler_class()
    handler = _STRICT_HANDLER

    def make() -> Any:
        return handler(loop)

    connector._factory = make  # type: ignore[assignment]


def _aiohttp_version() -> str:
    import aiohttp

    return aiohttp.__version__


class AiohttpTransport:
    """tito's default transport: one ``aiohttp`` session (made on first use) for the current event loop.

    Args:
        base_url: Server root (``http://host:port``).
        headers: Headers sent with every request (API keys, ...).
        max_connections: Connections open at once; more requests wait for a free one.
        connect_timeout: Seconds to open one connection (TLS handshake included); pool waits not counted.
        verify: TLS verification for ``https`` (see :data:`Verify`).
        trust_env: Honour ``HTTP(S)_PROXY`` / ``NO_PROXY`` like curl does (read when the session is made,
            on the first request of each event loop).
        keepalive_timeout: Seconds an idle connection is kept (below uvicorn's 5 s keep-alive, so the
            server rarely closes a connection as tito picks it up).

    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 1024,
        connect_timeout: float | None = 5.0,
        verify: Verify = True,
        trust_env: bool = True,
        keepalive_timeout: float = 4.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.verify = verify
        self.trust_env = trust_env
        self.keepalive_timeout = keepalive_timeout
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, Any] = {}

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            ssl=ssl_context(self.verify),
            keepalive_timeout=self.keepalive_timeout,
        )
        _install_strict_handler(connector)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            # sock_connect bounds opening a connection; waiting for a free pooled one is bounded by the
            # request's own timeout (``connect`` would count the wait as a connect failure)
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            # The proxy is looked up once here, not by aiohttp's trust_env on every request (which reads
            # the environment per request: ~0.5 ms each, measured).
            proxy=_env_proxy(self.base_url) if self.trust_env else None,
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # no state carried from one answer to the next request
            auto_decompress=False,  # no compression is asked for; a compressed body is never inflated
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )
        return self._session

    def _url(self, path: str) -> Any:
        url = self._urls.get(path)
        if url is None:
            from yarl import URL

            url = self._urls[path] = URL(self.base_url + path)
        return url

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
        """Send one request, read its whole answer (see :class:`Transport`)."""
        import aiohttp

        session = self._session or self._open()
        try:
            async with asyncio.timeout(timeout):
                try:
                    async with session.request(
                        method, self._url(path), data=body, headers=headers, allow_redirects=False
                    ) as answer:
                        return await _read_aiohttp(answer, max_body)
                except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                    raise NotSentError(f"cannot connect to {self.base_url}: {exc}") from exc
                except aiohttp.ClientHttpProxyError as exc:  # the proxy refused the tunnel
                    raise NotSentError(f"proxy refused the connection to {self.base_url}: {exc}") from exc
                except aiohttp.ClientResponseError as exc:  # the head did not parse
                    raise FramingError(f"malformed answer: {exc.message}") from exc
                except aiohttp.ClientPayloadError as exc:
                    if "not completed" in str(exc):  # the connection ended inside the body
                        raise MaybeSentError(f"answer cut short: {exc}") from exc
                    raise FramingError(f"malformed answer body: {exc}") from exc
                except aiohttp.ServerTimeoutError as exc:
                    raise TransportTimeout(str(exc)) from exc
                except (aiohttp.ClientConnectionError, OSError) as exc:
                    raise MaybeSentError(f"connection lost: {exc!r}") from exc
                except aiohttp.ClientError as exc:  # anything else: assume the worst, never re-sent
                    raise MaybeSentError(f"{type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:  # asyncio.timeout's (the library's own are mapped above)
            raise TransportTimeout(f"no complete answer within {timeout} s") from exc

    async def aclose(self) -> None:
        """Close the session and its connections."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def abandon(self) -> None:
        """Mark the session of a closed loop closed, so that it is collected without "Unclosed" warnings.

        Its sockets cannot be closed through a closed loop; the garbage collector closes them.
        """
        session, self._session = self._session, None
        connector = session.connector if session is not None else None
        close_now = getattr(connector, "_close", None)  # aiohttp's synchronous part of close(); private
        if callable(close_now):
            with contextlib.suppress(Exception):
                close_now()


async def _read_aiohttp(answer: aiohttp.ClientResponse, max_body: int | None) -> Response:
    headers = _joined(answer.raw_headers)
    size = answer.content_length
    if max_body is not None and size is not None and size > max_body:
        answer.close()  # the body stays unread: the connection must not be reused
        raise _too_large(max_body, size)
    if size is not None or max_body is None:
        body = await answer.read()  # the parser enforces Content-Length exactly
    else:  # chunked or delimited by the close: read with a running limit
        parts = bytearray()
        async for chunk in answer.content.iter_chunked(_READ_CHUNK):
            parts += chunk
            if len(parts) > max_body:
                answer.close()
                raise _too_large(max_body, None)
        body = bytes(parts)
    return Response(answer.status, headers, body)


def _env_proxy(base_url: str) -> str | None:
    """The proxy ``HTTP_PROXY`` / ``HTTPS_PROXY`` name for ``base_url``, None when none or ``NO_PROXY`` says so."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.netloc):
        return None
    return proxy


def _joined(raw: tuple[tuple[bytes, bytes], ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


# -- httpx ---------------------------------------------------------------------------------------


class HttpxTransport:
    """Requests through ``httpx``: a user's ``AsyncClient`` (left open), or one made over a user's transport.

    Args:
        base_url: Server root.
        client: An ``httpx.AsyncClient`` to send through; tito never closes it.
        transport: An ``httpx.AsyncBaseTransport`` (``AsyncHTTPTransport(proxy=...)``, ``MockTransport``,
            ...) for a client this object makes and closes.
        headers: Headers sent with every request (added to the client's own).
        connect_timeout: Seconds to open one connection.
        verify: TLS verification, for the client made here (see :data:`Verify`).
        trust_env: Honour proxy environment variables, for the client made here.

    """

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float | None = 5.0,
        verify: Verify = True,
        trust_env: bool = True,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self._owned = client is None
        if client is None:
            client = httpx.AsyncClient(
                transport=transport,
                verify=verify,
                trust_env=trust_env,
                timeout=httpx.Timeout(None, connect=connect_timeout),
                follow_redirects=False,
            )
        self.client = client

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
        """Send one request, read its whole answer (see :class:`Transport`)."""
        import httpx

        all_headers = {**self.headers, **(headers or {})}
        try:
            async with asyncio.timeout(timeout):
                try:
                    async with self.client.stream(
                        method, self.base_url + path, content=body, headers=all_headers
                    ) as answer:
                        return await _read_httpx(answer, max_body)
                except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError) as exc:
                    raise NotSentError(f"cannot connect to {self.base_url}: {exc}") from exc
                except httpx.TimeoutException as exc:
                    raise TransportTimeout(f"{type(exc).__name__}: {exc}") from exc
                except httpx.RemoteProtocolError as exc:
                    text = str(exc).lower()
                    if "disconnect" in text or "incomplete" in text or "closed" in text:
                        raise MaybeSentError(f"connection lost: {exc}") from exc
                    raise FramingError(f"malformed answer: {exc}") from exc
                except (httpx.ReadError, httpx.WriteError, httpx.CloseError, httpx.NetworkError) as exc:
                    raise MaybeSentError(f"connection lost: {exc!r}") from exc
                except httpx.DecodingError as exc:
                    raise FramingError(f"malformed answer body: {exc}") from exc
                except httpx.TransportError as exc:
                    raise MaybeSentError(f"{type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:  # asyncio.timeout's (the library's own are mapped above)
            raise TransportTimeout(f"no complete answer within {timeout} s") from exc

    async def aclose(self) -> None:
        """Close the client made here (a client passed in is the caller's to close)."""
        if self._owned:
            await self.client.aclose()

    def abandon(self) -> None:
        """Nothing to do: httpx warns about nothing left open."""


async def _read_httpx(answer: httpx.Response, max_body: int | None) -> Response:
    length = answer.headers.get("content-length")
    if max_body is not None and length is not None and length.isdigit() and int(length) > max_body:
        raise _too_large(max_body, int(length))
    parts = bytearray()
    async for chunk in answer.aiter_bytes():
        parts += chunk
        if max_body is not None and len(parts) > max_body:
            raise _too_large(max_body, None)
    headers = {k.lower(): v for k, v in answer.headers.multi_items()}
    if len(headers) != len(answer.headers.multi_items()):
        headers = {k: ", ".join(answer.headers.get_list(k)) for k in headers}
    return Response(answer.status_code, headers, bytes(parts))

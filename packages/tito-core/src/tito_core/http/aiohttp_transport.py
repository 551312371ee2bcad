"""tito's default transport: ``aiohttp``, one session per event loop, answers read whole and bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from tito_core.http._aiohttp import close_connector_now, install_strict_handler
from tito_core.http.errors import from_aiohttp
from tito_core.http.transport import Response, TransportTimeout, Verify, ssl_context, too_large

if TYPE_CHECKING:
    import aiohttp

__all__ = ["AiohttpTransport"]

_READ_CHUNK: Final = 256 * 1024


class AiohttpTransport:
    """tito's default transport: one ``aiohttp`` session (made on first use) for the current event loop.

    Args:
        base_url: Server root (``http://host:port``).
        headers: Headers sent with every request (API keys, ...).
        max_connections: Connections open at once; more requests wait for a free one.
        connect_timeout: Seconds to open one connection (TLS handshake included); pool waits not counted.
        verify: TLS verification for ``https`` (see :data:`~tito_core.http.transport.Verify`).
        trust_env: Honour ``HTTP(S)_PROXY`` / ``NO_PROXY`` like curl does (read when the session is made,
            on the first request of each event loop).
        keepalive_timeout: Seconds an idle connection is kept: 2, well below uvicorn's 5 s keep-alive (SGLang's
            and vLLM's servers). The server counts idleness from when it sent the answer, tito from when it read
            it: on a starved machine that gap passed the old 1 s margin (4 s), the server closed a connection as
            tito sent a generation on it, and the call failed "maybe sent" (it is never sent again).

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
        keepalive_timeout: float = 2.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.verify = verify
        self.trust_env = trust_env
        self.keepalive_timeout = keepalive_timeout
        self._session: aiohttp.ClientSession | None = None
        self._proxy: str | None = None
        self._urls: dict[str, Any] = {}

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            ssl=ssl_context(self.verify),
            keepalive_timeout=self.keepalive_timeout,
        )
        install_strict_handler(connector)
        # The proxy is looked up once here, not by aiohttp's trust_env on every request (which reads the
        # environment per request: ~0.5 ms each, measured). It is passed with each request: ClientSession
        # takes a default proxy= only from aiohttp 3.11 on, and tito allows 3.10.
        self._proxy = _env_proxy(self.base_url) if self.trust_env else None
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            # sock_connect bounds opening a connection; waiting for a free pooled one is bounded by the
            # request's own timeout (``connect`` would count the wait as a connect failure)
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
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
        """Send one request, read its whole answer (see :class:`~tito_core.http.transport.Transport`)."""
        import aiohttp

        session = self._session or self._open()
        try:
            async with asyncio.timeout(timeout):
                try:
                    async with session.request(
                        method, self._url(path), data=body, headers=headers, proxy=self._proxy, allow_redirects=False
                    ) as answer:
                        return await _read_aiohttp(answer, max_body)
                except (aiohttp.ClientError, OSError) as exc:
                    raise from_aiohttp(exc, self.base_url) from exc
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
        close_connector_now(session.connector if session is not None else None)


async def _read_aiohttp(answer: aiohttp.ClientResponse, max_body: int | None) -> Response:
    headers = _joined(answer.raw_headers)
    size = answer.content_length
    if max_body is not None and size is not None and size > max_body:
        answer.close()  # the body stays unread: the connection must not be reused
        raise too_large(max_body, size)
    if size is not None or max_body is None:
        body = await answer.read()  # the parser enforces Content-Length exactly
    else:  # chunked or delimited by the close: read with a running limit
        parts = bytearray()
        async for chunk in answer.content.iter_chunked(_READ_CHUNK):
            parts += chunk
            if len(parts) > max_body:
                answer.close()
                raise too_large(max_body, None)
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

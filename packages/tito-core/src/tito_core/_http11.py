"""A lean keep-alive HTTP/1.1 connection pool on asyncio streams: tito's default way to reach an engine.

A rollout makes one request per model call, to one server, with a body tito already encoded; what it
needs from an HTTP stack is a warm connection and nothing else in the way. ``httpx.AsyncClient`` over
httpcore costs about 1 ms per request on the 2-core benchmark machine (URL merging, cookie and header
models, the anyio stream layers, h11) and more under concurrency; this pool writes the request head in
one call and parses the response head with plain string operations (see ``docs/performance.md``).

Scope: ``http`` and ``https`` origins, requests with a bytes body (or none), responses framed by
``Content-Length``, ``Transfer-Encoding: chunked`` or the end of the connection; 1xx answers skipped.
Anything else (proxies, HTTP/2, streaming) goes through an ``httpx`` transport passed to
:class:`tito_core.http.HttpClient`.

Failures are raised as ``httpx`` exceptions, so :class:`~tito_core.http.HttpClient` maps both paths the
same way: ``ConnectError`` / ``ConnectTimeout`` when no connection could be made (the request never left),
``RemoteProtocolError`` / ``ReadError`` / ``WriteError`` once it may have reached the server.

A pooled connection the server closed while it sat idle is noticed before reuse (the stream is at EOF)
and discarded; connections idle longer than ``idle_timeout`` (below uvicorn's 5 s keep-alive) are not
reused. If a reused connection still ends before a single byte of the answer arrives (the server closed
it at the moment the request was written), the request is sent once more on a fresh connection: the
server had closed the connection as idle, so it never started the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from typing import Final
from urllib.parse import urlsplit

import httpx

__all__ = ["ConnectionPool", "RawResponse", "check_base_url"]

_MAX_HEAD_BYTES: Final = 256 * 1024
_READ_CHUNK: Final = 256 * 1024
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def check_base_url(base_url: str) -> None:
    """Raise ``ValueError`` unless ``base_url`` is an ``http://`` or ``https://`` URL with a host."""
    parts = urlsplit(base_url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"bad port in server URL {base_url!r}: {exc}") from None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// server URL with a host, got {base_url!r}")


class RawResponse:
    """Status, headers (names lower-cased) and the whole body of one answer."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def reusable(self, now: float, idle_timeout: float) -> bool:
        return (
            not self.reader.at_eof()
            and not self.writer.is_closing()
            and self.reader.exception() is None
            and now - self.idle_since < idle_timeout
        )

    def close(self) -> None:
        self.writer.close()


class _StaleConnection(Exception):
    """A reused connection ended before the first byte of the answer."""


class ConnectionPool:
    """Keep-alive connections to one origin, for use from one event loop.

    Args:
        base_url: ``http://host:port`` or ``https://host:port`` (a path prefix is prepended to every path).
        headers: Headers sent with every request (``Host``, ``Content-Length`` and ``Connection`` are
            written by the pool).
        max_connections: Requests in flight at once; more wait for a free slot.
        connect_timeout: Seconds to open a connection (TLS handshake included).
        idle_timeout: A connection idle this long is closed instead of reused.
        ssl_context: TLS settings for ``https`` (the system's default verification when None).

    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        max_connections: int = 1024,
        connect_timeout: float = 5.0,
        idle_timeout: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        check_base_url(base_url)
        parts = urlsplit(base_url)
        assert parts.hostname is not None
        self.host = parts.hostname
        self.port = parts.port or _DEFAULT_PORTS[parts.scheme]
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self._prefix = parts.path.rstrip("/")
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        lines = [f"Host: {host_header}"]
        for name, value in (headers or {}).items():
            if name.lower() in ("host", "content-length", "connection", "transfer-encoding"):
                continue
            if any(c in f"{name}{value}" for c in "\r\n"):
                raise ValueError(f"header {name!r} contains a line break")
            lines.append(f"{name}: {value}")
        self._head_tail = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: deque[_Connection] = deque()
        self._open: set[_Connection] = set()

    async def request(self, method: str, path: str, body: bytes | None = None) -> RawResponse:
        """Send one request and read its whole answer."""
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1") + self._head_tail
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head += b"Content-Length: %d\r\n" % len(body or b"")
        data = head + b"\r\n" + (body or b"")
        async with self._slots:
            connection = self._take_idle()
            if connection is not None:
                try:
                    return await self._exchange(connection, data, method, reused=True)
                except _StaleConnection:
                    pass  # closed by the server as idle: it never saw the request; send it once more
            return await self._exchange(await self._connect(), data, method, reused=False)

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()  # most recently used first: the likeliest to be alive
            if connection.reusable(now, self.idle_timeout):
                return connection
            self._discard(connection)
        return None

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                    limit=_MAX_HEAD_BYTES,
                )
        except TimeoutError as exc:
            where = f"{self.host}:{self.port}"
            raise httpx.ConnectTimeout(f"no connection to {where} within {self.connect_timeout} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        connection = _Connection(reader, writer)
        self._open.add(connection)
        return connection

    async def _exchange(self, connection: _Connection, data: bytes, method: str, *, reused: bool) -> RawResponse:
        keep = False
        try:
            response, keep = await self._write_and_read(connection, data, method, reused=reused)
            return response
        finally:
            # Any failure or cancellation leaves the connection in an unknown state: never reuse it.
            if keep:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
            else:
                self._discard(connection)

    async def _write_and_read(
        self, connection: _Connection, data: bytes, method: str, *, reused: bool
    ) -> tuple[RawResponse, bool]:
        reader, writer = connection.reader, connection.writer
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError) as exc:
            if reused:
                raise _StaleConnection from exc
            raise httpx.WriteError(f"sending the request failed: {exc}") from exc
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    if reused and not exc.partial:
                        raise _StaleConnection from exc
                    raise httpx.RemoteProtocolError("server closed the connection before answering") from exc
                except ConnectionResetError as exc:
                    if reused:
                        raise _StaleConnection from exc
                    raise
                status, headers, keep_alive = _parse_head(raw)
                if status >= 200 or status == 101:
                    break
                reused = False  # an interim 1xx answer: the server has the request
            content, framed = await _read_body(reader, status, headers, method)
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError(f"response head larger than {_MAX_HEAD_BYTES} bytes") from exc
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError("server closed the connection in the middle of the answer") from exc
        except (ConnectionError, OSError) as exc:
            raise httpx.ReadError(f"reading the answer failed: {exc}") from exc
        return RawResponse(status, headers, content), keep_alive and framed

    def _discard(self, connection: _Connection) -> None:
        self._open.discard(connection)
        connection.close()

    async def aclose(self) -> None:
        """Close every connection."""
        connections, self._open = self._open, set()
        self._idle.clear()
        for connection in connections:
            connection.close()
        for connection in connections:
            with contextlib.suppress(ConnectionError, OSError):  # the peer may be gone already
                await connection.writer.wait_closed()


def _parse_head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    """Status, lower-cased headers and whether the connection stays open, from a response head."""
    lines = raw.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if status_line[0] == "HTTP/1.1" else "keep-alive" in connection
    return int(status_line[1]), headers, keep_alive


async def _read_body(
    reader: asyncio.StreamReader, status: int, headers: dict[str, str], method: str
) -> tuple[bytes, bool]:
    """The body and whether its end was framed (so the connection can carry another request)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return b"", True
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader), True
    length = headers.get("content-length")
    if length is not None:
        try:
            size = int(length.split(",")[0])
        except ValueError as exc:
            raise httpx.RemoteProtocolError(f"bad Content-Length {length!r}") from exc
        return await reader.readexactly(size), True
    return await reader.read(-1), False  # delimited by the end of the connection


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise httpx.RemoteProtocolError(f"bad chunk size line {line[:40]!r}") from exc
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise httpx.RemoteProtocolError("chunk not followed by CRLF")

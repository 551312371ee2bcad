"""An experiment, not product code: an ``httpx`` transport written directly on asyncio streams.

The benchmark's ``tito-asyncio`` client passes it to ``SGLangBackend(transport=...)`` to measure how much
of tito's per-call time is httpcore's (connection pool, anyio streams, h11), which grows with the number
of concurrent requests. HTTP/1.1 with keep-alive, ``Content-Length`` bodies only (what the fake server
sends); one event loop. A product version would also need chunked bodies, stale-connection retries and
per-loop pools (see docs/performance.md).
"""

from __future__ import annotations

import asyncio

import httpx

__all__ = ["AsyncioTransport"]


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer


class AsyncioTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over ``asyncio.open_connection``; one idle pool per (host, port)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._all: set[_Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request, read one ``Content-Length`` response."""
        host, port = request.url.host, request.url.port or 80
        idle = self._idle.setdefault((host, port), [])
        if idle:
            connection = idle.pop()
        else:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError as exc:
                raise httpx.ConnectError(str(exc), request=request) from exc
            connection = _Connection(reader, writer)
            self._all.add(connection)
        body = request.content
        head = [f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1", f"Host: {host}:{port}"]
        head.extend(
            f"{name}: {value}"
            for name, value in request.headers.items()
            if name.lower() not in ("host", "content-length", "transfer-encoding", "connection")
        )
        head.append(f"Content-Length: {len(body)}")
        try:
            connection.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            raw = await connection.reader.readuntil(b"\r\n\r\n")
            lines = raw[:-4].decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers: list[tuple[str, str]] = []
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers.append((name, value.strip()))
                if name.lower() == "content-length":
                    length = int(value)
            content = await connection.reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self._drop(connection)
            raise httpx.ReadError(str(exc), request=request) from exc
        except BaseException:  # cancelled mid-request: the connection is in an unknown state
            self._drop(connection)
            raise
        idle.append(connection)
        return httpx.Response(status, headers=headers, content=content, request=request)

    def _drop(self, connection: _Connection) -> None:
        self._all.discard(connection)
        connection.writer.close()

    async def aclose(self) -> None:
        """Close every connection."""
        for connection in list(self._all):
            self._drop(connection)
        self._idle.clear()

"""Every library message text tito classifies by, pinned: httpx's against the installed library over a real local
socket (aiohttp's is in ``test_aiohttp_compat.py``; each engine's context-window texts are in its adapter's tests).

A library upgrade that changes one of them fails here instead of silently misclassifying (a lost connection taken
for a malformed answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from tito_core.http.errors import LIBRARY_TEXTS, from_httpx
from tito_core.http.transport import FramingError, MaybeSentError

# -- httpx ---------------------------------------------------------------------------------------


@asynccontextmanager
async def answering(*parts: bytes) -> AsyncIterator[str]:
    """A raw TCP server on 127.0.0.1 that reads one request's head, sends ``parts`` a moment apart, closes."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            for index, part in enumerate(parts):
                if index:
                    await asyncio.sleep(0.02)
                writer.write(part)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def _httpx_error(*parts: bytes) -> httpx.HTTPError:
    async with answering(*parts) as url, httpx.AsyncClient() as client:
        with pytest.raises(httpx.HTTPError) as info:
            await client.get(url + "/g")
    return info.value


CUT_SHORT = {
    "Server disconnected": [(), (b"HTTP/1.1 200 OK\r\nContent-Le",)],  # before the answer, inside its head
    "peer closed connection without sending complete message body": [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b'{"output_ids": [1, 2'),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n", b'{"output_ids"'),
    ],
}


@pytest.mark.parametrize("text", sorted(CUT_SHORT))
async def test_each_httpx_cut_short_text_is_what_httpx_says(text: str) -> None:
    for parts in CUT_SHORT[text]:
        exc = await _httpx_error(*parts)
        assert isinstance(exc, httpx.RemoteProtocolError)
        assert text in str(exc)
        assert isinstance(from_httpx(exc, "http://x"), MaybeSentError)


def test_h11_text_for_a_head_cut_short_is_in_the_table() -> None:
    """h11's own wording, which httpcore (over HTTP/1.1) reports as "Server disconnected" instead: pinned on h11."""
    import h11

    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(b"HTTP/1.1 200 OK\r\nContent-Le")
    conn.receive_data(b"")
    with pytest.raises(h11.RemoteProtocolError) as info:
        conn.next_event()
    assert "peer unexpectedly closed connection" in LIBRARY_TEXTS["httpx.RemoteProtocolError"]
    assert "peer unexpectedly closed connection" in str(info.value)
    wrapped = httpx.RemoteProtocolError(str(info.value))
    assert isinstance(from_httpx(wrapped, "http://x"), MaybeSentError)


def test_every_httpx_text_is_pinned() -> None:
    assert set(LIBRARY_TEXTS["httpx.RemoteProtocolError"]) == {*CUT_SHORT, "peer unexpectedly closed connection"}


@pytest.mark.parametrize(
    "reply",
    [b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok", b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello"],
)
async def test_an_httpx_malformed_answer_says_none_of_them(reply: bytes) -> None:
    exc = await _httpx_error(reply)
    assert isinstance(exc, httpx.RemoteProtocolError)
    assert isinstance(from_httpx(exc, "http://x"), FramingError), str(exc)

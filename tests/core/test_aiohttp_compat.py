"""Each aiohttp private name in ``tito_core.http._aiohttp``, and aiohttp's one message text tito reads, against
the installed aiohttp (``nox -s aiohttp_compat`` runs this file on the oldest and the newest aiohttp allowed).

An aiohttp release that renames one of them fails here first, instead of tito silently degrading (a pooled
connection with stray bytes reused, a dead loop's session warned about, a cut-short body taken for a
malformed one).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest

from tito_core.http import _aiohttp as compat
from tito_core.http.aiohttp_transport import AiohttpTransport
from tito_core.http.errors import LIBRARY_TEXTS, from_aiohttp
from tito_core.http.transport import FramingError, MaybeSentError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """A raw TCP server on 127.0.0.1 whose every connection runs ``handler``; yields its URL."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
    return await reader.readexactly(length)


def replying(*parts: bytes) -> Handler:
    """Answers one request with ``parts``, a moment apart (each its own packet), then closes the connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for index, part in enumerate(parts):
            if index:
                await asyncio.sleep(0.02)
            writer.write(part)
            await writer.drain()

    return handler


# -- the private names ---------------------------------------------------------------------------


async def test_connector_factory_is_a_partial_holding_the_loop() -> None:
    """``TCPConnector._factory`` (replaced by tito) and the loop it is made with."""
    connector = aiohttp.TCPConnector()
    try:
        factory = connector._factory
        assert isinstance(factory, functools.partial)
        assert factory.keywords.get("loop") is asyncio.get_running_loop()
        assert connector._loop is asyncio.get_running_loop()
        compat.install_strict_handler(connector)
        assert type(connector._factory()).__name__ == "_StrictResponseHandler"
    finally:
        await connector.close()


async def test_response_handler_has_what_the_strict_handler_overrides() -> None:
    """``aiohttp.client_proto.ResponseHandler``: the methods overridden, ``should_close``, ``_payload``."""
    from aiohttp.client_proto import ResponseHandler

    handler = compat.strict_handler_class()(asyncio.get_running_loop())
    assert isinstance(handler, ResponseHandler)
    for name in ("set_response_params", "data_received", "is_connected"):
        assert callable(getattr(ResponseHandler, name))
    assert handler._payload is None and handler.should_close is False


@pytest.mark.parametrize("extra", [b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nFORGED", b"x"], ids=["whole", "byte"])
async def test_stray_bytes_on_an_idle_connection_refuse_its_reuse(extra: bytes) -> None:
    """The strict handler at work: it reads ``_payload`` to know when an answer is complete."""
    connections = 0
    stray_sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        index = connections
        while True:
            body = await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            if index == 1:
                await asyncio.sleep(0.02)
                writer.write(extra)
                await writer.drain()
                stray_sent.set()

    async with serving(handler) as url:
        transport = AiohttpTransport(url, trust_env=False)
        first = await transport.request("POST", "/g", b"1", timeout=5, max_body=None)
        await asyncio.wait_for(stray_sent.wait(), 60)  # a hang guard only
        # the stray bytes reach the pooled connection (waited for, not slept on: a busy machine may take long)
        pooled = [proto for conns in transport._session.connector._conns.values() for proto, _ in conns]  # type: ignore[union-attr]
        deadline = asyncio.get_running_loop().time() + 60
        while any(getattr(proto, "_tito_stray", False) is False for proto in pooled):
            assert asyncio.get_running_loop().time() < deadline, "the stray bytes never reached the client"
            await asyncio.sleep(0.005)
        second = await transport.request("POST", "/g", b"2", timeout=5, max_body=None)
        await transport.aclose()
    assert (first.body, second.body) == (b"1", b"2")
    assert connections == 2


async def test_connector_close_now_marks_it_closed_without_awaiting() -> None:
    """``BaseConnector._close()``: the synchronous part of ``close()``."""
    connector = aiohttp.TCPConnector()
    assert callable(connector._close)
    compat.close_connector_now(connector)
    assert connector.closed


# -- the message text ----------------------------------------------------------------------------


async def _payload_error(*parts: bytes) -> aiohttp.ClientPayloadError:
    async with (
        serving(replying(*parts)) as url,
        aiohttp.ClientSession() as session,
        session.post(url + "/g", data=b"x") as answer,
    ):
        with pytest.raises(aiohttp.ClientPayloadError) as info:
            await answer.read()
    return info.value


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"output_ids": [1, 2',
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + b'{"output_ids"',
    ],
    ids=["content-length", "chunked"],
)
async def test_a_body_cut_short_says_not_completed(reply: bytes) -> None:
    """``LIBRARY_TEXTS["aiohttp.ClientPayloadError"]``: the connection ended inside the body."""
    exc = await _payload_error(reply)
    (text,) = LIBRARY_TEXTS["aiohttp.ClientPayloadError"]
    assert text in str(exc)
    assert isinstance(from_aiohttp(exc, "http://x"), MaybeSentError)


async def test_a_body_error_of_another_kind_does_not_say_not_completed() -> None:
    """A whole body that cannot be decoded (tito's sessions never decompress: aiohttp's default session here)."""
    exc = await _payload_error(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello")
    assert not any(text in str(exc) for text in LIBRARY_TEXTS["aiohttp.ClientPayloadError"])
    assert isinstance(from_aiohttp(exc, "http://x"), FramingError)

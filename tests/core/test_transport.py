"""The shipping transport (aiohttp) through HttpClient against real sockets: framing, reuse, faults.

Every server here is a raw asyncio TCP server on 127.0.0.1 whose script decides byte for byte what the
client gets, so faults that a real engine, proxy or load balancer can produce are reproduced exactly.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import tito_core.http.client as client_mod
from tito_core.errors import (
    BackendConnectionError,
    BackendError,
    BackendResponseError,
    BackendTimeoutError,
    ResponseTooLargeError,
)
from tito_core.http import HttpClient, RetryPolicy
from tito_core.http import _aiohttp as aiohttp_compat
from tito_core.http.aiohttp_transport import AiohttpTransport
from tito_core.http.transport import BodyTooLargeError, FramingError, MaybeSentError, NotSentError

Script = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Request:
    def __init__(self, line: str, headers: dict[str, str], body: bytes) -> None:
        self.line = line
        self.headers = headers
        self.body = body


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """One request from the client, or None when it closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    line, *rest = head[:-4].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(line, headers, body)


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


class RawServer:
    """An asyncio TCP server whose every connection runs ``script(server, reader, writer, index)``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[Request] = []
        self.url = ""

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            await self.script(self, reader, writer, index)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def recv(self, reader: asyncio.StreamReader) -> Request | None:
        request = await read_request(reader)
        if request is not None:
            self.requests.append(request)
        return request

    def bodies(self) -> list[bytes]:
        return [r.body for r in self.requests]


@asynccontextmanager
async def serving(script: Script, *, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[RawServer]:
    raw = RawServer(script)
    server = await asyncio.start_server(raw._on_connection, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    raw.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    try:
        yield raw
    finally:
        server.close()


async def echo(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
    """Answers every request on the connection with its body, keeping the connection open."""
    while (request := await raw.recv(reader)) is not None:
        writer.write(answer(request.body or b"empty"))
        await writer.drain()


def replying(reply: bytes) -> Script:
    """Answers every request on the connection with the same raw bytes, keeping the connection open."""

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while await raw.recv(reader) is not None:
            writer.write(reply)
            await writer.drain()

    return script


def client_for(url: str, **kwargs: object) -> HttpClient:
    options: dict[str, object] = {"retry": RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=0.0)}
    options.update(kwargs)
    return HttpClient(url, backend_name="fake", **options)  # type: ignore[arg-type]


class Aborts:
    def __init__(self) -> None:
        self.count = 0

    async def __call__(self) -> None:
        self.count += 1


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    slept: list[float] = []

    async def fake_sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(client_mod, "_sleep", fake_sleep)
    yield slept


# -- the ordinary path ---------------------------------------------------------------------------


async def test_keep_alive_reuses_one_connection_and_sends_body_and_headers() -> None:
    async with serving(echo) as raw:
        client = client_for(raw.url, headers={"x-key": "k"})
        for i in range(3):
            assert await client.post("/generate", b'{"i": %d}' % i) == b'{"i": %d}' % i
        assert await client.get("/health") == b"empty"
        await client.aclose()
    assert raw.connections == 1
    assert [r.line for r in raw.requests] == [*["POST /generate HTTP/1.1"] * 3, "GET /health HTTP/1.1"]
    first = raw.requests[0].headers
    assert first["host"] == raw.url.removeprefix("http://")
    assert (first["content-type"], first["x-key"], first["content-length"]) == ("application/json", "k", "8")
    assert "accept-encoding" not in first  # nothing compressed is asked for


async def test_large_bodies_both_ways() -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB
    async with serving(echo) as raw:
        client = client_for(raw.url)
        assert await client.post("/big", payload) == payload
        await client.aclose()


async def test_chunked_answer_with_trailers_keeps_the_connection() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    async with serving(replying(chunked)) as raw:
        client = client_for(raw.url)
        assert await client.post("/x", b"{}") == b"hello 0123456789"
        assert await client.post("/x", b"{}") == b"hello 0123456789"
        await client.aclose()
    assert raw.connections == 1


async def test_answer_delimited_by_close_is_read_whole_and_not_reused() -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async with serving(script) as raw:
        client = client_for(raw.url)
        assert await client.get("/a") == b"until the end"
        assert await client.get("/a") == b"until the end"
        await client.aclose()
    assert raw.connections == 2


async def test_max_connections_bounds_requests_in_flight() -> None:
    in_flight = peak = 0
    pair = asyncio.Event()

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        nonlocal in_flight, peak
        while await raw.recv(reader) is not None:
            in_flight += 1
            peak = max(peak, in_flight)
            if in_flight == 2:
                pair.set()
            await pair.wait()  # the first request is held until a second one is in flight, however slow
            await asyncio.sleep(0.02)
            in_flight -= 1
            writer.write(answer(b"ok"))

    async with serving(script) as raw:
        client = client_for(raw.url, max_connections=2)
        results = await asyncio.gather(*(client.post("/a", b"x") for _ in range(7)))
        await client.aclose()
    assert results == [b"ok"] * 7
    assert peak == 2 and raw.connections == 2


# -- (a) an answer never belongs to another request ---------------------------------------------------

FORGED = answer(b'{"forged": true}')


async def test_forged_answer_in_the_same_packet_is_never_delivered() -> None:
    """A second, complete response right after the real one: the connection is closed, not reused."""

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while (request := await raw.recv(reader)) is not None:
            writer.write(answer(request.body) + FORGED)
            await writer.drain()

    async with serving(script) as raw:
        client = client_for(raw.url)
        assert await client.post("/g", b"1") == b"1"
        assert await client.post("/g", b"2") == b"2"
        await client.aclose()
    assert raw.connections == 2  # the first connection was dropped for its leftover bytes
    assert raw.bodies() == [b"1", b"2"]


@pytest.mark.parametrize("extra", [FORGED, FORGED[:20], b"x"], ids=["complete", "partial-head", "one-byte"])
async def test_bytes_arriving_while_idle_are_never_delivered(extra: bytes) -> None:
    """Bytes sent a little after the answer, while the connection sits idle in the pool."""
    sent_extra = asyncio.Event()

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while (request := await raw.recv(reader)) is not None:
            writer.write(answer(request.body))
            await writer.drain()
            if index == 0:
                await asyncio.sleep(0.02)
                writer.write(extra)
                await writer.drain()
                sent_extra.set()

    async with serving(script) as raw:
        client = client_for(raw.url)
        assert await client.post("/g", b"1") == b"1"
        await sent_extra.wait()
        # the bytes reach the idle pooled connection (waited for, not slept on: a busy machine may take long)
        connector = client._transport()._session.connector  # type: ignore[attr-defined]
        deadline = asyncio.get_running_loop().time() + 60
        while not any(
            getattr(proto, "_tito_stray", False) for conns in connector._conns.values() for proto, _ in conns
        ):
            assert asyncio.get_running_loop().time() < deadline, "the stray bytes never reached the client"
            await asyncio.sleep(0.005)
        assert await client.post("/g", b"2") == b"2"
        assert await client.post("/g", b"3") == b"3"
        await client.aclose()
    assert raw.connections == 2
    assert raw.bodies() == [b"1", b"2", b"3"]


def test_strict_protocol_is_installed_on_the_shipping_connector() -> None:
    """Fails loudly if an aiohttp upgrade removes the hook (then only request-id checks remain)."""

    async def main() -> None:
        transport = AiohttpTransport("http://127.0.0.1:9")
        session = transport._open()
        factory = session.connector._factory  # type: ignore[union-attr]
        proto = factory()
        assert type(proto).__name__ == "_StrictResponseHandler"
        await transport.aclose()

    asyncio.run(main())


def test_missing_factory_is_logged_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    class Bare:
        pass

    monkeypatch.setattr(aiohttp_compat, "_warned_no_factory", False)
    with caplog.at_level(logging.WARNING):
        aiohttp_compat.install_strict_handler(Bare())  # type: ignore[arg-type]
        aiohttp_compat.install_strict_handler(Bare())  # type: ignore[arg-type]
    assert caplog.text.count("request-id checks") == 1


# -- (b) framing violations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\nhello",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ],
    ids=[
        "conflicting-cl",
        "negative-cl",
        "text-cl",
        "garbage-status",
        "bad-status",
        "bad-header",
        "bad-chunk",
        "te-and-cl",
    ],
)
async def test_framing_violations_are_typed_and_close_the_connection(reply: bytes) -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while await raw.recv(reader) is not None:
            writer.write(reply if index == 0 else answer(b"fine"))
            await writer.drain()

    aborts = Aborts()
    async with serving(script) as raw:
        client = client_for(raw.url)
        with pytest.raises(BackendResponseError) as info:
            await client.post("/g", b"1", abort=aborts)
        assert info.value.field == "http"
        assert not isinstance(info.value, ResponseTooLargeError)
        assert await client.post("/g", b"2") == b"fine"  # on a new connection
        await client.aclose()
    assert raw.connections == 2
    assert raw.bodies() == [b"1", b"2"]  # never re-sent
    assert aborts.count == 1


async def test_framing_violation_at_transport_level_is_framing_error() -> None:
    async with serving(replying(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n")) as raw:
        transport = AiohttpTransport(raw.url)
        with pytest.raises(FramingError):
            await transport.request("GET", "/", None, timeout=5, max_body=None)
        await transport.aclose()


# -- (c) a POST that may have reached the engine is never sent again --------------------------------------


@pytest.mark.parametrize("reused", [False, True], ids=["fresh", "reused"])
@pytest.mark.parametrize("delay", [0.0, 0.05], ids=["at-once", "later"])
@pytest.mark.parametrize("how", ["close", "reset"])
async def test_drop_after_reading_the_request_is_not_resent(reused: bool, delay: float, how: str) -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        if reused:  # answer one request properly, so the faulty exchange runs on a reused connection
            request = await raw.recv(reader)
            assert request is not None
            writer.write(answer(b"warm"))
            await writer.drain()
        await raw.recv(reader)
        await asyncio.sleep(delay)
        if how == "reset":
            writer.transport.abort()
        else:
            writer.close()

    aborts = Aborts()
    async with serving(script) as raw:
        client = client_for(raw.url, retry=RetryPolicy(max_attempts=5, initial_delay=0.0))
        if reused:
            assert await client.post("/g", b"warm") == b"warm"
        with pytest.raises(BackendConnectionError, match="not retried"):
            await client.post("/g", b"gen", abort=aborts)
        await client.aclose()
    assert raw.bodies().count(b"gen") == 1  # the server saw the generation exactly once
    assert raw.connections == 1
    assert aborts.count == 1


@pytest.mark.parametrize("cut", [b'{"output_ids": [1, 2', b""], ids=["mid-json", "after-head"])
async def test_body_cut_short_is_a_connection_error_not_resent(cut: bytes) -> None:
    """(e) The server announces 100 bytes and dies after a few."""

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + cut)
        await writer.drain()

    aborts = Aborts()
    async with serving(script) as raw:
        client = client_for(raw.url)
        with pytest.raises(BackendConnectionError):
            await client.post("/g", b"gen", abort=aborts)
        await client.aclose()
    assert raw.bodies() == [b"gen"] and aborts.count == 1


async def test_chunked_body_cut_short_is_a_connection_error() -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{"output_ids"')
        await writer.drain()

    async with serving(script) as raw:
        client = client_for(raw.url)
        with pytest.raises(BackendConnectionError):
            await client.post("/g", b"gen")
        await client.aclose()
    assert raw.bodies() == [b"gen"]


async def test_transport_reports_maybe_sent() -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.transport.abort()

    async with serving(script) as raw:
        transport = AiohttpTransport(raw.url)
        with pytest.raises(MaybeSentError):
            await transport.request("POST", "/g", b"x", timeout=5, max_body=None)
        await transport.aclose()


async def test_read_timeout_aborts_and_is_not_resent() -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        await asyncio.sleep(5)

    aborts = Aborts()
    async with serving(script) as raw:
        client = client_for(raw.url, timeout=0.1)
        with pytest.raises(BackendTimeoutError):
            await client.post("/g", b"gen", abort=aborts)
        await client.aclose()
    assert raw.bodies() == [b"gen"] and aborts.count == 1


async def test_cancelled_request_aborts_and_discards_its_connection() -> None:
    gate = asyncio.Event()

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while await raw.recv(reader) is not None:
            if index == 0:
                gate.set()
                await asyncio.sleep(30)
            writer.write(answer(b"ok"))

    aborts = Aborts()
    async with serving(script) as raw:
        client = client_for(raw.url)
        task = asyncio.create_task(client.post("/a", b"1", abort=aborts))
        await gate.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await client.post("/a", b"2") == b"ok"
        await client.aclose()
    assert raw.connections == 2 and aborts.count == 1


# -- (d) refused: retried, then a connection error -------------------------------------------------------


async def test_refused_is_retried_per_policy_then_connection_error(no_sleep: list[float]) -> None:
    async with serving(echo) as raw:
        url = raw.url
    aborts = Aborts()
    client = client_for(url, retry=RetryPolicy(max_attempts=3, initial_delay=0.01, jitter=0.0))
    with pytest.raises(BackendConnectionError, match="cannot connect"):
        await client.post("/g", b"x", abort=aborts)
    assert len(no_sleep) == 2  # three attempts
    assert aborts.count == 0  # nothing was sent: nothing to abort
    await client.aclose()


async def test_refused_at_transport_level_is_not_sent() -> None:
    async with serving(echo) as raw:
        url = raw.url
    transport = AiohttpTransport(url)
    with pytest.raises(NotSentError):
        await transport.request("POST", "/g", b"x", timeout=5, max_body=None)
    await transport.aclose()


async def test_server_back_after_refusals_gets_the_same_body_once(no_sleep: list[float]) -> None:
    async with serving(echo) as raw:
        port = raw.url.rsplit(":", 1)[1]
    calls = 0
    started: list[RawServer] = []

    async def fake_sleep(delay: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the server comes back before the third attempt
            raw2 = RawServer(echo)
            server = await asyncio.start_server(raw2._on_connection, "127.0.0.1", int(port))
            raw2.url = server  # type: ignore[assignment]
            started.append(raw2)

    client_mod._sleep = fake_sleep  # restored by the no_sleep fixture's monkeypatch
    client = client_for(f"http://127.0.0.1:{port}", retry=RetryPolicy(max_attempts=4, initial_delay=0.0))
    assert await client.post("/g", b'{"rid": "r1"}') == b'{"rid": "r1"}'
    await client.aclose()
    assert started[0].bodies() == [b'{"rid": "r1"}']
    started[0].url.close()  # type: ignore[attr-defined]


# -- (f) oversized bodies ---------------------------------------------------------------------------


async def test_oversized_body_by_content_length_is_refused_unread() -> None:
    huge = 50 * 1024 * 1024
    sent = 0

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        nonlocal sent
        await raw.recv(reader)
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {huge}\r\n\r\n".encode())
        chunk = b"x" * 65536
        try:
            for _ in range(huge // len(chunk)):
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
        except ConnectionError:
            pass

    aborts = Aborts()
    async with serving(script) as raw:
        client = client_for(raw.url)
        with pytest.raises(ResponseTooLargeError) as info:
            await client.post("/g", b"x", max_body=1024 * 1024, abort=aborts)
        await client.aclose()
        await asyncio.sleep(0.05)
    assert info.value.field == "body" and info.value.value == huge
    assert sent < huge  # the client hung up instead of reading it all
    assert aborts.count == 1


async def test_oversized_chunked_body_stops_at_the_limit() -> None:
    received = 0

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        nonlocal received
        await raw.recv(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"y" * 65536)
        try:
            for _ in range(800):  # 50 MiB if read whole
                writer.write(chunk)
                await writer.drain()
                received += 65536
        except ConnectionError:
            pass

    async with serving(script) as raw:
        transport = AiohttpTransport(raw.url)
        with pytest.raises(BodyTooLargeError):
            await transport.request("POST", "/g", b"x", timeout=10, max_body=512 * 1024)
        await transport.aclose()
        await asyncio.sleep(0.05)
    assert received < 800 * 65536


async def test_body_at_the_limit_is_accepted() -> None:
    async with serving(replying(answer(b"z" * 1000))) as raw:
        client = client_for(raw.url)
        assert await client.post("/g", b"x", max_body=1000) == b"z" * 1000
        with pytest.raises(ResponseTooLargeError):
            await client.post("/g", b"x", max_body=999)
        await client.aclose()


# -- statuses through real sockets ------------------------------------------------------------------


async def test_503_with_retry_after_is_retried_with_the_same_body(no_sleep: list[float]) -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while (request := await raw.recv(reader)) is not None:
            if len(raw.requests) < 3:
                writer.write(answer(b"busy", "503 Service Unavailable", "Retry-After: 1\r\n"))
            else:
                writer.write(answer(request.body))
            await writer.drain()

    async with serving(script) as raw:
        client = client_for(raw.url, retry=RetryPolicy(max_attempts=4, initial_delay=0.01, jitter=0.0))
        assert await client.post("/g", b'{"rid": "same"}') == b'{"rid": "same"}'
        await client.aclose()
    assert raw.bodies() == [b'{"rid": "same"}'] * 3
    assert no_sleep == [1.0, 1.0]


async def test_500_is_not_retried() -> None:
    async with serving(replying(answer(b"boom", "500 Internal Server Error"))) as raw:
        client = client_for(raw.url)
        with pytest.raises(BackendError) as info:
            await client.post("/g", b"x")
        await client.aclose()
    assert info.value.status == 500 and len(raw.requests) == 1


# -- TLS and proxies ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_https_verify_options(self_signed: tuple[Path, Path], no_sleep: list[float]) -> None:
    cert, key = self_signed
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    async with serving(echo, ssl_context=server_context) as raw:
        for verify in (str(cert), ssl.create_default_context(cafile=str(cert)), False):
            client = client_for(raw.url, verify=verify)
            assert await client.post("/a", b"secret") == b"secret"
            await client.aclose()
        untrusting = client_for(raw.url, retry=RetryPolicy(max_attempts=1))
        with pytest.raises(BackendConnectionError, match=r"(?i)certificate"):
            await untrusting.get("/a")
        await untrusting.aclose()
    assert raw.connections == 3  # the refused handshake never carried a request
    assert raw.bodies() == [b"secret"] * 3


async def test_proxy_environment_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY sends the request to the proxy (absolute URI); trust_env=False ignores it."""

    async def proxy(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while await raw.recv(reader) is not None:
            writer.write(answer(b"via proxy"))
            await writer.drain()

    async with serving(echo) as origin, serving(proxy) as px:
        monkeypatch.setenv("HTTP_PROXY", px.url)
        monkeypatch.setenv("http_proxy", px.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        client = client_for(origin.url)
        assert await client.post("/g", b"direct?") == b"via proxy"
        await client.aclose()
        direct = client_for(origin.url, trust_env=False)
        assert await direct.post("/g", b"direct") == b"direct"
        await direct.aclose()
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        bypass = client_for(origin.url)
        assert await bypass.post("/g", b"no proxy") == b"no proxy"
        await bypass.aclose()
    assert px.requests[0].line == f"POST {origin.url}/g HTTP/1.1"
    assert origin.bodies() == [b"direct", b"no proxy"]

"""tito's own HTTP/1.1 pool against real sockets: framing, keep-alive, stale connections, faults."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from tito_core._http11 import ConnectionPool, check_base_url
from tito_core.errors import BackendConnectionError
from tito_core.http import HttpClient, RetryPolicy

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
    except asyncio.IncompleteReadError:
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


# -- framing and keep-alive -----------------------------------------------------------------------


async def test_requests_reuse_one_connection_and_carry_body_and_headers() -> None:
    async with serving(echo) as raw:
        pool = ConnectionPool(raw.url + "/v1", headers={"content-type": "application/json", "x-key": "k"})
        for i in range(3):
            response = await pool.request("POST", "/generate", b'{"i": %d}' % i)
            assert (response.status_code, response.content) == (200, b'{"i": %d}' % i)
        get = await pool.request("GET", "/health")
        await pool.aclose()
    assert raw.connections == 1
    assert [r.line for r in raw.requests] == [*["POST /v1/generate HTTP/1.1"] * 3, "GET /v1/health HTTP/1.1"]
    first = raw.requests[0].headers
    assert first["host"] == raw.url.removeprefix("http://")
    assert (first["content-type"], first["x-key"], first["content-length"]) == ("application/json", "k", "8")
    assert "content-length" not in raw.requests[3].headers
    assert get.content == b"empty"


async def test_large_bodies_both_ways() -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB
    async with serving(echo) as raw:
        pool = ConnectionPool(raw.url)
        response = await pool.request("POST", "/big", payload)
        await pool.aclose()
    assert response.content == payload


async def test_chunked_answer_with_extensions_and_trailers() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nX-A: 2\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    async with serving(replying(chunked)) as raw:
        pool = ConnectionPool(raw.url)
        first = await pool.request("POST", "/x", b"{}")
        second = await pool.request("POST", "/x", b"{}")
        await pool.aclose()
    assert first.content == second.content == b"hello 0123456789"
    assert first.headers["x-a"] == "1, 2"
    assert raw.connections == 1  # the chunked framing left the connection usable


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",  # delimited by the close
        b"HTTP/1.0 200 OK\r\n\r\n",  # HTTP/1.0 without keep-alive
    ],
)
async def test_answers_delimited_by_close_are_read_whole_and_not_reused(head: bytes) -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.write(head + b"until the end")
        await writer.drain()

    async with serving(script) as raw:
        pool = ConnectionPool(raw.url)
        assert (await pool.request("GET", "/a")).content == b"until the end"
        assert (await pool.request("GET", "/a")).content == b"until the end"
        await pool.aclose()
    assert raw.connections == 2


async def test_interim_1xx_answers_are_skipped() -> None:
    async with serving(replying(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"done"))) as raw:
        pool = ConnectionPool(raw.url)
        assert (await pool.request("POST", "/a", b"x")).content == b"done"
        assert (await pool.request("POST", "/a", b"x")).content == b"done"
        await pool.aclose()
    assert raw.connections == 1


async def test_error_statuses_are_returned_not_raised() -> None:
    busy = answer(b'{"error": "busy"}', "503 Service Unavailable", "Retry-After: 2\r\n")
    async with serving(replying(busy)) as raw:
        pool = ConnectionPool(raw.url)
        response = await pool.request("POST", "/a", b"x")
        await pool.aclose()
    assert (response.status_code, response.headers["retry-after"], response.content) == (503, "2", b'{"error": "busy"}')


# -- stale connections ----------------------------------------------------------------------------


async def test_connection_closed_while_idle_is_not_reused() -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.write(answer(b"one"))  # keep-alive announced, then closed (a keep-alive timeout)
        await writer.drain()

    async with serving(script) as raw:
        pool = ConnectionPool(raw.url)
        await pool.request("POST", "/a", b"1")
        await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
        assert (await pool.request("POST", "/a", b"2")).content == b"one"
        await pool.aclose()
    assert raw.connections == 2
    assert [r.body for r in raw.requests] == [b"1", b"2"]


async def test_reused_connection_closed_as_the_request_arrives_is_retried_once() -> None:
    """The server closes the idle connection at the moment the request is written: sent again, fresh."""

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.write(answer(b"first" if index == 0 else b"fresh"))
        await writer.drain()
        if index == 0:
            await reader.readuntil(b"\r\n\r\n")  # the next request arrives; close without answering
            writer.transport.abort()
            return
        while await raw.recv(reader) is not None:
            writer.write(answer(b"fresh"))

    async with serving(script) as raw:
        pool = ConnectionPool(raw.url)
        assert (await pool.request("POST", "/a", b"1")).content == b"first"
        assert (await pool.request("POST", "/a", b"2")).content == b"fresh"
        await pool.aclose()
    assert raw.connections == 2


async def test_fresh_connection_closed_without_answer_is_a_protocol_error_not_retried() -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)  # never answers

    aborts: list[str] = []

    async def abort() -> None:
        aborts.append("abort")

    async with serving(script) as raw:
        pool = ConnectionPool(raw.url)
        with pytest.raises(httpx.RemoteProtocolError, match="closed the connection before answering"):
            await pool.request("POST", "/a", b"1")
        await pool.aclose()
        client = HttpClient(raw.url, backend_name="fake", retry=RetryPolicy(max_attempts=5, initial_delay=0))
        with pytest.raises(BackendConnectionError, match="failed during POST /generate"):
            await client.post("/generate", b"{}", abort=abort)
        await client.aclose()
    assert raw.connections == 2  # one per request: the client did not retry a request that was sent
    assert aborts == ["abort"]


async def test_idle_timeout_zero_never_reuses() -> None:
    async with serving(echo) as raw:
        pool = ConnectionPool(raw.url, idle_timeout=0.0)
        for _ in range(3):
            await pool.request("GET", "/a")
        await pool.aclose()
    assert raw.connections == 3


# -- faults -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "error", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", httpx.RemoteProtocolError, "middle of the answer"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", httpx.RemoteProtocolError, "malformed status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", httpx.RemoteProtocolError, "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", httpx.RemoteProtocolError, "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", httpx.RemoteProtocolError, "chunk size"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 300_000, httpx.RemoteProtocolError, "larger than"),
    ],
)
async def test_broken_answers_raise_protocol_errors(reply: bytes, error: type[Exception], message: str) -> None:
    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await raw.recv(reader)
        writer.write(reply)
        await writer.drain()

    async with serving(script) as raw:
        pool = ConnectionPool(raw.url)
        with pytest.raises(error, match=message):
            await pool.request("POST", "/a", b"1")
        await pool.aclose()


async def test_cancelled_request_discards_its_connection() -> None:
    gate = asyncio.Event()

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while await raw.recv(reader) is not None:
            if index == 0:
                gate.set()
                await asyncio.sleep(30)  # the client gives up first
            writer.write(answer(b"ok"))

    async with serving(script) as raw:
        pool = ConnectionPool(raw.url)
        task = asyncio.create_task(pool.request("POST", "/a", b"1"))
        await gate.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await pool.request("POST", "/a", b"2")).content == b"ok"
        await pool.aclose()
    assert raw.connections == 2  # the half-used connection was never handed to the second request


async def test_max_connections_bounds_requests_in_flight() -> None:
    in_flight = 0
    peak = 0

    async def script(raw: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        nonlocal in_flight, peak
        while await raw.recv(reader) is not None:
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.02)
            in_flight -= 1
            writer.write(answer(b"ok"))

    async with serving(script) as raw:
        pool = ConnectionPool(raw.url, max_connections=2)
        results = await asyncio.gather(*(pool.request("POST", "/a", b"x") for _ in range(7)))
        await pool.aclose()
    assert [r.content for r in results] == [b"ok"] * 7
    assert peak == 2
    assert raw.connections == 2


async def test_refused_connection_is_a_connect_error() -> None:
    async with serving(echo) as raw:
        url = raw.url
    pool = ConnectionPool(url)  # the server is gone: its port refuses
    with pytest.raises(httpx.ConnectError, match="cannot connect"):
        await pool.request("GET", "/a")


async def test_slow_connect_is_a_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hanging_open(*args: object, **kwargs: object) -> None:
        await asyncio.sleep(30)

    monkeypatch.setattr(asyncio, "open_connection", hanging_open)
    pool = ConnectionPool("http://127.0.0.1:9", connect_timeout=0.05)
    with pytest.raises(httpx.ConnectTimeout, match=r"within 0\.05 s"):
        await pool.request("GET", "/a")


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://host", "http://", "http://host:port"])
def test_bad_urls_are_rejected_up_front(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        check_base_url(url)
    with pytest.raises(ValueError, match="URL"):
        HttpClient(url, backend_name="fake")


def test_header_injection_is_rejected() -> None:
    with pytest.raises(ValueError, match="line break"):
        ConnectionPool("http://127.0.0.1:1", headers={"x-key": "a\r\nEvil: 1"})


# -- TLS ----------------------------------------------------------------------------------------------


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


async def test_https_origin(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    async with serving(echo, ssl_context=server_context) as raw:
        trusting = ssl.create_default_context(cafile=str(cert))
        pool = ConnectionPool(raw.url, ssl_context=trusting)
        assert (await pool.request("POST", "/a", b"secret")).content == b"secret"
        assert (await pool.request("POST", "/a", b"again")).content == b"again"
        await pool.aclose()
        untrusting = ConnectionPool(raw.url)  # system trust store: the self-signed certificate is refused
        with pytest.raises(httpx.ConnectError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await untrusting.request("GET", "/a")
    assert raw.connections == 1  # the refused handshake never became a connection

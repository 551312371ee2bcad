"""HttpClient through httpx (MockTransport): retries only where safe, error mapping, abort, any event loop.

The same client over the shipping aiohttp transport and real sockets is in ``test_transport.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping

import httpx
import pytest
from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException

import tito_core.http.client as client_mod
import tito_core.http.retry as retry_mod
from tito_core.backend import GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import (
    BackendConnectionError,
    BackendError,
    BackendResponseError,
    BackendThrottledError,
    BackendTimeoutError,
    ConfigError,
    ContextLengthError,
    ResponseTooLargeError,
)
from tito_core.http import HttpBackend, HttpClient, HttpOptions, RetryPolicy, check_base_url, response_byte_limit
from tito_core.http.transport import MaybeSentError, NotSentError, Response

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Record backoff delays instead of sleeping; jitter draws are the maximum (delay * (1 - jitter))."""
    recorded: list[float] = []

    async def fake_sleep(delay: float) -> None:
        recorded.append(delay)

    monkeypatch.setattr(client_mod, "_sleep", fake_sleep)
    monkeypatch.setattr(retry_mod, "_random", lambda: 1.0)
    yield recorded


def make_client(handler: Handler, **kwargs: object) -> HttpClient:
    return HttpClient(
        "http://engine.test",
        backend_name="fake",
        transport=httpx.MockTransport(handler),
        **kwargs,  # type: ignore[arg-type]
    )


class Counter:
    def __init__(self, responses: list[httpx.Response | Exception]) -> None:
        self.responses = responses
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        item = self.responses[min(len(self.requests), len(self.responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item


# -- RetryPolicy ---------------------------------------------------------------------------------


def test_retry_policy_backoff_is_exponential_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry_mod, "_random", lambda: 0.0)
    policy = RetryPolicy(initial_delay=0.5, max_delay=3.0, jitter=0.5)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    monkeypatch.setattr(retry_mod, "_random", lambda: 1.0)
    assert [policy.delay(n) for n in range(1, 4)] == [0.25, 0.5, 1.0]


def test_retry_policy_jitter_stays_within_bounds() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=8.0, jitter=0.3)
    for retry in range(1, 8):
        base = min(8.0, 2.0 ** (retry - 1))
        for _ in range(50):
            assert base * 0.7 - 1e-9 <= policy.delay(retry) <= base + 1e-9


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"jitter": 1.5}, {"jitter": -0.1}, {"initial_delay": -1.0}])
def test_retry_policy_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# -- success and retries ---------------------------------------------------------------------


async def test_post_sends_body_and_returns_bytes() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b'{"ok":true}')

    client = make_client(handler, headers={"authorization": "Bearer x"})
    assert await client.post("/generate", b'{"a":1}') == b'{"ok":true}'
    assert await client.get("/health") == b'{"ok":true}'
    assert seen[0].method == "POST" and seen[0].url == "http://engine.test/generate"
    assert seen[0].content == b'{"a":1}'
    assert seen[0].headers["content-type"] == "application/json"
    assert seen[0].headers["authorization"] == "Bearer x"
    assert seen[1].method == "GET" and seen[1].url.path == "/health"
    await client.aclose()


@pytest.mark.parametrize("status", [429, 503])
async def test_throttling_is_retried_then_succeeds(sleeps: list[float], status: int) -> None:
    counter = Counter([httpx.Response(status), httpx.Response(status), httpx.Response(200, content=b"x")])
    client = make_client(counter, retry=RetryPolicy(initial_delay=0.2, jitter=0.5))
    assert await client.post("/generate", b"{}") == b"x"
    assert len(counter.requests) == 3
    assert sleeps == [pytest.approx(0.1), pytest.approx(0.2)]


@pytest.mark.parametrize("status", [429, 503])
async def test_throttling_after_retries_raises_throttled(sleeps: list[float], status: int) -> None:
    counter = Counter([httpx.Response(status, text="busy")])
    client = make_client(counter, retry=RetryPolicy(max_attempts=3, initial_delay=0.1, jitter=0.0))
    with pytest.raises(BackendThrottledError) as info:
        await client.post("/generate", b"{}")
    assert not isinstance(info.value, ModelThrottledException)
    assert info.value.status == status and info.value.body == "busy" and info.value.backend == "fake"
    assert len(counter.requests) == 3
    assert sleeps == [pytest.approx(0.1), pytest.approx(0.2)]


async def test_retry_after_header_is_respected_within_max_delay(sleeps: list[float]) -> None:
    counter = Counter(
        [
            httpx.Response(429, headers={"retry-after": "2"}),
            httpx.Response(429, headers={"retry-after": "100"}),
            httpx.Response(200),
        ]
    )
    client = make_client(counter, retry=RetryPolicy(initial_delay=0.1, max_delay=3.0, jitter=0.0))
    await client.post("/generate", b"{}")
    assert sleeps == [2.0, 3.0]


async def test_total_retry_time_is_bounded(sleeps: list[float]) -> None:
    counter = Counter([httpx.Response(503)])
    policy = RetryPolicy(max_attempts=100, initial_delay=1.0, max_delay=4.0, max_total=10.0, jitter=0.0)
    client = make_client(counter, retry=policy)
    with pytest.raises(BackendThrottledError):
        await client.post("/generate", b"{}")
    # Fake sleeps take no time, so the bound is the sum of delays: 1 + 2 + 4 = 7, the next 4 would exceed 10.
    assert sleeps == [1.0, 2.0, 4.0]
    assert len(counter.requests) == 4


async def test_connect_failure_is_retried_then_maps_to_connection_error(sleeps: list[float]) -> None:
    counter = Counter([httpx.ConnectError("refused")])
    client = make_client(counter, retry=RetryPolicy(max_attempts=4, jitter=0.0))
    with pytest.raises(BackendConnectionError):
        await client.post("/generate", b"{}")
    assert len(counter.requests) == 4
    assert len(sleeps) == 3


async def test_connect_failure_then_success(sleeps: list[float]) -> None:
    counter = Counter([httpx.ConnectTimeout("slow"), httpx.Response(200, content=b"ok")])
    client = make_client(counter)
    assert await client.post("/generate", b"{}") == b"ok"
    assert len(counter.requests) == 2


async def test_real_refused_connection_maps_to_connection_error(sleeps: list[float]) -> None:
    # Port 9 on 127.0.0.1 ("discard") is not listening in any test environment we use.
    client = HttpClient("http://127.0.0.1:9", backend_name="fake", retry=RetryPolicy(max_attempts=2))
    with pytest.raises(BackendConnectionError):
        await client.get("/health")
    await client.aclose()


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_server_errors_are_not_retried(sleeps: list[float], status: int) -> None:
    counter = Counter([httpx.Response(status, text="boom")])
    aborted: list[bool] = []

    async def abort() -> None:
        aborted.append(True)

    client = make_client(counter)
    with pytest.raises(BackendError) as info:
        await client.post("/generate", b"{}", abort=abort)
    assert type(info.value) is BackendError
    assert info.value.status == status and info.value.body == "boom"
    assert len(counter.requests) == 1 and sleeps == []
    assert aborted == []


async def test_connection_lost_after_sending_is_not_retried_and_aborts(sleeps: list[float]) -> None:
    counter = Counter([httpx.RemoteProtocolError("server disconnected")])
    aborted: list[bool] = []

    async def abort() -> None:
        aborted.append(True)

    client = make_client(counter)
    with pytest.raises(BackendConnectionError):
        await client.post("/generate", b"{}", abort=abort)
    assert len(counter.requests) == 1 and sleeps == [] and aborted == [True]


# -- status mapping ------------------------------------------------------------------------------


ENGINE_SAYS = "The prompt (length 4100) is longer than the maximum model length of 4096."


@pytest.mark.parametrize("status", [400, 413, 422])
async def test_context_length_errors(status: int) -> None:
    client = make_client(lambda _: httpx.Response(status, text=ENGINE_SAYS), context_length_patterns=[r"length \d+"])
    with pytest.raises(ContextLengthError) as info:
        await client.post("/generate", b"{}")
    assert not isinstance(info.value, ContextWindowOverflowException)  # tito's errors are free of Strands ...
    assert info.value.status == status and info.value.body == ENGINE_SAYS


async def test_the_core_knows_no_engines_wording() -> None:
    """A client given no texts makes any 400 a plain BackendError: each adapter declares its engine's own."""
    client = make_client(lambda _: httpx.Response(400, text=ENGINE_SAYS))
    with pytest.raises(BackendError) as info:
        await client.post("/generate", b"{}")
    assert type(info.value) is BackendError


async def test_an_http_backend_gives_its_client_its_engines_texts() -> None:
    class Engine(HttpBackend):
        context_length_texts = (r"longer than the maximum model length",)

        async def generate(self, request: GenerateRequest) -> GenerateResult:
            raise NotImplementedError

    backend = Engine(
        "http://engine.test", transport=httpx.MockTransport(lambda _: httpx.Response(400, text=ENGINE_SAYS))
    )
    with pytest.raises(ContextLengthError):
        await backend.http.post("/generate", b"{}")


@pytest.mark.parametrize(
    "body",
    ["prompt is too long", "field 'stop' is too long", "n exceeds the limit of 8", "too many tokens in 'stop'"],
)
async def test_a_bare_too_long_or_exceed_is_not_a_context_length_error(body: str) -> None:
    """Only an engine's own context-window wording is a ContextLengthError, not any 400 saying "too long"."""
    client = make_client(lambda _: httpx.Response(400, text=body))
    with pytest.raises(BackendError) as info:
        await client.post("/generate", b"{}")
    assert type(info.value) is BackendError and info.value.status == 400


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_other_client_errors_are_plain_backend_errors(status: int) -> None:
    client = make_client(lambda _: httpx.Response(status, text="bad field 'foo'"))
    with pytest.raises(BackendError) as info:
        await client.post("/generate", b"{}")
    assert type(info.value) is BackendError
    assert info.value.status == status


async def test_context_patterns_are_configurable() -> None:
    client = make_client(lambda _: httpx.Response(400, text="KV budget blown"), context_length_patterns=[r"kv budget"])
    with pytest.raises(ContextLengthError):
        await client.post("/generate", b"{}")
    client = make_client(lambda _: httpx.Response(400, text="too long"), context_length_patterns=[r"kv budget"])
    with pytest.raises(BackendError) as info:
        await client.post("/generate", b"{}")
    assert not isinstance(info.value, ContextLengthError)


async def test_error_body_is_truncated() -> None:
    client = make_client(lambda _: httpx.Response(500, text="x" * 100_000))
    with pytest.raises(BackendError) as info:
        await client.post("/generate", b"{}")
    assert info.value.body is not None
    assert 4096 <= len(info.value.body) < 5000
    assert len(str(info.value)) < 500


# -- timeouts and cancellation --------------------------------------------------------------


class SlowTransport(httpx.AsyncBaseTransport):
    """Answers after ``delay`` seconds; records when a request starts."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.started = asyncio.Event()
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        self.started.set()
        await asyncio.sleep(self.delay)
        return httpx.Response(200, content=b"late")


async def test_timeout_calls_abort_and_raises_timeout_error() -> None:
    transport = SlowTransport(delay=30)
    aborted: list[bool] = []

    async def abort() -> None:
        aborted.append(True)

    client = HttpClient("http://engine.test", backend_name="fake", timeout=0.05, transport=transport)
    with pytest.raises(BackendTimeoutError):
        await client.post("/generate", b"{}", abort=abort)
    assert aborted == [True]
    assert transport.calls == 1  # never retried


async def test_httpx_read_timeout_maps_to_timeout_error(sleeps: list[float]) -> None:
    counter = Counter([httpx.ReadTimeout("read timed out")])
    aborted: list[bool] = []

    async def abort() -> None:
        aborted.append(True)

    client = make_client(counter)
    with pytest.raises(BackendTimeoutError):
        await client.post("/generate", b"{}", abort=abort)
    assert aborted == [True] and len(counter.requests) == 1 and sleeps == []


async def test_failing_abort_is_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    async def abort() -> None:
        raise RuntimeError("abort endpoint down")

    client = HttpClient("http://engine.test", backend_name="fake", timeout=0.05, transport=SlowTransport(30))
    with pytest.raises(BackendTimeoutError):
        await client.post("/generate", b"{}", abort=abort)
    assert "abort endpoint down" in caplog.text


async def test_cancellation_calls_abort_then_propagates() -> None:
    transport = SlowTransport(delay=30)
    aborted = asyncio.Event()

    async def abort() -> None:
        await asyncio.sleep(0.01)  # the abort itself awaits: it must survive the cancellation
        aborted.set()

    client = HttpClient("http://engine.test", backend_name="fake", transport=transport)
    task = asyncio.create_task(client.post("/generate", b"{}", abort=abort))
    await transport.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert aborted.is_set()


async def test_no_timeout_when_none() -> None:
    client = HttpClient("http://engine.test", backend_name="fake", timeout=None, transport=SlowTransport(0.05))
    assert await client.post("/generate", b"{}") == b"late"


# -- event loops ---------------------------------------------------------------------------------


def test_one_client_works_from_several_event_loops() -> None:
    client = make_client(lambda _: httpx.Response(200, content=b"ok"))
    assert asyncio.run(client.post("/generate", b"{}")) == b"ok"
    assert asyncio.run(client.post("/generate", b"{}")) == b"ok"
    # The first loop is closed: its client was dropped when the second loop made its own.
    assert len(client._transports) == 1

    results: list[bytes] = []
    thread = threading.Thread(target=lambda: results.append(asyncio.run(client.get("/health"))))
    thread.start()
    thread.join()
    assert results == [b"ok"]
    asyncio.run(client.aclose())
    assert client._transports == {}


def test_real_pooled_transport_from_two_loops() -> None:
    """A real (socket) pool per loop: a closed loop's connections are never reused by another loop."""
    with _ok_server() as url:
        client = HttpClient(url, backend_name="fake")
        for _ in range(3):
            assert asyncio.run(client.get("/health")) == b"ok"


@contextlib.contextmanager
def _ok_server() -> Iterator[str]:
    """A real keep-alive HTTP/1.1 server (a thread) answering every GET with ``ok``."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _leftovers(run: Callable[[], None]) -> list[str]:
    """What ``run`` leaves behind: aiohttp's "Unclosed ..." reports, warnings, unraisable exceptions."""
    import gc
    import logging
    import sys
    import warnings

    reports: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reports.append(record.getMessage())

    catch = Catch()
    logging.getLogger("asyncio").addHandler(catch)
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: reports.append(f"unraisable: {u.exc_value!r}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
            gc.collect()
        reports += [str(w.message) for w in caught if "Unclosed" in str(w.message)]
    finally:
        sys.unraisablehook = hook
        logging.getLogger("asyncio").removeHandler(catch)
    return reports


def test_a_loop_that_ends_closes_its_session() -> None:
    """``asyncio.run`` per step with one shared client (a common RL driver): each loop's aiohttp session is
    closed as the loop ends, so nothing reports an unclosed session or connector."""
    with _ok_server() as url:
        client = HttpClient(url, backend_name="fake")

        def steps() -> None:
            for _ in range(3):
                assert asyncio.run(client.get("/health")) == b"ok"
                (entry,) = client._transports.values()
                assert entry.transport._session is None  # type: ignore[attr-defined]  # closed with its loop

        assert _leftovers(steps) == []


def test_a_loop_closed_without_asyncio_run_leaves_no_warnings() -> None:
    """A loop closed by hand (no ``shutdown_asyncgens``): its session is let go when the client next runs on
    another loop, and when the client goes away: no "Unclosed" reports, no exception from a finalizer."""
    with _ok_server() as url:

        def by_hand() -> None:
            client = HttpClient(url, backend_name="fake")
            for _ in range(2):
                loop = asyncio.new_event_loop()
                assert loop.run_until_complete(client.get("/health")) == b"ok"
                loop.close()
            assert asyncio.run(client.get("/health")) == b"ok"  # drops the two dead loops' transports
            last = asyncio.new_event_loop()
            last.run_until_complete(client.get("/health"))
            last.close()
            del client  # with a dead loop's transport still held

        assert _leftovers(by_hand) == []


# -- httpx specifics ------------------------------------------------------------------------------


async def test_retry_after_http_date_is_read(sleeps: list[float]) -> None:
    counter = Counter(
        [httpx.Response(503, headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}), httpx.Response(200)]
    )
    client = make_client(counter, retry=RetryPolicy(initial_delay=0.5, jitter=0.0))
    await client.post("/generate", b"{}")
    assert sleeps == [0.5]  # a date in the past: no extra wait beyond the backoff


async def test_user_httpx_client_is_used_and_left_open() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"ok")

    user = httpx.AsyncClient(transport=httpx.MockTransport(handler), headers={"x-user": "1"})
    client = HttpClient("http://engine.test", backend_name="fake", client=user, headers={"x-tito": "2"})
    assert await client.post("/generate", b"{}") == b"ok"
    await client.aclose()
    assert not user.is_closed
    assert seen[0].headers["x-user"] == "1" and seen[0].headers["x-tito"] == "2"
    await user.aclose()


async def test_httpx_mounts_route_requests() -> None:
    mounted = httpx.MockTransport(lambda _: httpx.Response(200, content=b"mounted"))
    user = httpx.AsyncClient(mounts={"http://engine.test": mounted})
    client = HttpClient("http://engine.test", backend_name="fake", client=user)
    assert await client.get("/health") == b"mounted"
    await user.aclose()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), BackendConnectionError),
        (httpx.RemoteProtocolError("malformed data"), BackendResponseError),
        (httpx.ReadError("reset"), BackendConnectionError),
        (httpx.ProxyError("proxy said no"), BackendConnectionError),
    ],
)
async def test_httpx_errors_are_mapped(error: Exception, expected: type[Exception], sleeps: list[float]) -> None:
    counter = Counter([error])
    client = make_client(counter, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(expected):
        await client.post("/generate", b"{}")


async def test_httpx_body_limit() -> None:
    client = make_client(lambda _: httpx.Response(200, content=b"x" * 5000))
    with pytest.raises(ResponseTooLargeError) as info:
        await client.post("/generate", b"{}", max_body=4096)
    assert info.value.value == 5000
    assert await client.post("/generate", b"{}", max_body=5000) == b"x" * 5000


def test_retry_policy_from_a_mapping_and_bad_mappings() -> None:
    client = HttpClient("http://e.test", backend_name="fake", retry={"max_attempts": 2, "jitter": 0.0})
    assert client.retry == RetryPolicy(max_attempts=2, jitter=0.0)
    with pytest.raises(ConfigError, match="max_attemps"):
        HttpClient("http://e.test", backend_name="fake", retry={"max_attemps": 2})


@pytest.mark.parametrize("kwargs", [{"max_connections": 0}, {"timeout": 0}, {"connect_timeout": -1},
                                    {"headers": {"x": "a\r\nEvil: 1"}}])  # fmt: skip
def test_bad_client_options_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        HttpClient("http://e.test", backend_name="fake", **kwargs)  # type: ignore[arg-type]


# -- base URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:8000", r"no scheme: write 'http://127\.0\.0\.1:8000'"),
        ("localhost:30000", r"no scheme: write 'http://localhost:30000'"),
        ("http://127.0.0.1:8000/v1", r"ends in /v1: give the server root 'http://127\.0\.0\.1:8000'"),
        ("http://127.0.0.1:8000/v1/", r"ends in /v1"),
        ("https://host/api/sglang", r"has a path \('/api/sglang'\): give the server root 'https://host'"),
        ("ftp://host", r"unsupported scheme 'ftp'"),
        ("ws://host:80", r"unsupported scheme 'ws'"),
        ("http://", r"no host"),
        ("http://host:port", r"bad port"),
        ("", r"must be a server URL"),
    ],
)
def test_base_url_mistakes_are_named(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_base_url(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "https://h.example", "HTTP://h:1"])
def test_good_base_urls(url: str) -> None:
    assert check_base_url(url) == url.rstrip("/").replace("HTTP", "http")


# -- body limits ---------------------------------------------------------------------------------------


def test_response_byte_limit_grows_with_what_is_asked() -> None:
    base = response_byte_limit(100)
    assert base == 1024 * 1024 + 100 * 1024
    assert response_byte_limit(100, logprobs=False) < base
    assert response_byte_limit(100, echoed_tokens=1000) == base + 16_000
    assert response_byte_limit(100, prompt_logprob_tokens=10) == base + 10 * 1024
    assert response_byte_limit(100, routed_expert_tokens=10) == base + 10 * 16 * 1024
    assert response_byte_limit(None, context_length=4096) == response_byte_limit(4096)
    assert response_byte_limit(None) == response_byte_limit(131_072)


# -- the adapters' base --------------------------------------------------------------------------------


class _Echo(HttpBackend):
    name = "echo-http"

    def __init__(self, base_url: str | None = None, *, flavour: str = "x", **options: object) -> None:
        super().__init__(base_url, **options)  # type: ignore[arg-type]
        self.flavour = flavour

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        body = await self.http.post("/generate", b"{}", max_body=self.response_limit(request))
        return GenerateResult(output_ids=list(body))


def test_http_backend_options_match_the_typed_dict() -> None:
    import inspect

    params = inspect.signature(HttpBackend.__init__).parameters
    keyword = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword == list(HttpOptions.__annotations__)


def test_subclass_signature_lists_every_option() -> None:
    import inspect

    signature = inspect.signature(_Echo)
    assert list(signature.parameters)[:2] == ["base_url", "flavour"]
    assert {"timeout", "api_key", "verify", "trust_env", "max_response_bytes", "retry"} <= set(signature.parameters)
    with pytest.raises(TypeError):
        signature.bind(base_ulr="http://x")
    signature.bind("http://x", flavour="y", api_key="k")


def test_http_backend_options() -> None:
    backend = _Echo("http://h:1/", api_key="sk-1", headers={"x-a": "b"}, retry={"max_attempts": 1})
    assert backend.base_url == "http://h:1"
    assert backend.http.headers["authorization"] == "Bearer sk-1" and backend.http.headers["x-a"] == "b"
    assert backend.http.retry.max_attempts == 1
    explicit = _Echo("http://h:1", api_key="sk-1", headers={"Authorization": "Token t"})
    assert explicit.http.headers["Authorization"] == "Token t" and "authorization" not in explicit.http.headers
    assert _Echo().base_url == "http://127.0.0.1:8000"
    with pytest.raises(ConfigError, match="/v1"):
        _Echo("http://h:1/v1")
    with pytest.raises(ConfigError, match="max_response_bytes"):
        _Echo(max_response_bytes=0)


async def test_http_backend_response_limit() -> None:
    request = GenerateRequest(rid="r", input_ids=[1], prefix_len=0, sampling=SamplingParams(max_new_tokens=10))
    big = httpx.MockTransport(lambda _: httpx.Response(200, content=b"x" * 2_000_000))
    derived = _Echo(transport=big)
    assert derived.response_limit(request) == response_byte_limit(10)
    with pytest.raises(ResponseTooLargeError):
        await derived.generate(request)
    fixed = _Echo(transport=big, max_response_bytes=3_000_000)
    assert fixed.response_limit(request) == 3_000_000
    assert len((await fixed.generate(request)).output_ids) == 2_000_000


# -- a tito Transport given ------------------------------------------------------------------------


class ScriptedTransport:
    """A :class:`tito_core.http.transport.Transport` answering from a list: a Response, or an error to raise."""

    def __init__(self, answers: list[object]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, bytes | None, dict[str, str] | None]] = []
        self.closed = False

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
        self.calls.append((method, path, body, dict(headers) if headers is not None else None))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Response)
        return answer

    async def aclose(self) -> None:
        self.closed = True

    def abandon(self) -> None:
        pass


async def test_a_given_transport_is_sent_through_with_retries_and_error_mapping(sleeps: list[float]) -> None:
    transport = ScriptedTransport(
        [NotSentError("refused"), Response(503, {}, b"busy"), Response(200, {}, b"ok"), MaybeSentError("reset")]
    )
    client = HttpClient(
        "http://engine.test", backend_name="fake", transport=transport, headers={"x-key": "k"}, retry={"jitter": 0.0}
    )
    assert await client.post("/generate", b"{}") == b"ok"
    assert [c[2] for c in transport.calls] == [b"{}"] * 3 and len(sleeps) == 2
    assert transport.calls[0][3] == {"content-type": "application/json", "x-key": "k"}
    aborted: list[bool] = []

    async def abort() -> None:
        aborted.append(True)

    with pytest.raises(BackendConnectionError):
        await client.post("/generate", b"{}", abort=abort)
    assert aborted == [True] and len(transport.calls) == 4  # lost after sending: not sent again
    await client.aclose()
    assert transport.closed


def test_a_given_transport_and_a_client_are_refused_together() -> None:
    with pytest.raises(ConfigError, match="either client="):
        HttpClient(
            "http://engine.test", backend_name="fake", transport=ScriptedTransport([]), client=httpx.AsyncClient()
        )

"""Shared async HTTP plumbing for engine adapters.

:class:`HttpClient` posts JSON bodies (already encoded, as bytes) to an inference server and maps
failures onto tito's error hierarchy. It is engine-independent: adapters build the body and decode
the answer; this module only moves bytes and decides what is safe to retry.

Retry rules. A request is retried only when repeating it cannot run a generation twice:

* the connection could not be established (the request never reached the server);
* the server answered 429 or 503 (it refused the work because it is overloaded).

A read timeout, a dropped connection after the request was sent, or any other 5xx are never retried:
the generation may be running. On a timeout and on cancellation the caller's ``abort`` callback is
invoked (best effort) so the engine can stop the request, then the error / cancellation propagates.

One :class:`HttpClient` may be used from any event loop: it keeps one connection pool per loop and
forgets the pools of loops that have been closed. The pool is tito's own keep-alive HTTP/1.1 client
(:mod:`tito_core._http11`); pass an ``httpx`` transport to go through ``httpx`` instead (tests, proxies).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, Protocol

import httpx
import msgspec

from tito_core._http11 import ConnectionPool, RawResponse, check_base_url
from tito_core.errors import (
    BackendConnectionError,
    BackendError,
    BackendThrottledError,
    BackendTimeoutError,
    ContextLengthError,
)

__all__ = [
    "DEFAULT_CONTEXT_LENGTH_PATTERNS",
    "AbortCallback",
    "HttpClient",
    "RetryPolicy",
]

logger = logging.getLogger(__name__)

AbortCallback = Callable[[], Awaitable[None]]
"""Best-effort callback that asks the engine to stop the request being waited for."""

DEFAULT_CONTEXT_LENGTH_PATTERNS: Final[tuple[str, ...]] = (
    r"context[ _-]?length",
    r"context[ _-]?window",
    r"maximum context",
    r"max(?:imum)?[ _-]?model[ _-]?len",
    r"too long",
    r"too many tokens",
    r"exceed",
)
"""Regexes (case-insensitive) that identify a "prompt does not fit" error body."""

_THROTTLE_STATUSES: Final = frozenset({429, 503})
_CONTEXT_STATUSES: Final = frozenset({400, 413, 422})
_MAX_BODY_CHARS: Final = 4096
_ABORT_TIMEOUT: Final = 5.0

# Indirections patched by tests (no real sleeping, deterministic jitter).
_sleep = asyncio.sleep
_random = random.random


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Exponential backoff with jitter, bounded in attempts and in total time.

    Attributes:
        max_attempts: Attempts in all, the first one included (1 disables retries).
        initial_delay: Delay before the first retry, in seconds.
        max_delay: Upper bound of one delay, in seconds.
        max_total: Upper bound of the time spent retrying (attempts and delays), in seconds; no retry
            starts whose delay would end after it.
        jitter: Fraction (0..1) of each delay that is randomized: a delay ``d`` becomes a uniform value
            in ``[d * (1 - jitter), d]``.

    """

    max_attempts: int = 4
    initial_delay: float = 0.25
    max_delay: float = 4.0
    max_total: float = 30.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be >= 1")
        if self.initial_delay < 0 or self.max_delay < 0 or self.max_total < 0:
            raise ValueError("RetryPolicy delays must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("RetryPolicy.jitter must be within [0, 1]")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        base = min(self.max_delay, self.initial_delay * (2.0 ** max(0, retry - 1)))
        return base * (1.0 - self.jitter * _random())


def _truncate(text: str) -> str:
    if len(text) <= _MAX_BODY_CHARS:
        return text
    return text[:_MAX_BODY_CHARS] + f"... [{len(text) - _MAX_BODY_CHARS} more characters]"


def _retry_after(response: RawResponse | httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class _Sender(Protocol):
    """Sends one request and reads the whole answer (an ``httpx.Response`` or a :class:`RawResponse`)."""

    async def request(self, method: str, path: str, body: bytes | None) -> RawResponse | httpx.Response: ...

    async def aclose(self) -> None: ...


class _HttpxSender:
    """The :class:`_Sender` over an ``httpx.AsyncClient`` with a caller-provided transport."""

    __slots__ = ("client",)

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def request(self, method: str, path: str, body: bytes | None) -> httpx.Response:
        return await self.client.request(method, path, content=body)

    async def aclose(self) -> None:
        await self.client.aclose()


class _LoopClient:
    """A sender bound to one event loop (held weakly, so dead loops are noticed)."""

    __slots__ = ("client", "loop_ref")

    def __init__(self, loop: asyncio.AbstractEventLoop, client: _Sender) -> None:
        self.loop_ref = weakref.ref(loop)
        self.client = client

    def alive(self) -> bool:
        loop = self.loop_ref()
        return loop is not None and not loop.is_closed()


class HttpClient:
    """Pooled async HTTP client for one inference server, usable from any event loop.

    Args:
        base_url: Server root, e.g. ``http://127.0.0.1:30000``.
        backend_name: Name put on the errors raised (``BackendError.backend``).
        timeout: Total seconds one attempt may take (connect, send, generate, read); None for no limit.
        connect_timeout: Seconds to establish a connection.
        max_connections: Connection pool size per event loop.
        retry: When and how long to retry (connect failures and 429 / 503 only).
        headers: Extra headers sent with every request (e.g. an API key).
        transport: An ``httpx`` transport to send through instead of tito's own connection pool (tests,
            proxies, HTTP/2). It is shared by the clients of every event loop and closed by :meth:`aclose`.
        context_length_patterns: Regexes recognizing a "prompt too long" body on 400 / 413 / 422.

    """

    def __init__(
        self,
        base_url: str,
        *,
        backend_name: str,
        timeout: float | None = 600.0,
        connect_timeout: float = 5.0,
        max_connections: int = 1024,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        context_length_patterns: Sequence[str] = DEFAULT_CONTEXT_LENGTH_PATTERNS,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if transport is None:
            check_base_url(base_url)
        self.base_url = base_url.rstrip("/")
        self.backend_name = backend_name
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.retry = retry if retry is not None else RetryPolicy()
        self.headers = dict(headers or {})
        self._transport = transport
        self._context_re = re.compile("|".join(f"(?:{p})" for p in context_length_patterns), re.IGNORECASE)
        self._clients: dict[int, _LoopClient] = {}
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"HttpClient({self.base_url!r}, backend_name={self.backend_name!r})"

    # -- clients per event loop ---------------------------------------------------------------

    def _client(self) -> _Sender:
        loop = asyncio.get_running_loop()
        key = id(loop)
        entry = self._clients.get(key)
        if entry is not None and entry.loop_ref() is loop and not loop.is_closed():
            return entry.client
        # Drop the clients of loops that are gone (their connections cannot be used or awaited anymore).
        for stale in [k for k, e in self._clients.items() if not e.alive() or k == key]:
            del self._clients[stale]
        headers = {"content-type": "application/json", **self.headers}
        client: _Sender
        if self._transport is None:
            client = ConnectionPool(
                self.base_url,
                headers=headers,
                max_connections=self.max_connections,
                connect_timeout=self.connect_timeout,
            )
        else:
            client = _HttpxSender(
                httpx.AsyncClient(
                    base_url=self.base_url,
                    headers=headers,
                    timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                    transport=self._transport,
                )
            )
        self._clients[key] = _LoopClient(loop, client)
        return client

    async def aclose(self) -> None:
        """Close the current loop's client; forget the clients of other loops."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - called outside a loop
            loop = None
        clients, self._clients = self._clients, {}
        for entry in clients.values():
            if loop is not None and entry.loop_ref() is loop:
                await entry.client.aclose()

    # -- requests -----------------------------------------------------------------------------

    async def post(self, path: str, body: bytes, *, abort: AbortCallback | None = None) -> bytes:
        """POST ``body`` (JSON bytes) to ``path`` and return the response body.

        Raises:
            BackendConnectionError: The server could not be reached (after retries) or dropped the
                connection.
            BackendTimeoutError: No answer within ``timeout``; ``abort`` was called first.
            BackendThrottledError: 429 / 503 after retries.
            ContextLengthError: 400 / 413 / 422 whose body says the prompt is too long.
            BackendError: Any other non-2xx answer.
            asyncio.CancelledError: The caller was cancelled; ``abort`` was called first.

        """
        return await self._request("POST", path, body, abort)

    async def get(self, path: str) -> bytes:
        """GET ``path`` and return the response body (same errors as :meth:`post`)."""
        return await self._request("GET", path, None, None)

    async def _request(self, method: str, path: str, body: bytes | None, abort: AbortCallback | None) -> bytes:
        policy = self.retry
        start = time.monotonic()
        slept = 0.0  # a lower bound of the elapsed time that holds even when sleeping is faked
        attempt = 0
        while True:
            attempt += 1
            error: BackendError
            retry_after: float | None = None
            try:
                response = await self._send_once(method, path, body)
            except asyncio.CancelledError:
                await self._abort(abort, "cancelled")
                raise
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Never reached the server: safe to retry.
                error = BackendConnectionError(
                    f"{self.backend_name}: cannot connect to {self.base_url}: {exc!s}",
                    backend=self.backend_name,
                )
            except (TimeoutError, httpx.TimeoutException) as exc:
                await self._abort(abort, "timed out")
                raise BackendTimeoutError(
                    f"{self.backend_name}: {method} {path} got no answer within {self.timeout} s",
                    backend=self.backend_name,
                ) from exc
            except httpx.TransportError as exc:
                # The request may have reached the server: do not retry, but try to stop it.
                await self._abort(abort, "connection lost")
                raise BackendConnectionError(
                    f"{self.backend_name}: connection to {self.base_url} failed during {method} {path}: {exc!s}",
                    backend=self.backend_name,
                ) from exc
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return response.content
                text = _truncate(response.content.decode("utf-8", errors="replace"))
                if status not in _THROTTLE_STATUSES:
                    raise self._status_error(method, path, status, text)
                error = BackendThrottledError(
                    f"{self.backend_name}: server is overloaded (HTTP {status}) on {method} {path}",
                    status=status,
                    body=text,
                    backend=self.backend_name,
                )
                retry_after = _retry_after(response)

            delay = policy.delay(attempt)
            if retry_after is not None:
                delay = min(max(delay, retry_after), policy.max_delay)
            elapsed = max(time.monotonic() - start, slept)
            if attempt >= policy.max_attempts or elapsed + delay > policy.max_total:
                raise error
            logger.debug(
                "%s: retrying %s %s in %.2fs (attempt %d/%d): %s",
                self.backend_name, method, path, delay, attempt + 1, policy.max_attempts, error,
            )  # fmt: skip
            slept += delay
            await _sleep(delay)

    async def _send_once(self, method: str, path: str, body: bytes | None) -> RawResponse | httpx.Response:
        client = self._client()
        if self.timeout is None:
            return await client.request(method, path, body)
        async with asyncio.timeout(self.timeout):
            return await client.request(method, path, body)

    def _status_error(self, method: str, path: str, status: int, text: str) -> BackendError:
        if status in _CONTEXT_STATUSES and self._context_re.search(text):
            return ContextLengthError(
                f"{self.backend_name}: prompt does not fit the context window (HTTP {status}): {text[:300]}",
                status=status,
                body=text,
                backend=self.backend_name,
            )
        return BackendError(
            f"{self.backend_name}: {method} {path} failed with HTTP {status}: {text[:300]}",
            status=status,
            body=text,
            backend=self.backend_name,
        )

    async def _abort(self, abort: AbortCallback | None, why: str) -> None:
        """Run ``abort`` shielded from cancellation and bounded in time; never raises.

        A second cancellation of the caller arriving meanwhile propagates; the abort goes on in background.
        """
        if abort is None:
            return
        task = asyncio.ensure_future(self._run_abort(abort, why))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        await asyncio.shield(task)

    async def _run_abort(self, abort: AbortCallback, why: str) -> None:
        try:
            async with asyncio.timeout(_ABORT_TIMEOUT):
                await abort()
        except Exception as exc:
            logger.warning("%s: request %s; aborting it on the server failed: %r", self.backend_name, why, exc)
        else:
            logger.debug("%s: request %s; aborted it on the server", self.backend_name, why)

"""The HTTP client of the adapters: one retry place, one error mapping, bounded answers, any event loop.

:class:`HttpClient` posts JSON bodies (already encoded, as bytes) through a
:class:`~tito_core.http.transport.Transport` (aiohttp per event loop by default; httpx for a client or
transport the user passes; any transport given) and maps failures onto tito's error hierarchy (the policy is
described in :mod:`tito_core.http`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from tito_core.errors import (
    BackendConnectionError,
    BackendError,
    BackendResponseError,
    BackendThrottledError,
    BackendTimeoutError,
    ConfigError,
    ResponseTooLargeError,
)
from tito_core.http.aiohttp_transport import AiohttpTransport
from tito_core.http.errors import (
    THROTTLE_STATUSES,
    context_pattern,
    status_error,
    truncate,
)
from tito_core.http.httpx_transport import HttpxTransport
from tito_core.http.limits import DEFAULT_MAX_BODY
from tito_core.http.loops import LoopTransport, close_loop_transports, discard_dead, transport_for_loop
from tito_core.http.retry import RetryPolicy, retry_policy
from tito_core.http.retry import retry_after as retry_after_of
from tito_core.http.transport import (
    BodyTooLargeError,
    FramingError,
    MaybeSentError,
    NotSentError,
    Transport,
    TransportTimeout,
    Verify,
)
from tito_core.http.urls import check_base_url, check_headers

if TYPE_CHECKING:
    import httpx

__all__ = ["AbortCallback", "HttpClient"]

logger = logging.getLogger("tito_core.http")

AbortCallback = Callable[[], Awaitable[None]]
"""Best-effort callback that asks the engine to stop the request being waited for."""

_ABORT_TIMEOUT: Final = 5.0

# Indirection patched by tests (no real sleeping).
_sleep = asyncio.sleep


class HttpClient:
    """Pooled async HTTP client for one inference server, usable from any event loop.

    Args:
        base_url: Server root, e.g. ``http://127.0.0.1:30000`` (see :func:`check_base_url`).
        backend_name: Name put on the errors raised (``BackendError.backend``).
        timeout: Seconds one attempt may take in all (connect, send, generate, read); None for no limit.
        connect_timeout: Seconds to open one connection.
        max_connections: Connections per event loop (aiohttp transport).
        retry: When and how long to retry (see the module docstring); a mapping is read as a RetryPolicy.
        headers: Extra headers sent with every request (e.g. an API key).
        verify: TLS verification: True, False, a CA bundle path or an ``ssl.SSLContext``.
        trust_env: Honour ``HTTP(S)_PROXY`` / ``NO_PROXY`` environment variables.
        client: An ``httpx.AsyncClient`` to send through (its proxies, mounts, TLS settings); not closed
            by tito.
        transport: What to send through instead of aiohttp (as ``httpx.AsyncClient(transport=...)``): a
            :class:`~tito_core.http.transport.Transport` (used as given, from the event loop it is bound to,
            and closed by :meth:`aclose`), or an ``httpx`` transport (a client per event loop is made over it).
        max_body: Default body limit of an answer, in bytes (None: unbounded).
        context_length_patterns: Regexes (matched ignoring case) of the engine's "prompt too long" body on a 400 /
            413 / 422, which then raises a :class:`~tito_core.errors.ContextLengthError`; none by default (an
            adapter gives its engine's, :attr:`~tito_core.http.HttpBackend.context_length_texts`).

    """

    def __init__(
        self,
        base_url: str,
        *,
        backend_name: str,
        timeout: float | None = 600.0,
        connect_timeout: float = 5.0,
        max_connections: int = 1024,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        verify: Verify = True,
        trust_env: bool = True,
        client: httpx.AsyncClient | None = None,
        transport: Transport | httpx.AsyncBaseTransport | None = None,
        max_body: int | None = DEFAULT_MAX_BODY,
        context_length_patterns: Sequence[str] = (),
    ) -> None:
        if max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {max_connections}")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds (or None for no limit), got {timeout}")
        if connect_timeout <= 0:
            raise ConfigError(f"connect_timeout must be > 0 seconds, got {connect_timeout}")
        if client is not None and transport is not None:
            raise ConfigError("give either client= (an httpx.AsyncClient) or transport= (a transport)")
        self.base_url = check_base_url(base_url)
        self.backend_name = backend_name
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.retry = retry_policy(retry)
        self.headers = {"content-type": "application/json", **check_headers(headers or {})}
        self.verify = verify
        self.trust_env = trust_env
        self.max_body = max_body
        self._client = client
        self._given: Transport | None = None
        self._httpx_transport: httpx.AsyncBaseTransport | None = None
        if transport is not None:
            import httpx  # only when a transport is given: aiohttp alone does not need it

            if isinstance(transport, httpx.AsyncBaseTransport):
                self._httpx_transport = transport
            else:
                self._given = transport
        # a transport made here sends ``headers`` with every request already; a given one is told each time
        self._request_headers = self.headers if self._given is not None else None
        self._context_re = context_pattern(context_length_patterns)
        self._transports: dict[int, LoopTransport] = {}
        self._background: set[asyncio.Task[None]] = set()
        weakref.finalize(self, discard_dead, self._transports)

    def __repr__(self) -> str:
        return f"HttpClient({self.base_url!r}, backend_name={self.backend_name!r})"

    # -- transports per event loop ------------------------------------------------------------

    def _transport(self) -> Transport:
        if self._given is not None:
            return self._given
        return transport_for_loop(self._transports, self._new_transport)

    def _new_transport(self) -> Transport:
        """A transport for the running loop: aiohttp, or httpx over the client or transport given."""
        if self._client is None and self._httpx_transport is None:
            return AiohttpTransport(
                self.base_url,
                headers=self.headers,
                max_connections=self.max_connections,
                connect_timeout=self.connect_timeout,
                verify=self.verify,
                trust_env=self.trust_env,
            )
        return HttpxTransport(
            self.base_url,
            client=self._client,
            transport=self._httpx_transport,
            headers=self.headers,
            connect_timeout=self.connect_timeout,
            verify=self.verify,
            trust_env=self.trust_env,
        )

    async def aclose(self) -> None:
        """Close the current loop's transport (or the transport given); forget the transports of other loops."""
        await close_loop_transports(self._transports)
        if self._given is not None:
            await self._given.aclose()

    # -- requests -----------------------------------------------------------------------------

    def post(
        self, path: str, body: bytes, *, abort: AbortCallback | None = None, max_body: int | None = None
    ) -> Coroutine[Any, Any, bytes]:
        """POST ``body`` (JSON bytes) to ``path`` and return the response body.

        ``max_body`` bounds the answer (default: the client's ``max_body``).

        Raises:
            BackendConnectionError: The server could not be reached (after retries), or the connection
                was lost once the request was sent (``abort`` called first; never re-sent).
            BackendTimeoutError: No answer within ``timeout``; ``abort`` was called first.
            BackendThrottledError: 429 / 503 after retries.
            ContextLengthError: 400 / 413 / 422 whose body says the prompt is too long.
            ResponseTooLargeError: The body exceeds the limit; ``abort`` was called first.
            BackendResponseError: The answer is not valid HTTP (``field="http"``); ``abort`` was called first.
            BackendError: Any other non-2xx answer.
            asyncio.CancelledError: The caller was cancelled; ``abort`` was called first.

        """
        return self._request("POST", path, body, abort, max_body)  # no coroutine of its own alive during the request

    async def get(self, path: str, *, max_body: int | None = None) -> bytes:
        """GET ``path`` and return the response body (same errors as :meth:`post`)."""
        return await self._request("GET", path, None, None, max_body)

    async def _request(
        self, method: str, path: str, body: bytes | None, abort: AbortCallback | None, max_body: int | None
    ) -> bytes:
        policy = self.retry
        limit = max_body if max_body is not None else self.max_body
        start = time.monotonic()
        slept = 0.0  # a lower bound of the elapsed time that holds even when sleeping is faked
        attempt = 0
        name = self.backend_name
        while True:
            attempt += 1
            error: BackendError
            retry_after: float | None = None
            try:
                response = await self._transport().request(
                    method, path, body, headers=self._request_headers, timeout=self.timeout, max_body=limit
                )
            except asyncio.CancelledError:
                await self._abort(abort, "cancelled")
                raise
            except NotSentError as exc:  # nothing reached the server: safe to send again
                error = BackendConnectionError(f"{name}: cannot connect to {self.base_url}: {exc}", backend=name)
                error.__cause__ = exc
            except TransportTimeout as exc:
                await self._abort(abort, "timed out")
                raise BackendTimeoutError(
                    f"{name}: {method} {path} got no answer within {self.timeout} s", backend=name
                ) from exc
            except MaybeSentError as exc:  # the engine may be running it: never sent again
                await self._abort(abort, "connection lost")
                raise BackendConnectionError(
                    f"{name}: connection to {self.base_url} failed during {method} {path} (not retried: the "
                    f"server may have received it): {exc}",
                    backend=name,
                ) from exc
            except BodyTooLargeError as exc:
                await self._abort(abort, "answer too large")
                raise ResponseTooLargeError(
                    f"{name}: {method} {path}: {exc} (raise the backend option max_response_bytes if the "
                    "engine legitimately sends more)",
                    field="body",
                    value=exc.size if exc.size is not None else f">{exc.limit}",
                    backend=name,
                ) from exc
            except FramingError as exc:
                await self._abort(abort, "answer malformed")
                raise BackendResponseError(
                    f"{name}: {method} {path}: {exc}", field="http", value=str(exc)[:300], backend=name
                ) from exc
            else:
                status = response.status
                if 200 <= status < 300:
                    return response.body
                text = truncate(response.body.decode("utf-8", errors="replace"))
                if status not in THROTTLE_STATUSES:
                    raise status_error(name, method, path, status, text, self._context_re)
                error = BackendThrottledError(
                    f"{name}: server is overloaded (HTTP {status}) on {method} {path}",
                    status=status,
                    body=text,
                    backend=name,
                )
                retry_after = retry_after_of(response)

            delay = policy.delay(attempt)
            if retry_after is not None:
                delay = min(max(delay, retry_after), policy.max_delay)
            elapsed = max(time.monotonic() - start, slept)
            if attempt >= policy.max_attempts or elapsed + delay > policy.max_total:
                raise error
            logger.debug(
                "%s: retrying %s %s in %.2fs (attempt %d/%d): %s",
                name, method, path, delay, attempt + 1, policy.max_attempts, error,
            )  # fmt: skip
            slept += delay
            await _sleep(delay)

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

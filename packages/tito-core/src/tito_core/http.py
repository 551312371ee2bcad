"""Shared async HTTP plumbing for engine adapters: one retry place, one error mapping, bounded answers.

:class:`HttpClient` posts JSON bodies (already encoded, as bytes) to an inference server through a
:mod:`tito_core.transport` (aiohttp by default, httpx for a client or transport the user passes) and maps
failures onto tito's error hierarchy. :class:`HttpBackend` is the base class of the HTTP adapters: the
connection options every engine shares, parsed once.

What is retried. Only answers that prove the engine did not start the request, with the same body (so
the same request id), at most ``RetryPolicy.max_attempts`` attempts within ``RetryPolicy.max_total``
seconds, with exponential backoff and jitter:

* no connection could be made (refused, DNS, connect timeout, TLS handshake, proxy refused): nothing
  was sent;
* the server answered 429 or 503 (it refused the work); ``Retry-After`` is honoured up to
  ``RetryPolicy.max_delay``.

Never retried: a connection lost once the request was (maybe) written, a timeout, a malformed or
oversized answer, any other status. Whenever the request was sent and no valid answer was accepted
(timeout, cancellation, connection lost, framing violation, body too large) the caller's ``abort``
callback is run first (shielded from cancellation, bounded to 5 s, its failure logged), so the engine
stops the generation; then the typed error (or the cancellation) propagates.

| failure                                          | raised                              | retried |
|--------------------------------------------------|-------------------------------------|---------|
| refused / DNS / connect timeout / TLS handshake  | BackendConnectionError              | yes     |
| 429, 503                                         | BackendThrottledError (after tries) | yes     |
| 400/413/422 saying the prompt is too long        | ContextLengthError                  | no      |
| other non-2xx                                    | BackendError(status=, body=)        | no      |
| connection lost after sending, body cut short    | BackendConnectionError (abort)      | no      |
| no complete answer within ``timeout``            | BackendTimeoutError (abort)         | no      |
| malformed HTTP (Content-Length, status, chunks)  | BackendResponseError(field="http")  | no      |
| body larger than the limit                       | ResponseTooLargeError (abort)       | no      |
| cancellation                                     | CancelledError (abort)              | no      |

Retry budget with Strands. Strands' ``ModelRetryStrategy`` retries a model call that raised
``ModelThrottledException`` (by default 6 attempts with growing delays). tito's
:class:`~tito_core.errors.BackendThrottledError` deliberately is *not* one, so by default the combined
budget is tito's policy alone: at most ``max_attempts`` (4) HTTP attempts within ``max_total`` (30 s)
per model call, instead of tito's attempts times Strands'. A user who wants Strands to retry further
can catch ``BackendThrottledError`` in a hook; each Strands retry then runs a new model call (a new
request id) with tito's full policy again.

Answer size. Every request has a body limit: ``max_body`` per call, else the client's default
(:data:`DEFAULT_MAX_BODY`). Adapters derive the limit of a generation from the request with
:func:`response_byte_limit` unless the backend option ``max_response_bytes`` fixes it. The body is read
with a running count and the connection dropped past the limit, so a huge answer never sits in memory.

One :class:`HttpClient` may be used from any event loop: it keeps one transport per loop and forgets
the transports of loops that have been closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import inspect
import logging
import random
import re
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypedDict
from urllib.parse import urlsplit

import msgspec

from tito_core.backend import Backend, GenerateRequest
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
from tito_core.transport import (
    AiohttpTransport,
    BodyTooLargeError,
    FramingError,
    HttpxTransport,
    MaybeSentError,
    NotSentError,
    Response,
    Transport,
    TransportTimeout,
    Verify,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_CONTEXT_LENGTH_PATTERNS",
    "DEFAULT_MAX_BODY",
    "AbortCallback",
    "HttpBackend",
    "HttpClient",
    "HttpOptions",
    "RetryPolicy",
    "check_base_url",
    "response_byte_limit",
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

DEFAULT_MAX_BODY: Final = 64 * 1024 * 1024
"""Body limit of a request that names none (server info, model lists, ...): 64 MiB."""

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


# -- configuration checks --------------------------------------------------------------------------

_SCHEMES: Final = ("http", "https")


def check_base_url(url: str) -> str:
    """Return ``url`` without a trailing ``/`` if it is a server root, else raise :class:`ConfigError`.

    A server root is ``http://host[:port]`` or ``https://host[:port]``: tito appends the engine's API
    paths (``/generate``, ``/v1/completions``, ...) itself. The message names the mistake and the fix.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"base_url must be a server URL such as 'http://127.0.0.1:8000', got {url!r}")
    text = url.strip()
    if "://" not in text:
        raise ConfigError(f"base_url {url!r} has no scheme: write 'http://{text.rstrip('/')}' (or https://)")
    parts = urlsplit(text)
    if parts.scheme.lower() not in _SCHEMES:
        raise ConfigError(
            f"base_url {url!r} uses the unsupported scheme {parts.scheme!r}: tito speaks http:// and https://"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"base_url {url!r} has a bad port: {exc}") from None
    if not parts.hostname:
        raise ConfigError(f"base_url {url!r} has no host: write e.g. '{parts.scheme}://127.0.0.1:8000'")
    root = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if path.lower() == "/v1":
        raise ConfigError(
            f"base_url {url!r} ends in /v1: give the server root {root!r}; tito adds /v1/... (and the "
            "engine's native paths) itself"
        )
    if path or parts.query or parts.fragment:
        raise ConfigError(
            f"base_url {url!r} has a path ({parts.path!r}): give the server root {root!r}; tito adds the "
            "API paths itself"
        )
    return root


def response_byte_limit(
    max_new_tokens: int | None,
    *,
    echoed_tokens: int = 0,
    logprobs: bool = True,
    prompt_logprob_tokens: int = 0,
    routed_expert_tokens: int = 0,
    context_length: int | None = None,
    per_token: int = 1024,
    per_token_no_logprobs: int = 128,
    per_echoed_token: int = 16,
    per_routed_expert_token: int = 16 * 1024,
    overhead: int = 1024 * 1024,
) -> int:
    """A generous upper bound of the answer body of one generation, in bytes.

    Per output token: an id, its text (JSON-escaped, up to tens of bytes), and with logprobs the logprob
    entry (vLLM's chat entries carry the token's bytes, SGLang's a triple): ``per_token`` bytes with
    logprobs, ``per_token_no_logprobs`` without. Per token echoed back (prompt ids): ``per_echoed_token``;
    per prompt token with a logprob: ``per_token``; per token with routed experts (base64 of
    ``layers x top_k`` int32): ``per_routed_expert_token``. Plus a fixed ``overhead`` for the envelope,
    usage and metadata. Without ``max_new_tokens`` the output is bounded by ``context_length`` (or 128k
    tokens when unknown).

    An answer past this is not a generation of that request; the backend option ``max_response_bytes``
    replaces the derived limit when an engine legitimately sends more.
    """
    if max_new_tokens is None or max_new_tokens < 0:
        max_new_tokens = context_length if context_length is not None and context_length > 0 else 131_072
    out = max_new_tokens * (per_token if logprobs else per_token_no_logprobs)
    return (
        overhead
        + out
        + max(0, echoed_tokens) * per_echoed_token
        + max(0, prompt_logprob_tokens) * per_token
        + max(0, routed_expert_tokens) * per_routed_expert_token
    )


# -- the client ------------------------------------------------------------------------------------


def _truncate(text: str) -> str:
    if len(text) <= _MAX_BODY_CHARS:
        return text
    return text[:_MAX_BODY_CHARS] + f"... [{len(text) - _MAX_BODY_CHARS} more characters]"


def _retry_after(response: Response) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigError(f"header {name!r}: names and values must be strings")
        if any(c in f"{name}{value}" for c in "\r\n\0"):
            raise ConfigError(f"header {name!r} contains a line break or NUL")
    return dict(headers)


class _LoopTransport:
    """A transport bound to one event loop (held weakly, so dead loops are noticed), closed when the loop ends.

    Made inside a running loop, it starts an async generator that does nothing until it is closed: the loop
    registers it, and ``asyncio.run`` (any runner calling ``loop.shutdown_asyncgens()``) closes it before the
    loop closes, which closes the transport on its own loop: no "Unclosed client session" is left behind. A
    loop closed without that step leaves the transport to :meth:`discard` (its connections cannot be awaited
    anymore; it is let go without warnings).
    """

    __slots__ = ("closer", "loop_ref", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Transport) -> None:
        self.loop_ref = weakref.ref(loop)
        self.transport = transport
        self.closer = _close_with_loop(self)
        with contextlib.suppress(StopIteration):
            self.closer.asend(None).send(None)  # runs to its ``yield``: the running loop now holds it

    def alive(self) -> bool:
        loop = self.loop_ref()
        return loop is not None and not loop.is_closed()

    def discard(self) -> None:
        """Let go of the transport of a loop that is gone, without awaiting anything."""
        self.transport.abandon()
        with contextlib.suppress(StopIteration, RuntimeError):
            self.closer.aclose().send(None)  # finishes the generator here, so no loop is asked to close it


def _discard_dead(transports: dict[int, _LoopTransport]) -> None:
    """When a client goes away: let go of the transports of loops already closed (a running loop closes its own)."""
    for entry in list(transports.values()):
        if not entry.alive():
            entry.discard()


async def _close_with_loop(entry: _LoopTransport) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        if entry.alive():
            await entry.transport.aclose()


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
        transport: An ``httpx`` transport to send through (a client per event loop is made over it).
        max_body: Default body limit of an answer, in bytes (None: unbounded).
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
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        verify: Verify = True,
        trust_env: bool = True,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_body: int | None = DEFAULT_MAX_BODY,
        context_length_patterns: Sequence[str] = DEFAULT_CONTEXT_LENGTH_PATTERNS,
    ) -> None:
        if max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {max_connections}")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds (or None for no limit), got {timeout}")
        if connect_timeout <= 0:
            raise ConfigError(f"connect_timeout must be > 0 seconds, got {connect_timeout}")
        if client is not None and transport is not None:
            raise ConfigError("give either client= (an httpx.AsyncClient) or transport= (an httpx transport)")
        self.base_url = check_base_url(base_url)
        self.backend_name = backend_name
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.retry = _retry_policy(retry)
        self.headers = {"content-type": "application/json", **_check_headers(headers or {})}
        self.verify = verify
        self.trust_env = trust_env
        self.max_body = max_body
        self._client = client
        self._httpx_transport = transport
        self._context_re = re.compile("|".join(f"(?:{p})" for p in context_length_patterns), re.IGNORECASE)
        self._transports: dict[int, _LoopTransport] = {}
        self._background: set[asyncio.Task[None]] = set()
        weakref.finalize(self, _discard_dead, self._transports)

    def __repr__(self) -> str:
        return f"HttpClient({self.base_url!r}, backend_name={self.backend_name!r})"

    # -- transports per event loop ------------------------------------------------------------

    def _transport(self) -> Transport:
        loop = asyncio.get_running_loop()
        key = id(loop)
        entry = self._transports.get(key)
        if entry is not None and entry.loop_ref() is loop and not loop.is_closed():
            return entry.transport
        # Drop the transports of loops that are gone (their connections cannot be used or awaited anymore).
        for stale in [k for k, e in self._transports.items() if not e.alive() or k == key]:
            self._transports.pop(stale).discard()
        transport: Transport
        if self._client is None and self._httpx_transport is None:
            transport = AiohttpTransport(
                self.base_url,
                headers=self.headers,
                max_connections=self.max_connections,
                connect_timeout=self.connect_timeout,
                verify=self.verify,
                trust_env=self.trust_env,
            )
        else:
            transport = HttpxTransport(
                self.base_url,
                client=self._client,
                transport=self._httpx_transport,
                headers=self.headers,
                connect_timeout=self.connect_timeout,
                verify=self.verify,
                trust_env=self.trust_env,
            )
        self._transports[key] = _LoopTransport(loop, transport)
        return transport

    async def aclose(self) -> None:
        """Close the current loop's transport; forget the transports of other loops."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - called outside a loop
            loop = None
        transports = list(self._transports.values())
        self._transports.clear()
        for entry in transports:
            if loop is not None and entry.loop_ref() is loop:
                await entry.transport.aclose()
            elif not entry.alive():
                entry.discard()

    # -- requests -----------------------------------------------------------------------------

    async def post(
        self, path: str, body: bytes, *, abort: AbortCallback | None = None, max_body: int | None = None
    ) -> bytes:
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
        return await self._request("POST", path, body, abort, max_body)

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
                response = await self._transport().request(method, path, body, timeout=self.timeout, max_body=limit)
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
                text = _truncate(response.body.decode("utf-8", errors="replace"))
                if status not in _THROTTLE_STATUSES:
                    raise self._status_error(method, path, status, text)
                error = BackendThrottledError(
                    f"{name}: server is overloaded (HTTP {status}) on {method} {path}",
                    status=status,
                    body=text,
                    backend=name,
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
                name, method, path, delay, attempt + 1, policy.max_attempts, error,
            )  # fmt: skip
            slept += delay
            await _sleep(delay)

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


def _retry_policy(retry: RetryPolicy | Mapping[str, Any] | None) -> RetryPolicy:
    if retry is None:
        return RetryPolicy()
    if isinstance(retry, RetryPolicy):
        return retry
    if isinstance(retry, Mapping):
        fields = ", ".join(RetryPolicy.__struct_fields__)
        unknown = sorted(set(retry) - set(RetryPolicy.__struct_fields__))
        if unknown:
            raise ConfigError(f"unknown retry policy field(s) {', '.join(map(repr, unknown))}; valid: {fields}")
        try:
            return msgspec.convert(dict(retry), RetryPolicy)
        except (msgspec.ValidationError, ValueError, TypeError) as exc:
            raise ConfigError(f"bad retry policy {dict(retry)!r}: {exc} (fields: {fields})") from None
    raise ConfigError(f"retry must be a RetryPolicy or a mapping, got {type(retry).__name__}")


# -- the adapters' base ----------------------------------------------------------------------------


class HttpOptions(TypedDict, total=False):
    """The connection options every HTTP adapter takes (see :class:`HttpBackend`), for ``**options`` typing."""

    timeout: float | None
    connect_timeout: float
    max_connections: int
    retry: RetryPolicy | Mapping[str, Any] | None
    headers: Mapping[str, str] | None
    api_key: str | None
    verify: Verify
    trust_env: bool
    client: httpx.AsyncClient | None
    transport: httpx.AsyncBaseTransport | None
    max_response_bytes: int | None


class HttpBackend(Backend):
    """Base class of the adapters that reach their engine over HTTP: the shared options, parsed once.

    Args:
        base_url: Server root (``http://host:port``); ``default_base_url`` when None.
        timeout: Seconds one request may take in all; None for no limit.
        connect_timeout: Seconds to open one connection.
        max_connections: Connections open at once per event loop.
        retry: Retry policy (a :class:`RetryPolicy` or a mapping of its fields) for connection failures
            and 429 / 503 answers.
        headers: Extra headers sent with every request.
        api_key: Sent as ``Authorization: Bearer ...`` (unless ``headers`` has an Authorization).
        verify: TLS verification: True, False, a CA bundle path or an ``ssl.SSLContext``.
        trust_env: Honour ``HTTP(S)_PROXY`` / ``NO_PROXY``.
        client: An ``httpx.AsyncClient`` to send through instead of aiohttp (not closed by tito).
        transport: An ``httpx`` transport to send through instead of aiohttp (tests, proxies, mounts).
        max_response_bytes: Body limit of a generation's answer; None derives it from the request
            (:func:`response_byte_limit`).

    A subclass adds its own options and takes these as ``**options: Unpack[HttpOptions]``; its signature
    (``inspect.signature``) then lists them all, so the plugin registry names a misspelt option.
    """

    default_base_url: ClassVar[str] = "http://127.0.0.1:8000"

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float | None = 600.0,
        connect_timeout: float = 5.0,
        max_connections: int = 1024,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
        verify: Verify = True,
        trust_env: bool = True,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_response_bytes: int | None = None,
    ) -> None:
        all_headers = _check_headers(headers or {})
        if api_key and not any(k.lower() == "authorization" for k in all_headers):
            all_headers["authorization"] = f"Bearer {api_key}"
        if max_response_bytes is not None and max_response_bytes < 1:
            raise ConfigError(f"max_response_bytes must be >= 1 (or None), got {max_response_bytes}")
        self.base_url = check_base_url(base_url if base_url is not None else self.default_base_url)
        self.max_response_bytes = max_response_bytes
        self._http = HttpClient(
            self.base_url,
            backend_name=self.name,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            retry=retry,
            headers=all_headers,
            verify=verify,
            trust_env=trust_env,
            client=client,
            transport=transport,
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = _merged_signature(cls)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    @property
    def http(self) -> HttpClient:
        """The underlying HTTP client (shared plumbing: pooling, retries, error mapping)."""
        return self._http

    def response_limit(
        self,
        request: GenerateRequest,
        *,
        echoed_tokens: int = 0,
        prompt_logprob_tokens: int = 0,
        routed_expert_tokens: int = 0,
        context_length: int | None = None,
    ) -> int:
        """Body limit for the answer to ``request``: ``max_response_bytes``, else :func:`response_byte_limit`."""
        if self.max_response_bytes is not None:
            return self.max_response_bytes
        return response_byte_limit(
            request.sampling.max_new_tokens,
            echoed_tokens=echoed_tokens,
            logprobs=request.return_logprobs,
            prompt_logprob_tokens=prompt_logprob_tokens,
            routed_expert_tokens=routed_expert_tokens,
            context_length=context_length,
        )

    async def aclose(self) -> None:
        """Close the connections of the current event loop."""
        await self._http.aclose()


def _merged_signature(cls: type) -> inspect.Signature:
    """The signature of ``cls(...)``: its own ``__init__`` parameters, ``**options`` spelled out.

    When the subclass ``__init__`` takes ``**options`` (passed on to :class:`HttpBackend`), they are
    replaced by :class:`HttpBackend`'s keyword parameters, so ``inspect.signature(cls).bind(...)`` rejects
    an unknown option (the plugin registry turns that into a ``ConfigError`` listing the valid ones).
    """
    own = list(inspect.signature(cls.__init__).parameters.values())[1:]  # type: ignore[misc]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own):
        return inspect.Signature(own)
    params = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in params}
    base = list(inspect.signature(HttpBackend.__init__).parameters.values())[1:]
    params += [p for p in base if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in names]
    return inspect.Signature(params)

"""Error classification: library exceptions to transport errors, engine answers to tito errors.

By type wherever the library offers one. Where it offers none, by message text, and every text tito relies
on sits in a table, each entry pinned by a test against the real library or the engine's recorded answers, so
an upgrade that changes a text fails a test instead of silently misclassifying:

* :data:`LIBRARY_TEXTS` (here, pinned by ``tests/core/test_error_texts.py`` and
  ``tests/core/test_aiohttp_compat.py``): how aiohttp and httpx say "the connection ended inside the answer"
  (the engine may be running the request: never re-sent) rather than "the answer is malformed";
* an engine's "the prompt does not fit the context window" in the body of a 400: its adapter's own table, the
  :attr:`~tito_core.http.HttpBackend.context_length_texts` it declares (the core knows no engine's wording), pinned
  in the adapter's tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

from tito_core.errors import BackendError, ContextLengthError
from tito_core.http.transport import FramingError, MaybeSentError, NotSentError, TransportError, TransportTimeout

__all__ = [
    "CONTEXT_STATUSES",
    "LIBRARY_TEXTS",
    "THROTTLE_STATUSES",
    "context_pattern",
    "from_aiohttp",
    "from_httpx",
    "status_error",
    "truncate",
]

LIBRARY_TEXTS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        # aiohttp (3.10-3.14) raises ClientPayloadError both for a body cut short by the connection's end and
        # for a malformed body (bad chunk); only the text tells them apart.
        "aiohttp.ClientPayloadError": ("Response payload is not completed",),
        # httpx (httpcore 1.x, h11 0.14-0.16) raises RemoteProtocolError both for a connection closed early and
        # for a malformed answer.
        "httpx.RemoteProtocolError": (
            "Server disconnected",  # httpcore: closed before or inside the head ("... without sending a response.")
            "peer closed connection without sending complete message body",  # h11: closed inside the body
            "peer unexpectedly closed connection",  # h11: closed inside the head (httpcore says the first instead)
        ),
    }
)
"""Per library exception (``"<library>.<class>"``), the texts (matched ignoring case) that mean the connection
ended mid-answer."""

THROTTLE_STATUSES: Final = frozenset({429, 503})
"""Statuses that mean the server refused the work (retried)."""
CONTEXT_STATUSES: Final = frozenset({400, 413, 422})
"""Statuses whose body may say that the prompt is too long."""
_MAX_BODY_CHARS: Final = 4096


def _says(exc: BaseException, name: str) -> bool:
    """Whether ``exc``'s message holds one of the :data:`LIBRARY_TEXTS` of ``name`` (ignoring case)."""
    text = str(exc).lower()
    return any(phrase.lower() in text for phrase in LIBRARY_TEXTS[name])


def from_aiohttp(exc: BaseException, base_url: str) -> TransportError:
    """The transport error for an ``aiohttp.ClientError`` or ``OSError`` raised by a request to ``base_url``."""
    import aiohttp

    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
        return NotSentError(f"cannot connect to {base_url}: {exc}")
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy refused the tunnel
        return NotSentError(f"proxy refused the connection to {base_url}: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError):  # the head did not parse
        return FramingError(f"malformed answer: {exc.message}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        if _says(exc, "aiohttp.ClientPayloadError"):  # the connection ended inside the body
            return MaybeSentError(f"answer cut short: {exc}")
        return FramingError(f"malformed answer body: {exc}")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return TransportTimeout(str(exc))
    if isinstance(exc, (aiohttp.ClientConnectionError, OSError)):  # ServerDisconnectedError, ClientOSError, ...
        return MaybeSentError(f"connection lost: {exc!r}")
    return MaybeSentError(f"{type(exc).__name__}: {exc}")  # anything else: assume the worst, never re-sent


def from_httpx(exc: BaseException, base_url: str) -> TransportError:
    """The transport error for an ``httpx.TransportError`` or ``httpx.DecodingError`` from ``base_url``."""
    import httpx

    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError)):
        return NotSentError(f"cannot connect to {base_url}: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return TransportTimeout(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.RemoteProtocolError):
        if _says(exc, "httpx.RemoteProtocolError"):
            return MaybeSentError(f"connection lost: {exc}")
        return FramingError(f"malformed answer: {exc}")
    if isinstance(exc, httpx.NetworkError):  # ReadError, WriteError, CloseError
        return MaybeSentError(f"connection lost: {exc!r}")
    if isinstance(exc, httpx.DecodingError):
        return FramingError(f"malformed answer body: {exc}")
    return MaybeSentError(f"{type(exc).__name__}: {exc}")


# -- engine answers ---------------------------------------------------------------------------------


def context_pattern(patterns: Sequence[str]) -> re.Pattern[str]:
    """One case-insensitive regex matching any of ``patterns`` (none: a regex that matches nothing)."""
    if not patterns:
        return re.compile(r"(?!)")
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)


def truncate(text: str) -> str:
    """An error body cut to 4096 characters, saying how much was left out."""
    if len(text) <= _MAX_BODY_CHARS:
        return text
    return text[:_MAX_BODY_CHARS] + f"... [{len(text) - _MAX_BODY_CHARS} more characters]"


def status_error(
    backend: str, method: str, path: str, status: int, text: str, context: re.Pattern[str]
) -> BackendError:
    """The error for a non-2xx, non-throttling answer: :class:`ContextLengthError` when the body says so."""
    if status in CONTEXT_STATUSES and context.search(text):
        return ContextLengthError(
            f"{backend}: prompt does not fit the context window (HTTP {status}): {text[:300]}",
            status=status,
            body=text,
            backend=backend,
        )
    return BackendError(
        f"{backend}: {method} {path} failed with HTTP {status}: {text[:300]}",
        status=status,
        body=text,
        backend=backend,
    )

"""Shared async HTTP plumbing for engine adapters: one retry place, one error mapping, bounded answers.

:class:`HttpClient` posts JSON bodies (already encoded, as bytes) to an inference server through a
:class:`~tito_core.http.transport.Transport` (aiohttp by default, httpx for a client or transport the user
passes, or any transport given) and maps failures onto tito's error hierarchy. :class:`HttpBackend` is the
base class of the HTTP adapters: the connection options every engine shares, parsed once.

One module per job, under ``tito_core/http/``: ``client`` (the client), ``backend`` (the adapters' base),
``retry`` (the retry policy), ``urls`` (URL and header checks), ``limits`` (answer sizes),
:mod:`~tito_core.http.errors` (error classification, with its two tables of texts), ``loops`` (a transport
per event loop), :mod:`~tito_core.http.transport` (the transport seam) and its two implementations
(:mod:`~tito_core.http.aiohttp_transport`, :mod:`~tito_core.http.httpx_transport`), ``_aiohttp`` (every
aiohttp private name tito uses), and :mod:`~tito_core.http.ids_json` (each sequence's ids as JSON, extended per
call: the adapters' wire encoding of a growing prompt).

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
| 400/413/422 in an engine's too-long wording      | ContextLengthError                  | no      |
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

from tito_core.http.backend import HttpBackend, HttpOptions
from tito_core.http.client import AbortCallback, HttpClient
from tito_core.http.ids_json import IdsJson
from tito_core.http.limits import DEFAULT_MAX_BODY, response_byte_limit
from tito_core.http.retry import RetryPolicy
from tito_core.http.urls import check_base_url

__all__ = [
    "DEFAULT_MAX_BODY",
    "AbortCallback",
    "HttpBackend",
    "HttpClient",
    "HttpOptions",
    "IdsJson",
    "RetryPolicy",
    "check_base_url",
    "response_byte_limit",
]

"""Typed errors raised by tito.

Every error is a :class:`TitoError`. Errors that Strands knows how to handle also inherit the Strands
exception, so the agent loop reacts to them as it would for any other model provider: a
:class:`ContextLengthError` is a ``ContextWindowOverflowException`` (Strands reduces the context and
retries) and a :class:`BackendThrottledError` is a ``ModelThrottledException`` (Strands backs off).
"""

from __future__ import annotations

from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException


class TitoError(Exception):
    """Base class of every error raised by tito."""


class ConfigError(TitoError, ValueError):
    """A configuration value is missing, of the wrong type, or unknown."""


class UnknownPluginError(ConfigError, LookupError):
    """No installed plugin provides the requested backend or tool parser."""

    def __init__(self, kind: str, name: str, available: list[str], hint: str | None = None) -> None:
        self.kind = kind
        self.name = name
        self.available = sorted(available)
        listing = ", ".join(self.available) or "none"
        message = f"unknown {kind} {name!r}; installed {kind}s: {listing}"
        if hint:
            message += f". {hint}"
        super().__init__(message)


class UnsupportedContentError(TitoError, ValueError):
    """A Strands message holds a content block tito cannot turn into tokens."""


class TemplateError(TitoError):
    """The chat template rendered something tito cannot use safely.

    Raised, for example, when rendering new messages after a dummy prefix does not give a clean
    suffix of the dummy render, so the new prompt tokens cannot be isolated exactly.
    """


class TrajectoryError(TitoError):
    """A trajectory was asked to do something that would corrupt it (e.g. grow after it was closed)."""


class BackendError(TitoError):
    """The inference engine failed a request.

    Attributes:
        status: HTTP status code, when the failure came from an HTTP response.
        body: The response body (possibly truncated), when there was one.
        backend: Name of the backend that raised it.
    """

    def __init__(
        self, message: str, *, status: int | None = None, body: str | None = None, backend: str | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.backend = backend
        super().__init__(message)


class BackendConnectionError(BackendError):
    """The engine could not be reached (connection refused, DNS, reset before a response)."""


class BackendTimeoutError(BackendError):
    """The engine did not answer within the configured time; the request was aborted."""


class BackendResponseError(BackendError):
    """The engine answered, but the answer is malformed or inconsistent (e.g. logprobs misaligned)."""


class BackendThrottledError(BackendError, ModelThrottledException):
    """The engine is overloaded (HTTP 429 / 503). Strands retries these with backoff."""

    def __init__(self, message: str, **kwargs: object) -> None:
        BackendError.__init__(self, message, **kwargs)  # type: ignore[arg-type]
        self.message = message


class ContextLengthError(BackendError, ContextWindowOverflowException):
    """The request does not fit in the model's context window."""


class PrefixMismatchError(TitoError):
    """A server-rendered prompt does not extend the trajectory recorded so far.

    Attributes:
        position: Index of the first token that differs.
        expected: A few recorded tokens around ``position``.
        actual: The server's tokens around ``position``.
    """

    def __init__(self, message: str, *, position: int, expected: list[int], actual: list[int]) -> None:
        self.position = position
        self.expected = expected
        self.actual = actual
        super().__init__(message)

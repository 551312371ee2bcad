"""Typed errors raised by tito.

Every error is a :class:`TitoError`, and this module imports no framework: the rollout core, the adapters and
the gateway use it without Strands. The Strands front (:class:`~tito_core.strands_front.model.TitoModel`) raises
a context overflow (:class:`ContextLengthError`, :class:`ContextWindowFullError`) as one that is also Strands'
``ContextWindowOverflowException``, so a Strands conversation manager reduces the context and retries.

Retries of engine requests happen in one place, tito's HTTP client (:mod:`tito_core.http`), and only for
answers that prove the engine did not start the request. A :class:`BackendThrottledError` is raised once
those retries are spent; it is deliberately *not* a Strands ``ModelThrottledException``, so Strands'
``ModelRetryStrategy`` does not multiply tito's retries (see ``docs/reliability.md``).
"""

from __future__ import annotations

from typing import Any


class TitoError(Exception):
    """Base class of every error raised by tito."""


class ConfigError(TitoError, ValueError):
    """A configuration value is missing, of the wrong type, or unknown."""


class SamplingMaskError(ConfigError):
    """A truncating call on a backend that cannot return the kept sets, in the default ``exact`` mode.

    The call samples from a truncated distribution (top-k, top-p, min-p): its logprobs would be off by the kept mass,
    silently.

    Use a backend that returns sampling masks, sample without truncation, or opt out with
    ``sampling_masks="allow_missing"`` (each such turn then records ``sampling_mask_missing``).
    """


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


class LineageLabelError(TitoError, ValueError):
    """A lineage label (``X-Tito-Lineage``, Strands' ``tito_lineage``) tito does not take (length, characters)."""


class KeptSetLayoutError(TitoError, ValueError):
    """A sample's kept sets cannot be written in a trainer's layout without changing what it trains.

    slime's rows, for one, cannot say "the whole vocabulary": a trained token whose call did not truncate, or whose
    kept set is missing, has no row slime reads right. Export the sample in tito's layout instead
    (``kept_sets="tito"``).
    """


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


class BackendFieldError(BackendError):
    """A backend error about one field of a request or an answer (the base of the two below).

    Attributes:
        field: The field at fault (``"grammar"``, ``"sampling.extra.regex"``, ``"output_ids"``, ...), when one is.
        value: The offending value (or a short excerpt of it), when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: object = None,
        status: int | None = None,
        body: str | None = None,
        backend: str | None = None,
    ) -> None:
        self.field = field
        self.value = value
        super().__init__(message, status=status, body=body, backend=backend)


class BackendRequestError(BackendFieldError, ValueError):
    """The backend refused a request as invalid before generating anything (e.g. a grammar that does not compile).

    ``field`` is the request field at fault (``"grammar"``, ``"sampling.extra.regex"``, ...).
    """


class BackendResponseError(BackendFieldError):
    """The engine answered, but the answer is malformed or inconsistent (e.g. logprobs misaligned).

    Nothing of such an answer is recorded in the trajectory. ``field`` is the response field at fault
    (``"output_ids"``, ``"output_logprobs"``, ``"finish_reason"``, ``"meta_info.id"``, ``"content-length"``, ...).
    """


class ResponseTooLargeError(BackendResponseError):
    """The answer's body exceeded the size limit (derived from ``max_new_tokens``, or configured)."""


class BackendThrottledError(BackendError):
    """The engine stayed overloaded (HTTP 429 / 503) through every retry tito's policy allows.

    Not a Strands ``ModelThrottledException``: tito already retried with backoff, and Strands retrying
    again would multiply the attempts.
    """


class WeightUpdateError(BackendError):
    """A weight-update handshake failed: an engine refused the pause or the version, was left paused, or failed.

    It failed the weight probe: it does not serve the weights the trainer pushed.

    Attributes:
        paused: Names of the engines still paused when it was raised (empty when every one was resumed).
        probes: The failed weight-probe scores (:class:`tito_core.weights.ProbeScore`: engine, mean and max
            difference), empty when no probe failed on a difference.
    """

    def __init__(
        self,
        message: str,
        *,
        paused: list[str] | None = None,
        backend: str | None = None,
        probes: list[Any] | None = None,
    ) -> None:
        self.paused = list(paused or [])
        self.probes = list(probes or [])
        super().__init__(message, backend=backend)


class GenerationAbortedError(BackendError):
    """The engine aborted the generation (finish reason ``abort``); the tokens it produced are kept."""


class ContextLengthError(BackendError):
    """The request does not fit in the model's context window."""


class ContextWindowFullError(TitoError):
    """The trajectory leaves no room for a new generation in the context window; the rollout ends ``truncated``.

    Raised by the rollout core before anything is sent. Through ``TitoModel``, like :class:`ContextLengthError`,
    it is also a Strands ``ContextWindowOverflowException``, so a Strands conversation manager can reduce the
    context.
    """


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


def at_key(exc: Exception, root: str = "") -> str:
    """A msgspec validation message with its ``- at `$.a.b``` suffix written as the dotted key ``(at `root.a.b`)``.

    The one rewriter of validation paths: ``sampling`` (``root="sampling"``) and config files (``root`` is the
    file's table, ``tito`` or ``tool.tito``; empty for top-level keys) name a bad value by the key a user wrote.
    """
    head, sep, where = str(exc).rpartition(" - at `$")
    if not sep:
        return str(exc)
    key = ".".join(part for part in (root, where.rstrip("`").lstrip(".")) if part)
    return f"{head} (at `{key}`)" if key else head


class DatasetError(TitoError, ValueError):
    """A dataset of tasks cannot be read, or one of its rows is not a task (the message names the row)."""


class LoopLimitError(TitoError):
    """A rollout reached one of its loop limits (model calls, tool calls, messages); it ends ``truncated``."""

"""When to try a request again: the retry policy, its backoff, and the server's ``Retry-After``."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from tito_core.errors import ConfigError
from tito_core.http.transport import Response

__all__ = ["RetryPolicy", "retry_after", "retry_policy"]

# Indirection patched by tests (deterministic jitter).
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


def retry_policy(retry: RetryPolicy | Mapping[str, Any] | None) -> RetryPolicy:
    """``retry`` as a :class:`RetryPolicy` (None: the default; a mapping: its fields), else a ConfigError."""
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


def retry_after(response: Response) -> float | None:
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

"""The logprob gap: recorded (sampler's) logprobs against a trainer's recomputed ones, as mean / max / k3."""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

__all__ = ["LogprobGap", "logprob_gap"]


class LogprobGap(msgspec.Struct, frozen=True):
    """Recorded vs recomputed logprobs over a set of tokens.

    Attributes:
        tokens: How many tokens were compared.
        mean_abs: Mean of ``|new - old|`` (nats).
        max_abs: Largest ``|new - old|``.
        k3: Mean of ``exp(r) - 1 - r`` with ``r = new - old``: with tokens drawn by the sampler (``old``),
            an unbiased, non-negative estimate of KL(sampler || trainer).
        mean_diff: Mean of ``new - old`` (signed: positive when the trainer finds the tokens likelier).
    """

    tokens: int
    mean_abs: float
    max_abs: float
    k3: float
    mean_diff: float

    def as_dict(self) -> dict[str, float | int]:
        """The fields as a JSON-ready dict."""
        return msgspec.structs.asdict(self)


def logprob_gap(pairs: Iterable[tuple[float, float]]) -> LogprobGap:
    """Compare ``(old, new)`` logprob pairs: ``old`` recorded by the sampler, ``new`` recomputed by the trainer.

    An empty selection gives ``tokens=0`` and NaN statistics.
    """
    n = 0
    total_abs = total_diff = total_k3 = 0.0
    worst = 0.0
    for old, new in pairs:
        r = new - old
        n += 1
        total_abs += abs(r)
        total_diff += r
        # exp(r) - 1 - r, written with expm1 so tiny gaps are not lost to cancellation
        total_k3 += math.expm1(r) - r if r < 700 else math.inf
        worst = max(worst, abs(r))
    if n == 0:
        return LogprobGap(tokens=0, mean_abs=math.nan, max_abs=math.nan, k3=math.nan, mean_diff=math.nan)
    return LogprobGap(tokens=n, mean_abs=total_abs / n, max_abs=worst, k3=total_k3 / n, mean_diff=total_diff / n)

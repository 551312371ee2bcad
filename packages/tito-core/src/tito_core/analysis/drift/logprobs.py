"""The logprob gap: recorded (sampler's) logprobs against a trainer's recomputed ones.

The statistics are :func:`tito_core.analysis.audit.gap_stats`' (mean / max ``|new - old|``, the k3 KL estimate, the
importance-ratio quantiles), the one place they are computed; this is their form for ``(old, new)`` pairs.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..audit import GapStats, gap_stats

__all__ = ["LogprobGap", "logprob_gap"]

LogprobGap = GapStats
"""The gap of a set of tokens (:class:`tito_core.analysis.audit.GapStats`)."""


def logprob_gap(pairs: Iterable[tuple[float, float]]) -> GapStats:
    """Compare ``(old, new)`` logprob pairs: ``old`` recorded by the sampler, ``new`` recomputed by the trainer.

    An empty selection gives ``tokens=0`` and NaN statistics.
    """
    return gap_stats([new - old for old, new in pairs])

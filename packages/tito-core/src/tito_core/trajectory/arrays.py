"""A trajectory's token storage: int32 ids and logprobs in compact arrays, a segment appended whole or not at all.

Logprobs take 4 bytes each while every value is exactly a float32, else 8. Engines compute logprobs in float32
(vLLM and SGLang both do), so float32 storage keeps them bit for bit; the first value that float32 cannot hold
exactly widens the whole array to float64. No logprob is stored as NaN.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence

from ..errors import TrajectoryError

__all__ = ["NO_LOGPROB", "append_tokens", "extend_logprobs"]

NO_LOGPROB = math.nan
"""What stands for "the engine gave no logprob" in the array."""


def _same_values(a: list[float], b: list[float], *, nan_equal: bool) -> bool:
    """Whether two lists hold equal numbers (NaN equal to NaN where ``nan_equal``)."""
    if a == b:
        return True
    return nan_equal and len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))


def extend_logprobs(lps: array[float], logprobs: Sequence[float | None]) -> array[float]:
    """``lps`` with ``logprobs`` appended: ``lps`` itself, or a float64 copy when a value needs the width.

    Raises:
        TypeError, ValueError: a value is not a number or None (``lps`` is unchanged then).
    """
    if isinstance(logprobs, list) and None not in logprobs:
        values: list[float] = logprobs  # a list without None: numbers
        with_gaps = False
    else:  # None entries (no logprob) are stored as NaN
        values = [NO_LOGPROB if x is None else float(x) for x in logprobs]
        with_gaps = True
    if lps.typecode == "f":
        narrow = array("f", values)
        if _same_values(narrow.tolist(), values, nan_equal=with_gaps):
            lps.extend(narrow)
            return lps
        lps = array("d", lps)
    lps.fromlist(values)
    return lps


def append_tokens(
    ids: array[int], lps: array[float], kind: str, token_ids: Iterable[int], logprobs: Sequence[float | None] | None
) -> array[float]:
    """Append a segment's ids to ``ids`` and its logprobs (NaN where None / absent) to ``lps``; returns ``lps``.

    The returned logprob array is ``lps`` itself or its float64 widening (:func:`extend_logprobs`).

    Raises:
        TrajectoryError: a token id is not an int32 integer, or ``logprobs`` does not have one entry per token, or
            a logprob is not a number or None; ``ids`` and ``lps`` are left as they were.
    """
    start = len(ids)
    try:
        if isinstance(token_ids, list):
            ids.fromlist(token_ids)  # twice as fast as extend() for a list
        else:
            ids.extend(token_ids)
    except (TypeError, OverflowError) as exc:
        del ids[start:]  # extend() keeps the ids before the bad one
        raise TrajectoryError(f"{kind} segment token ids must be integers in int32 range: {exc}") from exc
    n = len(ids) - start
    if logprobs is None:
        lps.extend(array(lps.typecode, (NO_LOGPROB,)) * n)
        return lps
    if len(logprobs) != n:
        del ids[start:]
        raise TrajectoryError(f"{kind} segment has {n} tokens but {len(logprobs)} logprobs")
    try:
        return extend_logprobs(lps, logprobs)
    except (TypeError, ValueError) as exc:
        del ids[start:]
        raise TrajectoryError(f"{kind} segment logprobs must be numbers or None: {exc}") from exc

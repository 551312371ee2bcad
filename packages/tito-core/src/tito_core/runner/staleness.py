"""Staleness: how many weight versions a rollout's oldest generated token is behind the trainer's weights.

An asynchronous trainer keeps generating while it trains, so a rollout can be generated (in part or whole) by
weights older than the ones being trained. With ``rollout.current_version`` (the trainer's version) and
``rollout.max_staleness = N``, the runner computes each record's :func:`staleness` when it is written and, when
it exceeds ``N``, drops it or marks it (``rollout.stale``).

Only integer versions (a trainer's step, :func:`tito_core.versions.int_version`) can be counted apart: a
record whose oldest version is not an integer (``"default"``, a checkpoint name), a record with no versions
(the backend reported none) and any record under a non-integer current version have no staleness, and are
never stale. Label the weights with integers, the initial ones too, to have every rollout compared.
"""

from __future__ import annotations

import msgspec

from ..records import RolloutRecord
from ..versions import int_version

__all__ = ["current_int", "is_stale", "staleness", "with_staleness"]


def current_int(current: str | int | None) -> int | None:
    """The current version as an int: an int as it is, an integer's decimal text parsed, anything else None."""
    if isinstance(current, bool):
        return None
    if isinstance(current, int):
        return current
    return int_version(current)


def staleness(record: RolloutRecord, current: str | int | None) -> int | None:
    """``current`` minus the record's oldest version (``weight_version_min``); None when either is not an integer.

    Negative when the record is newer than ``current`` (a trainer that set it late).
    """
    now, oldest = current_int(current), int_version(record.weight_version_min)
    if now is None or oldest is None:
        return None
    return now - oldest


def is_stale(record: RolloutRecord, current: str | int | None, max_staleness: int | None) -> bool:
    """Whether the record's oldest token is more than ``max_staleness`` versions behind ``current``.

    False when ``max_staleness`` is None (off) or when the record has no :func:`staleness`.
    """
    if max_staleness is None:
        return False
    behind = staleness(record, current)
    return behind is not None and behind > max_staleness


def with_staleness(record: RolloutRecord, current: str | int | None, max_staleness: int | None) -> RolloutRecord:
    """``record`` with ``staleness`` and ``stale`` set against ``current`` (unchanged when ``current`` is None)."""
    if current is None:
        return record
    return msgspec.structs.replace(
        record, staleness=staleness(record, current), stale=is_stale(record, current, max_staleness)
    )

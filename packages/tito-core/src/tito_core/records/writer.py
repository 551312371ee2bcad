"""The interface every record writer has: an append-only, resumable sink that holds its output's lock.

:class:`RecordWriter` keeps what the output held when it was opened (keys, outcomes, advantage entries) and
what was written since; the file formats (`tito_core.records.jsonl`,
`tito_core.records.parquet`) implement the reading, appending and rewriting.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path

import msgspec

from ..trajectory.media import store_images
from .lock import OutputLock
from .schema import GroupAdvantages, Key, Outcome, RolloutRecord

__all__ = ["RecordWriter", "fsync_dir", "with_image_files"]


class RecordWriter(abc.ABC):
    """An append-only, resumable sink of :class:`RolloutRecord`; the same file format whoever writes it.

    It holds the output's :class:`OutputLock` from its creation to :meth:`close`.
    """

    path: Path
    _outcomes: dict[Key, Outcome]
    _done: set[Key]
    _lock: OutputLock | None = None

    def _take_lock(self, lock: OutputLock | None) -> None:
        """Hold ``lock`` (already taken on this output by the caller), or take the output's lock now."""
        if lock is not None and lock.output != self.path:
            raise ValueError(f"the lock given is for {lock.output}, not {self.path}")
        self._lock = lock if lock is not None else OutputLock(self.path)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _opened(self, outcomes: dict[Key, Outcome], advantages: dict[str, GroupAdvantages]) -> None:
        """Remember what the output held when it was opened (a failed group's records count as failed)."""
        for entry in advantages.values():
            if entry.error is not None:
                for key in [key for key in outcomes if key[0] == entry.task_id]:
                    outcomes[key] = ("failed", outcomes[key][1])
        self._outcomes = outcomes
        self._done = set(outcomes)
        self._advantages = advantages

    def advantages(self) -> dict[str, GroupAdvantages]:
        """The last :class:`GroupAdvantages` entry of each task in the output when it was opened."""
        return self._advantages

    @abc.abstractmethod
    def write_advantages(self, entry: GroupAdvantages) -> None:
        """Append a group's advantages (after its records; durable as the records are)."""

    def finished(self) -> set[Key]:
        """Keys of the records already in the output when it was opened (and written since)."""
        return self._done

    def outcomes(self) -> dict[Key, Outcome]:
        """Status and reward of each record in the output when it was opened (for the whole file's summary)."""
        return self._outcomes

    def remove(self, keys: set[Key]) -> None:
        """Drop these records from the output so that their rollouts run again (call it before any write).

        Each rewritten file is written under a temporary name, synced and renamed over the old one.
        """
        keys = keys & self._done
        if not keys:
            return
        self._remove(keys)
        for key in keys:
            del self._outcomes[key]
            self._done.discard(key)
        for task_id in {task_id for task_id, _ in keys}:
            self._advantages.pop(task_id, None)

    @abc.abstractmethod
    def _remove(self, keys: set[Key]) -> None:
        """Rewrite the output without the records of ``keys``."""

    @abc.abstractmethod
    def write(self, record: RolloutRecord) -> None:
        """Append one record (durable on return for JSONL; at the next row-group flush for Parquet)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush what is buffered and release the file."""

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def fsync_dir(path: Path) -> None:
    """Make renames and deletions in ``path`` durable (where the platform allows syncing a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def with_image_files(record: RolloutRecord, output: Path) -> RolloutRecord:
    """``record`` with its images stored next to ``output``, referenced by relative path.

    The bytes are written once per distinct image, before the record itself is written
    (:func:`tito_core.trajectory.media.store_images`); a text-only record is returned as it is.
    """
    stored = store_images(record.trajectory, output)
    return record if stored is record.trajectory else msgspec.structs.replace(record, trajectory=stored)

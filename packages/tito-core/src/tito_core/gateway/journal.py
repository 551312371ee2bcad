"""A gateway worker's write-ahead journal: what it answered is in a file before the answer goes out.

One JSON line per event, each written with one ``write`` call on a file opened ``O_APPEND``:

* ``open``: a rollout was opened (its id, task, sample, group, metadata, start time, the worker's address),
  written before ``POST /rollouts`` answers;
* ``call``: a model call was answered: the rollout's whole trajectory as it stands then, written after the call
  was recorded and before its answer is sent;
* ``end``: the rollout's record was written to the output (by the supervisor), so the journal no longer matters
  for it.

A ``write`` that returned is in the kernel: it outlives the process (``kill -9``, the OOM killer), not a power
cut (``fsync=True`` syncs each line, at the cost of a disk flush per call). A line torn by a kill mid-``write``
was never acknowledged to anyone (its answer had not gone out) and is skipped. The file is compacted as it grows
(:class:`Journal`): it holds the open rollouts' last states, not the worker's history.

:func:`lost_records` is the supervisor's side: the record of every rollout the journal opened and did not end,
with its last answered trajectory, its open branches ``failed`` with the reason given ("gateway worker lost").
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from ..records import Key, RolloutRecord, rollout_record
from ..status import WorkerLost, status_of
from ..trajectory import Trajectory, TrajectoryRecord
from .registry import GatewayRollout

__all__ = ["Journal", "lost_records"]

logger = logging.getLogger("tito")


class Opened(msgspec.Struct, frozen=True, tag="open"):
    """A rollout opened on the worker."""

    id: str
    task_id: str
    sample: int
    group: int
    started: float
    server: str
    metadata: dict[str, Any] = {}


class Answered(msgspec.Struct, frozen=True, tag="call"):
    """A call answered on rollout ``id``: its trajectory then, and the tool calls its outputs asked for."""

    id: str
    tool_calls: int
    trajectory: TrajectoryRecord


class Ended(msgspec.Struct, frozen=True, tag="end"):
    """Rollout ``id``'s record is in the output."""

    id: str


Entry = Opened | Answered | Ended
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Entry)


class Journal:
    """The journal file of one worker, appended to (made if missing), compacted as it grows.

    Once the file passes ``rotate_bytes`` (and twice its size after the last compaction), it is rewritten with only
    what an open rollout needs (its ``open`` line and its last ``call`` line, copied byte for byte) under a temporary
    name, then renamed over the old one: a kill leaves either file whole, and the journal stays as large as the
    open rollouts' last states, however long the worker serves.

    Args:
        path: The file.
        fsync: Sync each line to the disk before returning (survives a power cut too; one disk flush per call).
        rotate_bytes: The size past which the file is compacted.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False, rotate_bytes: int = 64 << 20) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.rotate_bytes = rotate_bytes
        self._fd: int | None = self._open()
        self._size = os.fstat(self._fd).st_size
        self._compacted = 0  # the size right after the last compaction
        self._kept: dict[str, list[tuple[int, int]]] = {}  # open rollout -> (offset, length) of its open, last call

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)

    def opened(self, rollout: GatewayRollout, server: str) -> None:
        """Journal a rollout just opened (before its id and token are answered)."""
        meta = rollout.metadata
        entry = Opened(rollout.id, rollout.task_id, rollout.sample, rollout.group, rollout.started, server, meta)
        self._kept[rollout.id] = [self._append(entry)]

    def answered(self, rollout: GatewayRollout) -> None:
        """Journal a call just recorded on ``rollout`` (before its answer is sent)."""
        span = self._append(Answered(rollout.id, rollout.tool_calls, rollout.core.trajectory.to_record()))
        kept = self._kept.get(rollout.id)
        if kept is not None:
            kept[1:] = [span]

    def ended(self, rollout_id: str) -> None:
        """Journal that the rollout's record is written."""
        self._append(Ended(rollout_id))
        self._kept.pop(rollout_id, None)

    def _append(self, entry: Entry) -> tuple[int, int]:
        if self._fd is None:
            raise OSError(f"the journal {self.path} is closed")
        if self._size >= max(self.rotate_bytes, 2 * self._compacted):
            self.compact()
        data = _ENCODER.encode(entry) + b"\n"
        span = (self._size, len(data))
        line = memoryview(data)
        while line:
            line = line[os.write(self._fd, line) :]
        self._size += len(data)
        if self.fsync:
            os.fsync(self._fd)
        return span

    def compact(self) -> None:
        """Rewrite the file with the open rollouts' lines only (a temporary file, renamed over the old one)."""
        old = self._fd
        if old is None:
            raise OSError(f"the journal {self.path} is closed")
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("wb") as new:
            for spans in self._kept.values():
                for index, (offset, length) in enumerate(spans):
                    spans[index] = (new.tell(), length)
                    new.write(os.pread(old, length, offset))
            new.flush()
            if self.fsync:
                os.fsync(new.fileno())
        os.replace(temporary, self.path)
        self._fd = self._open()
        os.close(old)
        self._size = self._compacted = os.fstat(self._fd).st_size

    def close(self) -> None:
        """Close the file (it stays on disk: the supervisor reads it, then deletes it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_journal(path: Path) -> tuple[dict[str, Opened], dict[str, Answered], set[str]]:
    """The rollouts opened, each one's last answered call, and the ids ended; a torn or bad line is skipped."""
    opened: dict[str, Opened] = {}
    last: dict[str, Answered] = {}
    ended: set[str] = set()
    with path.open("rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.endswith(b"\n"):
                break  # torn by a kill mid-write: never answered
            try:
                entry = _DECODER.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                logger.error("gateway journal %s: line %d skipped: %s", path, number, exc)
                continue
            if isinstance(entry, Opened):
                opened[entry.id] = entry
            elif isinstance(entry, Answered):
                last[entry.id] = entry
            else:
                ended.add(entry.id)
    return opened, last, ended


def lost_records(path: Path, written: Iterable[Key], reason: str) -> list[RolloutRecord]:
    """The records of the rollouts ``path`` journals as opened and not ended, whose keys are not in ``written``.

    Each holds the trajectory of its last answered call (every answered output), its open branches ``failed``
    with ``reason``; a rollout with no answered call holds no output (``failed`` too).
    """
    opened, last, ended = read_journal(path)
    done = set(written)
    records = []
    for rid, entry in opened.items():
        if rid in ended or (entry.task_id, entry.sample) in done:
            continue
        answered = last.get(rid)
        snapshot = answered.trajectory if answered is not None else Trajectory(rid).to_record()
        traj = Trajectory.from_record(_failed(snapshot, reason, last=True))
        traj.metadata.update({**entry.metadata, "task_id": entry.task_id, "gateway_end": "worker_lost"})
        now = time.time()
        records.append(
            rollout_record(
                traj,
                task_id=entry.task_id,
                sample=entry.sample,
                group=entry.group,
                reward=None,
                server=entry.server or None,
                started=entry.started,
                wall_s=now - entry.started,
                agent_s=now - entry.started,
                tool_calls=answered.tool_calls if answered is not None else 0,
            )
        )
    return records


def _failed(record: TrajectoryRecord, reason: str, *, last: bool) -> TrajectoryRecord:
    """``record`` with its open branches ``failed`` for ``reason``.

    The current branch (``last``) is open unless a call set a final status (``truncated``, ``failed``, an abort),
    which stands; an earlier branch is open only while ``running``.
    """
    branches = [_failed(b, reason, last=False) for b in record.branches]
    status, why = status_of(WorkerLost(reason, record.status, record.status_reason, current=last))
    return msgspec.structs.replace(record, status=status, status_reason=why, branches=branches)

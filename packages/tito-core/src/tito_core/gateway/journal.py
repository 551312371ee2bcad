"""A gateway worker's write-ahead journal: what it answered is in a file before the answer goes out.

One JSON line per event, each written with one ``write`` call on a file opened ``O_APPEND``:

* ``open``: a rollout was opened (its id, task, sample, group, metadata, start time, the worker's address),
  written before ``POST /rollouts`` answers;
* ``delta``: a model call was answered: what changed in the rollout's trajectory since its last line
  (:mod:`~tito_core.gateway.deltas`: new tokens, logprobs, segments, turns, media, branches, statuses), written after
  the call was recorded and before its answer is sent; the first one holds the whole trajectory so far;
* ``call``: the same, as the whole trajectory (a shape deltas do not hold; and what journals written before deltas
  hold);
* ``reward``: a reward given to one call or one branch (``POST /rollouts/<id>/reward``), before it is answered;
* ``finish``: a ``finish`` was taken (its total reward, per-call rewards, metadata), before its record is handed to
  the supervisor;
* ``end``: the rollout's record was written to the output (by the supervisor), so the journal no longer matters
  for it.

A ``write`` that returned is in the kernel: it outlives the process (``kill -9``, the OOM killer), not a power
cut (``fsync=True`` syncs each line, at the cost of a disk flush per call). A line torn by a kill mid-``write``
was never acknowledged to anyone (its answer had not gone out) and is skipped; a ``write`` that fails is cut off the
file again. The file is compacted as it grows (:class:`Journal`): it holds the open rollouts' lines, not the
worker's history.

:func:`lost_records` is the supervisor's side: the record of every rollout the journal opened and did not end,
with its last answered trajectory, its rewards and its ``finish``'s, its open branches ``failed`` with the reason
given ("gateway worker lost").
"""

from __future__ import annotations

import contextlib
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
from .deltas import Delta, DeltaError, Rebuilt, Tracker
from .registry import GatewayRollout
from .rewards import TurnRewards

__all__ = ["Journal", "lost_records", "read_journal"]

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
    """A call answered on rollout ``id``: its whole trajectory then, and the tool calls its outputs asked for."""

    id: str
    tool_calls: int
    trajectory: TrajectoryRecord


class Called(msgspec.Struct, frozen=True, tag="delta"):
    """A call answered on rollout ``id``: what changed in its trajectory since its last line, and its tool calls."""

    id: str
    tool_calls: int
    delta: Delta


class Rewarded(msgspec.Struct, frozen=True, tag="reward", omit_defaults=True):
    """Rollout ``id``'s call ``turn``, or its branch ``branch``, was given reward ``value``."""

    id: str
    value: float
    turn: int | None = None
    branch: int | None = None


class Finished(msgspec.Struct, frozen=True, tag="finish", omit_defaults=True):
    """Rollout ``id`` was finished: its total reward, per-call rewards (merged) and metadata."""

    id: str
    reward: float | None = None
    turn_rewards: list[float | None] | None = None
    metadata: dict[str, Any] = {}


class Ended(msgspec.Struct, frozen=True, tag="end"):
    """Rollout ``id``'s record is in the output."""

    id: str


Entry = Opened | Called | Answered | Rewarded | Finished | Ended
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Entry)
_Span = tuple[int, int, bool]  # a line's (offset, length, whether it holds trajectory data)


class Journal:
    """The journal file of one worker, appended to (made if missing), compacted as it grows.

    Once the file passes ``rotate_bytes`` (and twice its size after the last compaction), it is rewritten with only
    what the open rollouts need (each one's lines, copied byte for byte: its deltas add up to about one copy of its
    trajectory) under a temporary name, then renamed over the old one: a kill leaves either file whole, and the
    journal stays about as large as the open rollouts' trajectories, however long the worker serves.

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
        self._kept: dict[str, list[_Span]] = {}  # open rollout -> its lines
        self._trackers: dict[str, Tracker] = {}  # open rollout -> what its lines hold of its trajectory

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)

    def opened(self, rollout: GatewayRollout, server: str) -> None:
        """Journal a rollout just opened (before its id and token are answered)."""
        meta = rollout.metadata
        entry = Opened(rollout.id, rollout.task_id, rollout.sample, rollout.group, rollout.started, server, meta)
        self._kept[rollout.id] = [self._append(entry, trajectory=False)]
        self._trackers[rollout.id] = Tracker()

    def answered(self, rollout: GatewayRollout) -> None:
        """Journal a call just recorded on ``rollout`` (before its answer is sent): what changed in its trajectory."""
        tracker = self._trackers.setdefault(rollout.id, Tracker())
        traj = rollout.core.trajectory
        found = tracker.delta(traj)
        try:
            if found is None:  # a shape deltas do not hold: the whole trajectory
                tracker.reset()
                span = self._append(Answered(rollout.id, rollout.tool_calls, traj.to_record()), trajectory=True)
                kept = self._kept.setdefault(rollout.id, [])
                kept[:] = [line for line in kept if not line[2]]  # it supersedes the earlier trajectory lines
            else:
                delta, state = found
                span = self._append(Called(rollout.id, rollout.tool_calls, delta), trajectory=True)
                tracker.commit(state)
        except OSError:
            tracker.reset()  # whatever the file holds now, the next line carries the whole trajectory
            raise
        self._kept.setdefault(rollout.id, []).append(span)

    def rewarded(self, rollout_id: str, value: float, *, turn: int | None = None, branch: int | None = None) -> None:
        """Journal a reward given to call ``turn`` or branch ``branch`` of a rollout (before it is answered)."""
        self._keep(rollout_id, self._append(Rewarded(rollout_id, value, turn, branch), trajectory=False))

    def finished(
        self,
        rollout_id: str,
        reward: float | None,
        turn_rewards: list[float | None] | None,
        metadata: dict[str, Any] | None,
    ) -> None:
        """Journal a rollout's ``finish`` (before its record is handed over and the finish answered)."""
        entry = Finished(rollout_id, reward, turn_rewards, dict(metadata or {}))
        self._keep(rollout_id, self._append(entry, trajectory=False))

    def ended(self, rollout_id: str) -> None:
        """Journal that the rollout's record is written."""
        self._append(Ended(rollout_id), trajectory=False)
        self._kept.pop(rollout_id, None)
        self._trackers.pop(rollout_id, None)

    def _keep(self, rollout_id: str, span: _Span) -> None:
        kept = self._kept.get(rollout_id)
        if kept is not None:
            kept.append(span)

    def _append(self, entry: Entry, *, trajectory: bool) -> _Span:
        """Write one line (and sync it with ``fsync``); a failed write is cut off the file again."""
        fd = self._fd
        if fd is None:
            raise OSError(f"the journal {self.path} is closed")
        if self._size >= max(self.rotate_bytes, 2 * self._compacted):
            self.compact()
            fd = self._fd
            assert fd is not None
        data = _ENCODER.encode(entry) + b"\n"
        span = (self._size, len(data), trajectory)
        line = memoryview(data)
        try:
            while line:
                line = line[os.write(fd, line) :]
            if self.fsync:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)  # no part of an unanswered line stays for the next to follow
            raise
        self._size += len(data)
        return span

    def compact(self) -> None:
        """Rewrite the file with the open rollouts' lines only (a temporary file, renamed over the old one)."""
        old = self._fd
        if old is None:
            raise OSError(f"the journal {self.path} is closed")
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("wb") as new:
            for spans in self._kept.values():
                for index, (offset, length, trajectory) in enumerate(spans):
                    spans[index] = (new.tell(), length, trajectory)
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


class JournaledRollout:
    """What a journal holds of one rollout it opened and did not end.

    Attributes:
        opened: Its ``open`` line.
        trajectory: Its trajectory as of its last trajectory line (``record()``: None before any call).
        tool_calls: The tool calls its outputs asked for, as of that line.
        rewards: The rewards given per call and per branch.
        finished: Its ``finish`` line, when it was finished and its record did not reach the output.
        broken: Why its trajectory stopped at an earlier line (a line that does not apply), or None.
    """

    def __init__(self, opened: Opened) -> None:
        self.opened = opened
        self.trajectory = Rebuilt(opened.id)
        self.tool_calls = 0
        self.rewards = TurnRewards()
        self.finished: Finished | None = None
        self.broken: str | None = None

    def take(self, entry: Answered | Called | Rewarded | Finished) -> None:
        """Apply one of its lines.

        Raises:
            DeltaError: a delta that does not apply (its trajectory stays as the line before left it, and later
                deltas are not applied: :attr:`broken`).
        """
        if isinstance(entry, Answered):
            self.trajectory.reset(entry.trajectory)
            self.tool_calls, self.broken = entry.tool_calls, None
        elif isinstance(entry, Called):
            if self.broken is None:
                try:
                    self.trajectory.apply(entry.delta)
                except DeltaError as exc:
                    self.broken = str(exc)
                    raise
                self.tool_calls = entry.tool_calls
        elif isinstance(entry, Rewarded):
            if entry.branch is not None:
                self.rewards.by_branch[entry.branch] = entry.value
            elif entry.turn is not None:
                self.rewards.by_turn[entry.turn] = entry.value
        else:
            self.finished = entry


def read_journal(path: Path) -> dict[str, JournaledRollout]:
    """The rollouts ``path`` opened and did not end, by id; a torn last line, or a bad line, is skipped."""
    held: dict[str, JournaledRollout] = {}
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
                held[entry.id] = JournaledRollout(entry)
            elif isinstance(entry, Ended):
                held.pop(entry.id, None)
            elif entry.id in held:
                try:
                    held[entry.id].take(entry)
                except DeltaError as exc:
                    logger.error("gateway journal %s: line %d does not apply (%s): rollout %s is recovered as the "
                                 "lines before left it", path, number, exc, entry.id)  # fmt: skip
    return held


def lost_records(path: Path, written: Iterable[Key], reason: str) -> list[RolloutRecord]:
    """The records of the rollouts ``path`` journals as opened and not ended, whose keys are not in ``written``.

    Each holds the trajectory of its last answered call (every answered output), its open branches ``failed``
    with ``reason``, the rewards given per call and per branch, and, when it was finished, the ``finish``'s reward
    and metadata; a rollout with no answered call holds no output (``failed`` too).
    """
    done = set(written)
    records = []
    for rid, journaled in read_journal(path).items():
        entry = journaled.opened
        if (entry.task_id, entry.sample) in done:
            continue
        snapshot = journaled.trajectory.record() or Trajectory(rid).to_record()
        traj = Trajectory.from_record(_failed(snapshot, reason, last=True))
        finished = journaled.finished
        extra = finished.metadata if finished is not None else {}
        traj.metadata.update({**entry.metadata, **extra, "task_id": entry.task_id, "gateway_end": "worker_lost"})
        rewards = journaled.rewards
        if finished is not None:
            reward, per_turn = finished.reward, finished.turn_rewards
        else:
            reward, per_turn = None, rewards.so_far(len(traj.turns))
        now = time.time()
        records.append(
            rollout_record(
                traj,
                task_id=entry.task_id,
                sample=entry.sample,
                group=entry.group,
                reward=reward,
                server=entry.server or None,
                started=entry.started,
                wall_s=now - entry.started,
                agent_s=now - entry.started,
                tool_calls=journaled.tool_calls,
                turn_rewards=per_turn,
                branch_rewards=rewards.branches(traj.all_branches),
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

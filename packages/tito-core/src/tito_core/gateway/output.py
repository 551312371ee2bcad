"""Where the gateway's ended rollouts go: one record each, numbered per task, written with the runner's writer.

A record that cannot be written (a full disk, a removed folder) is not lost: it is kept, the caller is told (a 507
naming the error), and every kept record is written again at the next write and when the output closes; one that
still cannot be written then goes to the log whole, as JSON.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..records import RecordWriter, RolloutRecord, open_writer, rollout_record
from ..records.schema import ENCODER, Key
from ..trajectory import Trajectory
from .errors import GatewayError
from .registry import GatewayRollout

__all__ = ["GatewayOutput"]

logger = logging.getLogger("tito")


RECENT = 1000
"""Finished records the gateway keeps in memory for its viewer (``/ui``); the output file keeps them all."""


class SampleNumbers:
    """The next sample number of each task, counted on after the task's records already written.

    A rollout asked for again by its id (the door opening it on another worker after the first died before opening
    it) gets the number it was given, until :meth:`written` says its record is out.
    """

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._given: dict[str, tuple[str, int]] = {}  # rollout id -> (task, sample), while the rollout is open

    def next(self, task: str, finished: Callable[[], set[Key]], rollout_id: str | None = None) -> int:
        """The number of ``task``'s next rollout, or ``rollout_id``'s own when it was given one.

        ``finished`` gives the keys already written (read once per task).
        """
        given = self._given.get(rollout_id) if rollout_id is not None else None
        if given is not None and given[0] == task:
            return given[1]
        if task not in self._next:
            self._next[task] = 1 + max((s for t, s in finished() if t == task), default=-1)
        sample = self._next[task]
        self._next[task] = sample + 1
        if rollout_id is not None:
            self._given[rollout_id] = (task, sample)
        return sample

    def written(self, rollout_id: str) -> None:
        """Rollout ``rollout_id``'s record is written: its id is no longer asked for."""
        self._given.pop(rollout_id, None)


class GatewayOutput:
    """The records of a gateway's ended rollouts, written to ``path`` (JSONL or ``.parquet``) when there is one.

    A rollout's ``sample`` number continues after the task's records already in the file, so a restarted gateway
    on the same output goes on.
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = path
        self._writer: RecordWriter | None = None
        self._samples = SampleNumbers()
        self.recent: deque[tuple[int, RolloutRecord]] = deque(maxlen=RECENT)  # (number, record): the viewer's
        self.unwritten: list[RolloutRecord] = []  # records a write failed for: written again later
        self._written = 0

    def open(self) -> None:
        """Open the file (its lock: a second live writer is refused); a no-op without a path or when open."""
        if self.path is not None and self._writer is None:
            self._writer = open_writer(self.path)

    def close(self) -> None:
        """Write the records kept after a failed write, then close the file (a Parquet writer writes its last part).

        A kept record that still cannot be written is logged whole (JSON, at error level): never dropped silently.
        """
        writer, self._writer = self._writer, None
        if writer is None:
            return
        self._write_kept(writer)
        for record in self.unwritten:
            logger.error("gateway output %s: record %s/%s could not be written: %s", self.path, record.task_id,
                         record.sample, ENCODER.encode(record).decode())  # fmt: skip
        self.unwritten = []
        writer.close()

    def next_sample(self, task: str, rollout_id: str | None = None) -> int:
        """The next sample number of ``task`` (:class:`SampleNumbers`)."""
        return self._samples.next(task, self._finished, rollout_id)

    def _finished(self) -> set[Key]:
        return self._writer.finished() if self._writer is not None else set()

    def write(
        self,
        rollout: GatewayRollout,
        traj: Trajectory,
        reward: float | None,
        server: str,
        turn_rewards: list[float | None] | None = None,
        branch_rewards: list[float | None] | None = None,
    ) -> RolloutRecord:
        """The record of ``rollout``'s closed ``traj``, written to the file when there is one."""
        wall = time.time() - rollout.started
        record = rollout_record(
            traj,
            task_id=rollout.task_id,
            sample=rollout.sample,
            group=rollout.group,
            reward=reward,
            server=server or None,
            started=rollout.started,
            wall_s=wall,
            agent_s=wall,
            tool_calls=rollout.tool_calls,
            turn_rewards=turn_rewards,
            branch_rewards=branch_rewards,
        )
        self.recent.append((self._written, record))
        self._written += 1
        if self._writer is not None:
            self._write_kept(self._writer)
            try:
                self._writer.write(record)
            except (OSError, ValueError) as exc:  # the file or its folder: the record is kept, not lost
                self.unwritten.append(record)
                raise GatewayError(
                    507,
                    f"rollout {rollout.id!r} ended, but its record could not be written to {self.path} "
                    f"({type(exc).__name__}: {exc}); it is kept and written again at the next write and at shutdown",
                    code="record_not_written",
                ) from exc
        return record

    def write_ended(self, rollout: GatewayRollout, traj: Trajectory, server: str) -> None:
        """Write the record of a rollout the gateway ended itself (idle, shutdown), with its per-call rewards.

        No client waits for it: a failed write is logged, and the record kept for the next write and the shutdown.
        """
        try:
            per_turn, per_branch = rollout.rewards.so_far(len(traj.turns)), rollout.rewards.branches(traj.all_branches)
            self.write(rollout, traj, None, server, per_turn, per_branch)
        except GatewayError as exc:
            logger.error("%s", exc.message)

    def _write_kept(self, writer: RecordWriter) -> None:
        """Write the records kept after failed writes, in order, while the writer takes them."""
        while self.unwritten:
            try:
                writer.write(self.unwritten[0])
            except (OSError, ValueError):
                return
            self.unwritten.pop(0)

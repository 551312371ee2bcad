"""Rollout records and the append-only files that hold them (JSONL or Parquet), resumable.

One :class:`RolloutRecord` per finished rollout, keyed by ``(task_id, sample)``, written as soon as the rollout
finishes. A writer opened on an existing output reports the keys already there (:meth:`RecordWriter.finished`),
so a rerun skips them.

With a group reward function, a group's advantages are known only when its last rollout finishes: they are
written then, as one :class:`GroupAdvantages` entry after the group's records (a JSON line of ``"kind":
"advantages"``; in Parquet, a ``_advantages-*.parquet`` file beside the parts, which ``read_table`` skips).
:func:`read_records` gives each record the advantage of its task's last entry. A run killed between a group's
records and its entry loses no record; the rerun computes the entry from the rewards on disk.

* **JSONL** (``.jsonl``, anything not ``.parquet``): one JSON object per line, each written with one
  ``write`` call as soon as its rollout finishes. A process killed mid-write can leave a torn last line
  (no newline): the next open cuts it off (that rollout runs again) and keeps every whole line.
* **Parquet** (``.parquet``): a directory of part files, one row group each, written to a temporary name and
  renamed when ``row_group_size`` records have gathered (and on close). A kill loses at most the records not
  yet flushed; every renamed part is whole. ``pyarrow.parquet.read_table(path, schema=arrow_schema(pyarrow))``
  reads the directory (with the schema, parts written by an older tito read the columns they lack as null).
  The ``trajectory`` column holds the trajectory's JSON (:class:`~tito_core.trajectory.TrajectoryRecord`).

**One writer per output.** A writer holds an advisory lock (``flock``) on ``<output>.lock`` beside the output
while it is open: a second writer of the same output, in this or another process, is refused at once with a
:class:`OutputLockedError` naming the process that holds it. The kernel releases the lock when its process
ends, even by ``kill -9``; a lock file left behind then is harmless (the next writer takes it over), and a
writer closed normally deletes it.

Records are never rewritten, with one opt-in exception: :meth:`RecordWriter.remove` (``rollout.retry_failed``)
drops records so that they run again, by rewriting the file (JSONL) or the part files holding them (Parquet)
under a temporary name, synced, then renamed over the old one: a kill leaves either the old or the new file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError
from ..trajectory import Trajectory
from .jsonl_writer import JsonlWriter, read_jsonl
from .output_lock import OutputLock, OutputLockedError
from .parquet_writer import ParquetWriter, read_parquet
from .record_schema import (
    FinalStatus,
    GroupAdvantages,
    RolloutRecord,
    Timings,
    TokenCounts,
    arrow_schema,
    record_from_row,
    record_to_row,
)
from .record_schema import Key as Key  # undocumented; run.py and summary.py import it from here
from .record_schema import Outcome as Outcome
from .record_writer import RecordWriter

__all__ = [
    "FinalStatus",
    "GroupAdvantages",
    "JsonlWriter",
    "OutputLock",
    "OutputLockedError",
    "ParquetWriter",
    "RecordWriter",
    "RolloutRecord",
    "Timings",
    "TokenCounts",
    "arrow_schema",
    "open_writer",
    "read_records",
    "record_from_row",
    "record_to_row",
    "rollout_record",
]


def check_output(path: str | os.PathLike[str]) -> None:
    """Make the output's folder and check it can be written, without creating the output itself.

    Raises:
        ConfigError: The folder cannot be made, or the output (or its folder) is not writable; the path is named.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"rollout output {str(path)!r}: its folder cannot be made: {exc.strerror or exc}") from exc
    existing = target if target.exists() else target.parent
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"rollout output {str(path)!r}: {str(existing)!r} is not writable")


def open_writer(
    path: str | os.PathLike[str], *, row_group_size: int = 256, lock: OutputLock | None = None
) -> RecordWriter:
    """The writer for ``path``: Parquet for a ``.parquet`` name, JSON lines otherwise; missing folders are made.

    The writer takes the output's :class:`OutputLock`, or holds ``lock`` (taken earlier by the caller).

    Raises:
        OutputLockedError: Another live writer holds the output.
        ConfigError: The file (or its folder) cannot be made or opened; the path and the reason are named.
    """
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if Path(path).suffix == ".parquet":
            return ParquetWriter(path, row_group_size=row_group_size, lock=lock)
        return JsonlWriter(path, lock=lock)
    except OSError as exc:
        raise ConfigError(f"rollout output {str(path)!r} cannot be opened: {exc.strerror or exc}") from exc


def read_records(path: str | os.PathLike[str]) -> Iterator[RolloutRecord]:
    """Every record of a rollout file (JSONL, or a Parquet directory / file), in file order.

    Each record carries its group's advantage from the task's last :class:`GroupAdvantages` entry (a record of a
    group whose reward function failed reads back ``failed``, with the reason).
    """
    source = Path(path)
    if source.suffix == ".parquet":
        yield from read_parquet(source)
    else:
        yield from read_jsonl(source)


def rollout_record(
    traj: Trajectory,
    *,
    task_id: str,
    sample: int,
    group: int,
    reward: float | None,
    server: str | None,
    started: float,
    wall_s: float,
    agent_s: float,
    reward_s: float = 0.0,
    tool_calls: int,
) -> RolloutRecord:
    """The record of a closed trajectory: its final status, token counts and weight-version range.

    What the runner's worker and the gateway both write; ``tool_calls`` is the number of tools the agent ran.

    Raises:
        RuntimeError: ``traj`` is still running (close it first).
    """
    if traj.status == "running":
        raise RuntimeError("a closed trajectory is still running")
    output = sum(seg.length for seg in traj.segments if seg.kind == "output")
    versions = traj.weight_version_range(branches=True) or (None, None)
    return RolloutRecord(
        task_id=task_id,
        sample=sample,
        group=group,
        status=traj.status,
        status_reason=traj.status_reason,
        reward=reward,
        server=server,
        trajectory=traj.to_record(),
        timings=Timings(started=started, wall_s=wall_s, agent_s=agent_s, reward_s=reward_s),
        tokens=TokenCounts(
            total=len(traj),
            output=output,
            prompt=len(traj) - output,
            model_calls=len(traj.turns),
            tool_calls=tool_calls,
        ),
        weight_version_min=versions[0],
        weight_version_max=versions[1],
    )

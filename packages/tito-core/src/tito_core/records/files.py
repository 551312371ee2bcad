"""Open a rollout file to write (:func:`open_writer`), read one back (:func:`read_records`), build a record.

:func:`rollout_record` is the record of a closed trajectory; :func:`check_output` checks an output path early.
:func:`read_rollout_file` reads a whole file for a tool that shows or scores it, with what was skipped.

A file of trajectories (one :meth:`Trajectory.to_json <tito_core.trajectory.Trajectory.to_json>` per line, as
``tito demo`` and ``examples/look_agent`` write them) is read too: each trajectory as a record of its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..errors import ConfigError, TitoError
from ..status import Closed, status_of
from ..trajectory import Trajectory, TrajectoryRecord
from ..trajectory.media import load_images
from .jsonl import JsonlWriter, read_jsonl
from .lock import OutputLock
from .parquet import ParquetWriter, read_parquet
from .schema import RolloutRecord, Timings, TokenCounts
from .writer import RecordWriter

__all__ = [
    "RolloutFile",
    "check_output",
    "highest_token_id",
    "open_writer",
    "read_records",
    "read_rollout_file",
    "rollout_digest",
    "rollout_record",
]

logger = logging.getLogger("tito.runner")


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


def read_records(
    path: str | os.PathLike[str], *, on_partial: Callable[[int], None] | None = None
) -> Iterator[RolloutRecord]:
    """Every record of a rollout file (JSONL, or a Parquet directory / file), in file order.

    Each record carries its group's advantage from the task's last :class:`GroupAdvantages` entry (a record of a
    group whose reward function failed reads back ``failed``, with the reason). Image files stored next to the
    output are read back into each trajectory record's ``image_data``. A file of trajectories (``tito demo``'s) is
    read as one record per trajectory (:func:`trajectory_file`).

    A JSONL file's last line without its newline (a run still writing it, or killed mid-write) is skipped:
    ``on_partial`` is called with its size in bytes (without it, a warning is logged).

    Raises:
        ConfigError: A line that is neither a record nor a trajectory, named by its number.
    """
    source = Path(path)
    if source.suffix == ".parquet":
        records = read_parquet(source)
    elif trajectory_file(source):
        records = _read_trajectories(source, on_partial)
    else:
        records = read_jsonl(source, on_partial=on_partial)
    for record in records:
        traj = load_images(record.trajectory, source)
        yield record if traj is record.trajectory else msgspec.structs.replace(record, trajectory=traj)


class RolloutFile(msgspec.Struct, frozen=True, kw_only=True):
    """A rollout file read whole (:func:`read_rollout_file`), and what reading it skipped.

    Attributes:
        path: The file.
        records: Its records, in file order.
        trajectories: The file held trajectories (``tito demo``'s), each read as a record.
        partial_bytes: The size of the partial last line skipped (a run still writing it, or killed mid-write);
            0 when there was none.
    """

    path: str
    records: list[RolloutRecord]
    trajectories: bool = False
    partial_bytes: int = 0

    def notes(self) -> list[str]:
        """What a user should hear about the reading: one line each (none when nothing was skipped)."""
        if not self.partial_bytes:
            return []
        return [f"{self.path}: skipped 1 partial last line ({self.partial_bytes} bytes without a newline: a run "
                "still writing it, or one killed mid-write)"]  # fmt: skip


def read_rollout_file(path: str | os.PathLike[str]) -> RolloutFile:
    """Read a whole rollout file (JSONL, Parquet, or trajectories) for a tool that shows or scores it.

    Raises:
        ConfigError: No such file, a folder that is not a Parquet output, a malformed line (its number named), an
            unreadable Parquet file.
    """
    source = Path(path)
    if not source.exists():
        raise ConfigError(f"{source}: no such rollout file")
    if source.is_dir() and source.suffix != ".parquet":
        raise ConfigError(f"{source}: a folder, not a rollout file (a Parquet output's folder ends in .parquet)")
    partial: list[int] = []
    try:
        trajectories = source.suffix != ".parquet" and trajectory_file(source)
        records = list(read_records(source, on_partial=partial.append))
    except TitoError:
        raise
    except OSError as exc:
        raise ConfigError(f"{source}: cannot be read: {exc.strerror or exc}") from None
    except Exception as exc:  # pyarrow's errors of a file that is not Parquet
        if source.suffix != ".parquet":
            raise
        raise ConfigError(f"{source}: not a readable Parquet rollout output: {exc}") from None
    return RolloutFile(path=str(source), records=records, trajectories=trajectories, partial_bytes=sum(partial))


class _Shape(msgspec.Struct):
    """What tells a line of trajectories (``rollout_id``, no ``task_id``) from a line of records."""

    task_id: Any = None
    rollout_id: Any = None


def trajectory_file(source: Path) -> bool:
    """Whether ``source``'s first line is a trajectory (:meth:`Trajectory.to_json`), not a rollout record."""
    with source.open("rb") as fh:
        for line in fh:
            if line.strip():
                try:
                    shape = msgspec.json.decode(line, type=_Shape)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    return False  # the record reader names the line
                return shape.task_id is None and isinstance(shape.rollout_id, str)
    return False


_TRAJECTORY = msgspec.json.Decoder(TrajectoryRecord)


def _read_trajectories(source: Path, on_partial: Callable[[int], None] | None) -> Iterator[RolloutRecord]:
    """Each line's trajectory as a record (task: its rollout id; group: its line); its last line may lack a newline."""
    with source.open("rb") as fh:
        for number, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                traj = Trajectory.from_record(_TRAJECTORY.decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError, TitoError) as exc:
                if line.endswith(b"\n"):
                    raise ConfigError(f"{source}: line {number + 1} is not a trajectory: {exc}") from None
                if on_partial is None:
                    logger.warning("%s: skipped a partial last line (%d bytes, no newline)", source, len(line))
                else:
                    on_partial(len(line))
                continue
            if traj.status == "running":  # saved before its rollout ended: a record's status is a final one
                traj.status, traj.status_reason = status_of(Closed(traj.status, "saved while still running"))
            tool_calls = sum(turn.tool_calls for turn in traj.turns)
            yield rollout_record(traj, task_id=traj.rollout_id, sample=0, group=number, reward=None, server=None,
                                 started=0.0, wall_s=0.0, agent_s=0.0, tool_calls=tool_calls)  # fmt: skip


def rollout_digest(record: RolloutRecord) -> str:
    """A short fingerprint of a record's token ids (every branch): what ties a report to the records it was made of."""
    digest = hashlib.blake2b(digest_size=8)
    for branch in _branches(record.trajectory):
        digest.update(array("i", branch.token_ids).tobytes())
        digest.update(b"/")
    return digest.hexdigest()


def _branches(traj: TrajectoryRecord) -> list[TrajectoryRecord]:
    return [*traj.branches, traj]


def highest_token_id(records: Iterable[RolloutRecord]) -> int:
    """The highest token id of ``records`` (every branch); -1 for none."""
    return max((max(b.token_ids, default=-1) for r in records for b in _branches(r.trajectory)), default=-1)


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
    turn_rewards: list[float | None] | None = None,
    branch_rewards: list[float | None] | None = None,
) -> RolloutRecord:
    """The record of a closed trajectory: its final status, token counts and weight-version range.

    What the runner's worker and the gateway both write; ``tool_calls`` is the number of tools the agent ran;
    ``turn_rewards`` one reward per model call of ``traj`` when the reward came per turn, ``branch_rewards`` one per
    branch (by number) when it came per branch.

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
        turn_rewards=turn_rewards,
        branch_rewards=branch_rewards,
    )

"""Open a rollout file to write (:func:`open_writer`), read one back (:func:`read_records`), build a record.

:func:`rollout_record` is the record of a closed trajectory; :func:`check_output` checks an output path early.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ..errors import ConfigError
from ..trajectory import Trajectory
from ..trajectory.media import load_images
from .jsonl import JsonlWriter, read_jsonl
from .lock import OutputLock
from .parquet import ParquetWriter, read_parquet
from .schema import RolloutRecord, Timings, TokenCounts
from .writer import RecordWriter

__all__ = ["check_output", "open_writer", "read_records", "rollout_record"]


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
    group whose reward function failed reads back ``failed``, with the reason). Image files stored next to the
    output are read back into each trajectory record's ``image_data``.
    """
    source = Path(path)
    records = read_parquet(source) if source.suffix == ".parquet" else read_jsonl(source)
    for record in records:
        traj = load_images(record.trajectory, source)
        yield record if traj is record.trajectory else msgspec.structs.replace(record, trajectory=traj)


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
) -> RolloutRecord:
    """The record of a closed trajectory: its final status, token counts and weight-version range.

    What the runner's worker and the gateway both write; ``tool_calls`` is the number of tools the agent ran;
    ``turn_rewards`` one reward per model call of ``traj`` when the reward came per turn.

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
    )

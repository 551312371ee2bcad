"""Rollout records and the append-only files that hold them (JSONL or Parquet), resumable.

One :class:`RolloutRecord` per finished rollout, keyed by ``(task_id, sample)``. A writer opened on an
existing output reports the keys already there (:meth:`RecordWriter.finished`), so a rerun skips them.

* **JSONL** (``.jsonl``, anything not ``.parquet``): one JSON object per line, each written with one
  ``write`` call as soon as its rollout finishes. A process killed mid-write can leave a torn last line
  (no newline): the next open cuts it off (that rollout runs again) and keeps every whole line.
* **Parquet** (``.parquet``): a directory of part files, one row group each, written to a temporary name and
  renamed when ``row_group_size`` records have gathered (and on close). A kill loses at most the records not
  yet flushed; every renamed part is whole. ``pyarrow.parquet.read_table(path, schema=arrow_schema(pyarrow))``
  reads the directory (with the schema, parts written by an older tito read the columns they lack as null).
  The ``trajectory`` column holds the trajectory's JSON (:class:`~tito_core.trajectory.TrajectoryRecord`).

Records are never rewritten, with one opt-in exception: :meth:`RecordWriter.remove` (``rollout.retry_failed``)
drops records so that they run again, by rewriting the file (JSONL) or the part files holding them (Parquet)
under a temporary name, synced, then renamed over the old one: a kill leaves either the old or the new file.
"""

from __future__ import annotations

import abc
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..errors import ConfigError
from ..trajectory import TrajectoryRecord
from ._optional import pyarrow

__all__ = [
    "FinalStatus",
    "JsonlWriter",
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
]

logger = logging.getLogger("tito.runner")

FinalStatus = Literal["completed", "truncated", "aborted", "failed"]
Key = tuple[str, int]


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """When a rollout ran and where its time went (seconds; ``started`` is Unix time)."""

    started: float
    wall_s: float
    agent_s: float
    reward_s: float = 0.0


class TokenCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Token and call counts of a rollout's final branch."""

    total: int
    output: int
    prompt: int
    model_calls: int
    tool_calls: int


class RolloutRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One finished rollout, as written to the output file.

    Attributes:
        task_id: The task's id.
        sample: Index of the rollout within its group (0 to ``group_size - 1``).
        group: The group id: the task's position in the dataset.
        status: ``completed``, ``truncated`` (token or loop limit), ``aborted`` (timeout, cancelled) or
            ``failed`` (an error in the rollout or in its reward function).
        status_reason: Why, when not ``completed``.
        reward: The reward function's value; None without one, or when it raised.
        advantage: The group reward function's value for this rollout (e.g. a group-normalised advantage).
        server: The inference server the rollout ran on (its base URL), when known.
        trajectory: The token-level record (ids, logprobs, segments, turns, branches).
        timings: Wall-clock times.
        tokens: Token and call counts.
        weight_version_min: The oldest weight version of the rollout's generated tokens, every branch included
            (order: :func:`tito_core.versions.version_key`); None when the backend reported no versions.
        weight_version_max: The newest one; None likewise.
    """

    task_id: str
    sample: int
    group: int
    status: FinalStatus
    status_reason: str | None
    reward: float | None
    trajectory: TrajectoryRecord
    timings: Timings
    tokens: TokenCounts
    advantage: float | None = None
    server: str | None = None
    weight_version_min: str | None = None
    weight_version_max: str | None = None

    @property
    def key(self) -> Key:
        """``(task_id, sample)``: what makes a rollout unique in a file."""
        return (self.task_id, self.sample)


class _KeyView(msgspec.Struct):
    """What resuming reads of a record: its key, and its status and reward for the whole file's summary."""

    task_id: str
    sample: int
    status: str = ""
    reward: float | None = None


Outcome = tuple[str, float | None]
"""``(status, reward)`` of a record already in an output file."""


_ENCODER = msgspec.json.Encoder()
_RECORD = msgspec.json.Decoder(RolloutRecord)
_KEY = msgspec.json.Decoder(_KeyView)


class RecordWriter(abc.ABC):
    """An append-only, resumable sink of :class:`RolloutRecord`; the same file format whoever writes it."""

    path: Path
    _outcomes: dict[Key, Outcome]
    _done: set[Key]

    def _opened(self, outcomes: dict[Key, Outcome]) -> None:
        """Remember what the output held when it was opened."""
        self._outcomes = outcomes
        self._done = set(outcomes)

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


class JsonlWriter(RecordWriter):
    """Records as JSON lines, one ``write`` each; a torn last line left by a killed run is cut off on open."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._opened(self._scan())
        self._fd: int | None = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _scan(self) -> dict[Key, Outcome]:
        """Outcomes of the whole lines, read line by line (files can be large); a torn last line is cut off."""
        keys: dict[Key, Outcome] = {}
        if not self.path.exists():
            return keys
        whole = 0
        with self.path.open("rb") as fh:
            for number, line in enumerate(fh, 1):
                if not line.endswith(b"\n"):
                    break  # only the last line can lack its newline
                whole += len(line)
                if not line.strip():
                    continue
                try:
                    view = _KEY.decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise ConfigError(f"{self.path}: line {number} is not a rollout record: {exc}") from exc
                keys[(view.task_id, view.sample)] = (view.status, view.reward)
        size = self.path.stat().st_size
        if whole < size:
            logger.warning(
                "%s: cutting off a torn last line (%d bytes, from an interrupted run); that rollout runs again",
                self.path,
                size - whole,
            )
            os.truncate(self.path, whole)
        return keys

    def _remove(self, keys: set[Key]) -> None:
        """Copy the other lines, byte for byte, to a temporary file beside this one; sync it; rename it over."""
        if self._fd is not None:
            os.close(self._fd)  # the rename replaces the file: append to the new one
            self._fd = None
        temporary = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with self.path.open("rb") as old, temporary.open("wb") as new:
                for line in old:
                    if line.strip():
                        view = _KEY.decode(line)  # every line was checked by the scan on open
                        if (view.task_id, view.sample) in keys:
                            continue
                    new.write(line)
                new.flush()
                os.fsync(new.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _fsync_dir(self.path.parent)
        self._fd = self._open()

    def write(self, record: RolloutRecord) -> None:
        """Append one line, in one ``write``."""
        if self._fd is None:
            raise ConfigError(f"{self.path}: the writer is closed")
        line = memoryview(_ENCODER.encode(record) + b"\n")
        while line:
            written = os.write(self._fd, line)
            line = line[written:]
        self._done.add(record.key)

    def close(self) -> None:
        """Sync and close the file."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.fsync(fd)
            os.close(fd)


class ParquetWriter(RecordWriter):
    """Records as Parquet part files in a directory, one row group each, renamed into place when whole."""

    def __init__(self, path: str | os.PathLike[str], *, row_group_size: int = 256) -> None:
        self._pa, self._pq = pyarrow()
        self.path = Path(path)
        self.row_group_size = row_group_size
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"{self.path}: a Parquet output is a directory of part files, and this is a file")
        self.path.mkdir(parents=True, exist_ok=True)
        for leftover in self.path.glob("*.tmp"):
            leftover.unlink()  # a part being written when a run was killed: its records run again
        self._opened(self._scan())
        self._buffer: list[RolloutRecord] = []
        self._parts = 0
        self._run = time.strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8]  # unique: runs never overwrite parts

    def _scan(self) -> dict[Key, Outcome]:
        keys: dict[Key, Outcome] = {}
        for part in sorted(self.path.glob("*.parquet")):
            table = self._pq.read_table(part, columns=["task_id", "sample", "status", "reward"])
            columns = [table.column(name).to_pylist() for name in ("task_id", "sample", "status", "reward")]
            for task_id, sample, status, reward in zip(*columns, strict=True):
                keys[(task_id, sample)] = (status, reward)
        return keys

    def _remove(self, keys: set[Key]) -> None:
        """Rewrite each part file holding one of ``keys`` without those rows (a part left empty is deleted)."""
        for part in sorted(self.path.glob("*.parquet")):
            table = self._pq.read_table(part)
            ids, samples = table.column("task_id").to_pylist(), table.column("sample").to_pylist()
            keep = [n for n, key in enumerate(zip(ids, samples, strict=True)) if key not in keys]
            if len(keep) == table.num_rows:
                continue
            if not keep:
                part.unlink()
                continue
            temporary = part.with_name(part.name + ".tmp")  # a leftover is deleted on the next open
            self._pq.write_table(table.take(keep), temporary, row_group_size=len(keep))
            with temporary.open("rb") as fh:
                os.fsync(fh.fileno())
            os.replace(temporary, part)
        _fsync_dir(self.path)

    def write(self, record: RolloutRecord) -> None:
        """Buffer one record; flush a part file when the row group is full."""
        self._buffer.append(record)
        self._done.add(record.key)
        if len(self._buffer) >= self.row_group_size:
            self.flush()

    def flush(self) -> None:
        """Write the buffered records as one part file (one row group)."""
        if not self._buffer:
            return
        rows = [record_to_row(record) for record in self._buffer]
        table = self._pa.Table.from_pylist(rows, schema=arrow_schema(self._pa))
        final = self.path / f"part-{self._run}-{self._parts:05d}.parquet"
        temporary = final.with_name(final.name + ".tmp")
        self._pq.write_table(table, temporary, row_group_size=len(rows))
        os.replace(temporary, final)
        self._parts += 1
        self._buffer.clear()

    def close(self) -> None:
        """Flush the last, partial row group."""
        self.flush()


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


def _fsync_dir(path: Path) -> None:
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


def open_writer(path: str | os.PathLike[str], *, row_group_size: int = 256) -> RecordWriter:
    """The writer for ``path``: Parquet for a ``.parquet`` name, JSON lines otherwise; missing folders are made.

    Raises:
        ConfigError: The file (or its folder) cannot be made or opened; the path and the reason are named.
    """
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if Path(path).suffix == ".parquet":
            return ParquetWriter(path, row_group_size=row_group_size)
        return JsonlWriter(path)
    except OSError as exc:
        raise ConfigError(f"rollout output {str(path)!r} cannot be opened: {exc.strerror or exc}") from exc


def read_records(path: str | os.PathLike[str]) -> Iterator[RolloutRecord]:
    """Every record of a rollout file (JSONL, or a Parquet directory / file), in file order."""
    source = Path(path)
    if source.suffix == ".parquet":
        pa, pq = pyarrow()
        # The schema of this version: parts written before a column existed read it as null (without it, the
        # first part's schema would drop the columns the later parts have).
        for row in pq.read_table(source, schema=arrow_schema(pa)).to_pylist():
            yield record_from_row(row)
        return
    with source.open("rb") as fh:
        for line in fh:
            if line.endswith(b"\n") and line.strip():
                yield _RECORD.decode(line)


def record_to_row(record: RolloutRecord) -> dict[str, Any]:
    """A record as one row of the Parquet file (and of a Ray Data batch): ``trajectory`` as its JSON text."""
    row: dict[str, Any] = msgspec.to_builtins(record)
    row["trajectory"] = _ENCODER.encode(record.trajectory).decode()
    return row


def record_from_row(row: dict[str, Any]) -> RolloutRecord:
    """The record of a row written by :func:`record_to_row` (a Parquet or Ray Data row)."""
    fields = dict(row)
    fields["trajectory"] = msgspec.json.decode(fields["trajectory"], type=TrajectoryRecord)
    return msgspec.convert(fields, RolloutRecord)


def arrow_schema(pa: Any) -> Any:
    """The Arrow schema of the Parquet file's rows (``pa`` is the ``pyarrow`` module)."""
    timings = pa.struct([(name, pa.float64()) for name in Timings.__struct_fields__])
    tokens = pa.struct([(name, pa.int64()) for name in TokenCounts.__struct_fields__])
    return pa.schema(
        [
            ("task_id", pa.string()),
            ("sample", pa.int64()),
            ("group", pa.int64()),
            ("status", pa.string()),
            ("status_reason", pa.string()),
            ("reward", pa.float64()),
            ("trajectory", pa.string()),
            ("timings", timings),
            ("tokens", tokens),
            ("advantage", pa.float64()),
            ("server", pa.string()),
            ("weight_version_min", pa.string()),
            ("weight_version_max", pa.string()),
        ]
    )

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

import abc
import contextlib
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

try:
    import fcntl as _fcntl
except ImportError:  # Windows: no flock
    _fcntl = None  # type: ignore[assignment]

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
        staleness: Versions between ``rollout.current_version`` and ``weight_version_min`` when the record was
            written (:func:`tito_core.runner.staleness.staleness`); None without a current version, or when the
            versions are not integers.
        stale: True when ``staleness`` exceeded ``rollout.max_staleness`` and ``rollout.stale = "mark"`` kept the
            record: a trainer filters these out (with ``"drop"``, stale records are not written at all).
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
    staleness: int | None = None
    stale: bool = False

    @property
    def key(self) -> Key:
        """``(task_id, sample)``: what makes a rollout unique in a file."""
        return (self.task_id, self.sample)


class GroupAdvantages(msgspec.Struct, frozen=True, kw_only=True, tag="advantages", tag_field="kind"):
    """The group reward function's values for one group, written once the group's records are all written.

    The last entry of a task wins: a rerun that adds samples to a group writes a new entry for all of them.

    Attributes:
        task_id: The group's task.
        samples: The samples the values belong to, in order.
        values: The advantage of each sample (None where the function gave none).
        error: Why the group reward function failed; its records then read back as ``failed``.
    """

    task_id: str
    samples: list[int]
    values: list[float | None]
    error: str | None = None

    def apply(self, record: RolloutRecord) -> RolloutRecord:
        """``record`` with this entry's advantage (or, for a failed entry, status ``failed`` and the reason)."""
        if self.error is not None:
            return msgspec.structs.replace(record, status="failed", status_reason=self.error, advantage=None)
        try:
            value = self.values[self.samples.index(record.sample)]
        except ValueError:
            return record  # a sample written after this entry: the group's next entry covers it
        return msgspec.structs.replace(record, advantage=value)


class _KeyView(msgspec.Struct):
    """What resuming reads of a line: a record's key, status and reward, or that it is an advantages entry."""

    task_id: str
    sample: int = -1
    status: str = ""
    reward: float | None = None
    kind: str | None = None


Outcome = tuple[str, float | None]
"""``(status, reward)`` of a record already in an output file."""


_ENCODER = msgspec.json.Encoder()
_RECORD = msgspec.json.Decoder(RolloutRecord)
_KEY = msgspec.json.Decoder(_KeyView)
_ADVANTAGES = msgspec.json.Decoder(GroupAdvantages)


class OutputLockedError(ConfigError):
    """Another live writer (this process or another) holds the output's lock."""


class OutputLock:
    """An exclusive advisory lock on ``<output>.lock``, beside the output: one writer per output.

    ``flock`` semantics: the kernel releases it when the holding process exits, also after ``kill -9``.
    The holder's pid is written into the lock file, so that a refused writer can name it.

    Raises:
        OutputLockedError: The lock is held (the message names the output, the lock file and the holder's pid).
    """

    def __init__(self, output: str | os.PathLike[str]) -> None:
        target = Path(output)
        self.path = target.with_name(target.name + ".lock")
        self.output = target
        self._fd: int | None = None
        if _fcntl is None:  # no flock on this platform (Windows): nothing to lock with
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f"process {holder}" if holder else "another process"
                raise OutputLockedError(
                    f"{self.output} is being written by {who} (lock {self.path}): wait for it to finish, or stop it; "
                    "two runs on one output would both run every rollout"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder deleted the file as we opened it: lock the one there now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    @property
    def held(self) -> bool:
        """Whether this object holds the lock (always False where the platform has no ``flock``)."""
        return self._fd is not None

    def release(self) -> None:
        """Delete the lock file and release the lock (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            self.path.unlink()  # still locked: a writer opening it now re-checks the inode and retries
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


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

    def _removes_line(self, line: bytes, keys: set[Key]) -> bool:
        """Whether :meth:`remove` drops this JSON line: a record of ``keys``, or an entry of one of their tasks."""
        view = _KEY.decode(line)  # every line was checked by the scan on open
        if view.kind == "advantages":
            return any(task_id == view.task_id for task_id, _ in keys)
        return (view.task_id, view.sample) in keys

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

    def __init__(self, path: str | os.PathLike[str], *, lock: OutputLock | None = None) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._take_lock(lock)
        try:
            self._opened(*self._scan())
            self._fd = self._open()
        except BaseException:
            self._release_lock()
            raise

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _scan(self) -> tuple[dict[Key, Outcome], dict[str, GroupAdvantages]]:
        """Outcomes and advantage entries of the whole lines, read line by line; a torn last line is cut off."""
        keys: dict[Key, Outcome] = {}
        advantages: dict[str, GroupAdvantages] = {}
        if not self.path.exists():
            return keys, advantages
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
                    if view.kind == "advantages":
                        advantages[view.task_id] = _ADVANTAGES.decode(line)
                        continue
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
        return keys, advantages

    def _remove(self, keys: set[Key]) -> None:
        """Copy the other lines, byte for byte, to a temporary file beside this one; sync it; rename it over."""
        if self._fd is not None:
            os.close(self._fd)  # the rename replaces the file: append to the new one
            self._fd = None
        temporary = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with self.path.open("rb") as old, temporary.open("wb") as new:
                for line in old:
                    if line.strip() and self._removes_line(line, keys):
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
        self._append(_ENCODER.encode(record))
        self._done.add(record.key)

    def write_advantages(self, entry: GroupAdvantages) -> None:
        """Append the entry as one line, in one ``write``."""
        self._append(_ENCODER.encode(entry))

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            raise ConfigError(f"{self.path}: the writer is closed")
        line = memoryview(data + b"\n")
        while line:
            written = os.write(self._fd, line)
            line = line[written:]

    def close(self) -> None:
        """Sync and close the file; release the lock."""
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        finally:
            self._release_lock()


class ParquetWriter(RecordWriter):
    """Records as Parquet part files in a directory, one row group each, renamed into place when whole."""

    def __init__(
        self, path: str | os.PathLike[str], *, row_group_size: int = 256, lock: OutputLock | None = None
    ) -> None:
        self._pa, self._pq = pyarrow()
        self.path = Path(path)
        self.row_group_size = row_group_size
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"{self.path}: a Parquet output is a directory of part files, and this is a file")
        self._take_lock(lock)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for leftover in self.path.glob("*.tmp"):
                leftover.unlink()  # a part being written when a run was killed: its records run again
            self._opened(self._scan(), self._scan_advantages())
        except BaseException:
            self._release_lock()
            raise
        self._buffer: list[RolloutRecord] = []
        self._entries: list[GroupAdvantages] = []
        self._parts = 0
        self._run = time.strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8]  # unique: runs never overwrite parts

    def _scan(self) -> dict[Key, Outcome]:
        keys: dict[Key, Outcome] = {}
        for part in sorted(self.path.glob("part-*.parquet")):
            table = self._pq.read_table(part, columns=["task_id", "sample", "status", "reward"])
            columns = [table.column(name).to_pylist() for name in ("task_id", "sample", "status", "reward")]
            for task_id, sample, status, reward in zip(*columns, strict=True):
                keys[(task_id, sample)] = (status, reward)
        return keys

    def _scan_advantages(self) -> dict[str, GroupAdvantages]:
        return {entry.task_id: entry for entry in _parquet_advantages(self._pq, self.path)}

    def _remove(self, keys: set[Key]) -> None:
        """Rewrite each part file holding one of ``keys`` without those rows (a part left empty is deleted)."""
        tasks = {task_id for task_id, _ in keys}
        for part in sorted(self.path.glob(f"{_ADVANTAGES_PREFIX}*.parquet")):
            table = self._pq.read_table(part)
            keep = [n for n, task_id in enumerate(table.column("task_id").to_pylist()) if task_id not in tasks]
            self._rewrite(part, table, keep)
        for part in sorted(self.path.glob("part-*.parquet")):
            table = self._pq.read_table(part)
            ids, samples = table.column("task_id").to_pylist(), table.column("sample").to_pylist()
            keep = [n for n, key in enumerate(zip(ids, samples, strict=True)) if key not in keys]
            self._rewrite(part, table, keep)
        _fsync_dir(self.path)

    def _rewrite(self, part: Path, table: Any, keep: list[int]) -> None:
        """Replace ``part`` by the rows ``keep`` of its ``table`` (a temporary file renamed over; none: deleted)."""
        if len(keep) == table.num_rows:
            return
        if not keep:
            part.unlink()
            return
        temporary = part.with_name(part.name + ".tmp")  # a leftover is deleted on the next open
        self._pq.write_table(table.take(keep), temporary, row_group_size=len(keep))
        with temporary.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(temporary, part)

    def write(self, record: RolloutRecord) -> None:
        """Buffer one record; flush a part file when the row group is full."""
        self._buffer.append(record)
        self._done.add(record.key)
        if len(self._buffer) >= self.row_group_size:
            self.flush()

    def write_advantages(self, entry: GroupAdvantages) -> None:
        """Buffer the entry; it is written with the records' next part file (and before any later one)."""
        self._entries.append(entry)

    def flush(self) -> None:
        """Write the buffered records as one part file (one row group), then the buffered advantage entries."""
        self._flush_records()
        if self._entries:
            table = self._pa.Table.from_pylist(
                [msgspec.to_builtins(e) for e in self._entries], schema=_advantages_schema(self._pa)
            )
            final = self.path / f"{_ADVANTAGES_PREFIX}{self._run}-{self._parts:05d}.parquet"
            temporary = final.with_name(final.name + ".tmp")
            self._pq.write_table(table, temporary)
            os.replace(temporary, final)
            self._entries.clear()

    def _flush_records(self) -> None:
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
        """Flush the last, partial row group; release the lock."""
        try:
            self.flush()
        finally:
            self._release_lock()


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
    entries: dict[str, GroupAdvantages] = {}
    if source.suffix == ".parquet":
        pa, pq = pyarrow()
        if source.is_dir():
            entries = {e.task_id: e for e in _parquet_advantages(pq, source)}
        # The schema of this version: parts written before a column existed read it as null (without it, the
        # first part's schema would drop the columns the later parts have).
        for row in pq.read_table(source, schema=arrow_schema(pa)).to_pylist():
            yield _with_advantage(record_from_row(row), entries)
        return
    skip: set[int] = set()
    with source.open("rb") as fh:  # first pass: the advantage entries (records are only skimmed for their kind)
        for number, line in enumerate(fh):
            if line.endswith(b"\n") and line.strip() and _KEY.decode(line).kind == "advantages":
                entry = _ADVANTAGES.decode(line)
                entries[entry.task_id] = entry
                skip.add(number)
    with source.open("rb") as fh:
        for number, line in enumerate(fh):
            if line.endswith(b"\n") and line.strip() and number not in skip:
                yield _with_advantage(_RECORD.decode(line), entries)


def _with_advantage(record: RolloutRecord, entries: dict[str, GroupAdvantages]) -> RolloutRecord:
    entry = entries.get(record.task_id)
    return record if entry is None else entry.apply(record)


_ADVANTAGES_PREFIX = "_advantages-"
"""Advantage files of a Parquet output: ``pyarrow.parquet.read_table(dir)`` skips names starting with ``_``."""


def _advantages_schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("kind", pa.string()),
            ("task_id", pa.string()),
            ("samples", pa.list_(pa.int64())),
            ("values", pa.list_(pa.float64())),
            ("error", pa.string()),
        ]
    )


def _parquet_advantages(pq: Any, directory: Path) -> Iterator[GroupAdvantages]:
    """The advantage entries of a Parquet output directory, oldest first."""
    for part in sorted(directory.glob(f"{_ADVANTAGES_PREFIX}*.parquet")):
        for row in pq.read_table(part).to_pylist():
            yield msgspec.convert(row, GroupAdvantages)


def record_to_row(record: RolloutRecord) -> dict[str, Any]:
    """A record as one row of the Parquet file (and of a Ray Data batch): ``trajectory`` as its JSON text."""
    row: dict[str, Any] = msgspec.to_builtins(record)
    row["trajectory"] = _ENCODER.encode(record.trajectory).decode()
    return row


def record_from_row(row: dict[str, Any]) -> RolloutRecord:
    """The record of a row written by :func:`record_to_row` (a Parquet or Ray Data row)."""
    fields = dict(row)
    fields["trajectory"] = msgspec.json.decode(fields["trajectory"], type=TrajectoryRecord)
    if fields.get("stale") is None:  # a part written before the column existed
        fields["stale"] = False
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
            ("staleness", pa.int64()),
            ("stale", pa.bool_()),
        ]
    )

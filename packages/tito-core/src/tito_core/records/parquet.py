"""Rollout records as Parquet: the writer of whole part files (one row group each) and its reader.

A Parquet output is a directory of ``part-*.parquet`` files, each written under a temporary name and renamed
when whole, and of ``_advantages-*.parquet`` files for the group advantage entries (which
``pyarrow.parquet.read_table`` skips).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from .._optional import pyarrow
from ..errors import ConfigError
from .lock import OutputLock
from .schema import (
    GroupAdvantages,
    Key,
    Outcome,
    RolloutRecord,
    arrow_schema,
    record_from_row,
    record_to_row,
    with_advantage,
)
from .writer import RecordWriter, fsync_dir, with_image_files

__all__ = ["ParquetWriter", "read_parquet"]


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
        return {entry.task_id: entry for entry in parquet_advantages(self._pq, self.path)}

    def _remove(self, keys: set[Key]) -> None:
        """Rewrite each part file holding one of ``keys`` without those rows (a part left empty is deleted)."""
        tasks = {task_id for task_id, _ in keys}
        for part in sorted(self.path.glob(f"{ADVANTAGES_PREFIX}*.parquet")):
            table = self._pq.read_table(part)
            keep = [n for n, task_id in enumerate(table.column("task_id").to_pylist()) if task_id not in tasks]
            self._rewrite(part, table, keep)
        for part in sorted(self.path.glob("part-*.parquet")):
            table = self._pq.read_table(part)
            ids, samples = table.column("task_id").to_pylist(), table.column("sample").to_pylist()
            keep = [n for n, key in enumerate(zip(ids, samples, strict=True)) if key not in keys]
            self._rewrite(part, table, keep)
        fsync_dir(self.path)

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
        """Buffer one record (its images' files are written now); flush a part file when the row group is full.

        (:func:`~tito_core.records.writer.with_image_files`).
        """
        self._buffer.append(with_image_files(record, self.path))
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
                [msgspec.to_builtins(e) for e in self._entries], schema=advantages_schema(self._pa)
            )
            final = self.path / f"{ADVANTAGES_PREFIX}{self._run}-{self._parts:05d}.parquet"
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


def read_parquet(source: Path) -> Iterator[RolloutRecord]:
    """Every record of a Parquet output (a directory of parts, or one file), with its task's advantage applied."""
    entries: dict[str, GroupAdvantages] = {}
    pa, pq = pyarrow()
    if source.is_dir():
        entries = {e.task_id: e for e in parquet_advantages(pq, source)}
    # The schema of this version: parts written before a column existed read it as null (without it, the
    # first part's schema would drop the columns the later parts have).
    for row in pq.read_table(source, schema=arrow_schema(pa)).to_pylist():
        yield with_advantage(record_from_row(row), entries)


ADVANTAGES_PREFIX = "_advantages-"
"""Advantage files of a Parquet output: ``pyarrow.parquet.read_table(dir)`` skips names starting with ``_``."""


def advantages_schema(pa: Any) -> Any:
    """The Arrow schema of an advantages file's rows (``pa`` is the ``pyarrow`` module)."""
    return pa.schema(
        [
            ("kind", pa.string()),
            ("task_id", pa.string()),
            ("samples", pa.list_(pa.int64())),
            ("values", pa.list_(pa.float64())),
            ("error", pa.string()),
        ]
    )


def parquet_advantages(pq: Any, directory: Path) -> Iterator[GroupAdvantages]:
    """The advantage entries of a Parquet output directory, oldest first."""
    for part in sorted(directory.glob(f"{ADVANTAGES_PREFIX}*.parquet")):
        for row in pq.read_table(part).to_pylist():
            yield msgspec.convert(row, GroupAdvantages)

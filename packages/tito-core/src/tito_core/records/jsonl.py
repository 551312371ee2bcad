"""Rollout records as JSON lines: the JSONL writer (torn last line cut off on open) and its reader.

One JSON object per line, each written with one ``write`` call as soon as its rollout finishes; a
:class:`~tito_core.records.schema.GroupAdvantages` entry is a line of ``"kind": "advantages"``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec

from ..errors import ConfigError
from .lock import OutputLock
from .schema import (
    ADVANTAGES_DECODER,
    ENCODER,
    KEY_DECODER,
    RECORD_DECODER,
    GroupAdvantages,
    Key,
    Outcome,
    RolloutRecord,
    with_advantage,
)
from .writer import RecordWriter, fsync_dir, with_image_files

__all__ = ["JsonlWriter", "read_jsonl"]

logger = logging.getLogger("tito.runner")
_T = TypeVar("_T")


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
                    view = KEY_DECODER.decode(line)
                    if view.kind == "advantages":
                        advantages[view.task_id] = ADVANTAGES_DECODER.decode(line)
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
                    if line.strip() and _removes_line(line, keys):
                        continue
                    new.write(line)
                new.flush()
                os.fsync(new.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)
        self._fd = self._open()

    def write(self, record: RolloutRecord) -> None:
        """Append one line, in one ``write``, after its images' files.

        (:func:`~tito_core.records.writer.with_image_files`).
        """
        self._append(ENCODER.encode(with_image_files(record, self.path)))
        self._done.add(record.key)

    def write_advantages(self, entry: GroupAdvantages) -> None:
        """Append the entry as one line, in one ``write``."""
        self._append(ENCODER.encode(entry))

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


def _removes_line(line: bytes, keys: set[Key]) -> bool:
    """Whether :meth:`JsonlWriter.remove` drops this JSON line: a record of ``keys``, or an entry of their tasks."""
    view = KEY_DECODER.decode(line)  # every line was checked by the scan on open
    if view.kind == "advantages":
        return any(task_id == view.task_id for task_id, _ in keys)
    return (view.task_id, view.sample) in keys


def read_jsonl(source: Path, *, on_partial: Callable[[int], None] | None = None) -> Iterator[RolloutRecord]:
    """Every record of a JSONL rollout file, in file order, with its task's last advantage entry applied.

    A last line without its newline (a run still writing it, or killed mid-write) is skipped: ``on_partial`` is
    called with its size in bytes (without it, a warning is logged).

    Raises:
        ConfigError: A line that is not a record or an advantages entry, named by its number.
    """
    entries: dict[str, GroupAdvantages] = {}
    skip: set[int] = set()
    with source.open("rb") as fh:  # first pass: the advantage entries (records are only skimmed for their kind)
        for number, line in enumerate(fh):
            if not line.endswith(b"\n"):
                if line.strip():
                    if on_partial is None:
                        logger.warning("%s: skipped a partial last line (%d bytes, no newline)", source, len(line))
                    else:
                        on_partial(len(line))
                continue
            if line.strip() and _decoded(source, number, line, KEY_DECODER).kind == "advantages":
                entry = _decoded(source, number, line, ADVANTAGES_DECODER)
                entries[entry.task_id] = entry
                skip.add(number)
    with source.open("rb") as fh:
        for number, line in enumerate(fh):
            if line.endswith(b"\n") and line.strip() and number not in skip:
                yield with_advantage(_decoded(source, number, line, RECORD_DECODER), entries)


def _decoded(source: Path, number: int, line: bytes, decoder: msgspec.json.Decoder[_T]) -> _T:
    """``line`` (0-based ``number``) decoded; a ConfigError naming the file and the line (1-based) if it is not."""
    try:
        return decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{source}: line {number + 1} is not a rollout record: {exc}") from None

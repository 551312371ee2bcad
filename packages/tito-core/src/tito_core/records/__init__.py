"""Rollout records and the append-only files that hold them (JSONL or Parquet), resumable.

The package under both the rollout runner and the gateway (which write the same records), one job per module:
:mod:`~tito_core.records.schema` (:class:`RolloutRecord` and its row form), :mod:`~tito_core.records.writer`
(the writer base), :mod:`~tito_core.records.jsonl` and :mod:`~tito_core.records.parquet` (the two formats),
:mod:`~tito_core.records.lock` (one writer per output), :mod:`~tito_core.records.files` (open, read, build a
record).

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

from .files import (
    RolloutFile,
    check_output,
    highest_token_id,
    open_writer,
    read_records,
    read_rollout_file,
    rollout_digest,
    rollout_record,
)
from .jsonl import JsonlWriter
from .lock import OutputLock, OutputLockedError
from .parquet import ParquetWriter
from .schema import (
    FinalStatus,
    GroupAdvantages,
    Key,
    Outcome,
    RolloutRecord,
    Timings,
    TokenCounts,
    arrow_schema,
    record_from_row,
    record_to_row,
)
from .writer import RecordWriter

__all__ = [
    "FinalStatus",
    "GroupAdvantages",
    "JsonlWriter",
    "Key",
    "Outcome",
    "OutputLock",
    "OutputLockedError",
    "ParquetWriter",
    "RecordWriter",
    "RolloutFile",
    "RolloutRecord",
    "Timings",
    "TokenCounts",
    "arrow_schema",
    "check_output",
    "highest_token_id",
    "open_writer",
    "read_records",
    "read_rollout_file",
    "record_from_row",
    "record_to_row",
    "rollout_digest",
    "rollout_record",
]

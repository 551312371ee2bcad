"""Datasets of tasks: JSONL or Parquet rows with an ``id``, a ``prompt`` and optional ``answer`` / metadata.

Every row is checked before any rollout starts: a row without a prompt, with a prompt of the wrong shape or
with a duplicate id is a :class:`~tito_core.errors.DatasetError` naming the file and the row (1-based).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from .._optional import pyarrow
from ..errors import DatasetError

__all__ = ["Task", "load_tasks", "rollout_seed", "task_from_row"]

Prompt = str | list[dict[str, Any]]
"""A user prompt as text, or chat messages ``[{"role": ..., "content": ...}, ...]`` ending with a user turn."""

_KNOWN = frozenset({"id", "prompt", "answer", "metadata"})
_ROLES = frozenset({"system", "user", "assistant"})


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """One task: what the agent is asked, and what the reward function checks against.

    Attributes:
        id: The task id (unique in its dataset); the row index when the row has none.
        prompt: Text, or chat messages ending with a user turn (a ``system`` message sets the system prompt).
        answer: The reference answer, for the reward function.
        metadata: The row's ``metadata`` mapping plus any other column.
        index: Position of the task in its dataset (0-based); the group id of its rollouts.
    """

    id: str
    prompt: Prompt
    answer: Any = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    index: int = 0


def task_from_row(row: Mapping[str, Any], index: int, *, where: str = "dataset") -> Task:
    """Check one row and build its :class:`Task` (``index`` is 0-based; messages name row ``index + 1``)."""
    at = f"{where}: row {index + 1}"
    if not isinstance(row, Mapping):
        raise DatasetError(f"{at}: a row must be an object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if prompt is None or prompt == "" or prompt == []:
        raise DatasetError(f"{at}: no `prompt` (give text or a list of chat messages)")
    if not isinstance(prompt, str):
        prompt = _messages(prompt, at)
    raw_id = row.get("id", index)
    if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
        raise DatasetError(f"{at}: `id` must be text or an integer, got {type(raw_id).__name__}")
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise DatasetError(f"{at}: `metadata` must be an object, got {type(metadata).__name__}")
    extra = {key: value for key, value in row.items() if key not in _KNOWN}
    return Task(id=str(raw_id), prompt=prompt, answer=row.get("answer"), metadata={**metadata, **extra}, index=index)


def rollout_seed(seed: int, task_id: str, sample: int) -> int:
    """The sampling seed of one rollout of a seeded run.

    The same for the same ``(seed, task, sample)`` in any process and any order, unrelated between rollouts (a
    hash, so rollouts never share a random stream).
    """
    digest = hashlib.sha256(f"{seed}\x00{task_id}\x00{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # 63 bits: every engine takes it


def _messages(prompt: Any, at: str) -> list[dict[str, Any]]:
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise DatasetError(f"{at}: `prompt` must be text or a list of chat messages, got {type(prompt).__name__}")
    messages: list[dict[str, Any]] = []
    for n, message in enumerate(prompt):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise DatasetError(f"{at}: prompt message {n} needs a `role` among {sorted(_ROLES)}")
        if not isinstance(message.get("content"), str):
            raise DatasetError(f"{at}: prompt message {n} needs text `content`")
        messages.append({"role": message["role"], "content": message["content"]})
    if messages[-1]["role"] != "user":
        raise DatasetError(f"{at}: the prompt's last message must be a user turn, not {messages[-1]['role']!r}")
    return messages


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Read and check every task of a ``.jsonl`` / ``.json`` (one object per line) or ``.parquet`` file.

    Raises:
        DatasetError: The file is missing or unreadable, a line is not JSON, a row is not a task, an id repeats,
            or the dataset is empty.
    """
    source = Path(path)
    if not source.is_file():
        raise DatasetError(f"{source}: dataset file not found")
    rows = _parquet_rows(source) if source.suffix == ".parquet" else _jsonl_rows(source)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        task = task_from_row(row, index, where=str(source))
        if task.id in seen:
            raise DatasetError(f"{source}: row {index + 1}: id {task.id!r} repeats row {seen[task.id] + 1}")
        seen[task.id] = index
        tasks.append(task)
    if not tasks:
        raise DatasetError(f"{source}: the dataset has no tasks")
    return tasks


def _jsonl_rows(source: Path) -> Iterator[Any]:
    try:
        lines = source.read_bytes().splitlines()
    except OSError as exc:
        raise DatasetError(f"{source}: cannot read the dataset: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise DatasetError(f"{source}: line {number}: not JSON: {exc}") from exc


def _parquet_rows(source: Path) -> Iterator[Any]:
    _, pq = pyarrow()
    try:
        table = pq.read_table(source)
    except Exception as exc:  # pyarrow raises several unrelated types for unreadable files
        raise DatasetError(f"{source}: cannot read the Parquet dataset: {exc}") from exc
    yield from table.to_pylist()

"""Where the viewer's rollouts come from: the :class:`Source` protocol, and a rollout file (``tito view``)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError
from ..media.image import picture_format
from ..records import RolloutRecord, read_records
from ..trajectory import Trajectory
from ..trajectory.record import TrajectoryRecord
from .pages import TokenTexts, group_rewards, record_fields, record_view, run_row

__all__ = ["FileSource", "Source", "image_of", "runs_page"]

IMAGE_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg", "webp": "image/webp", "gif": "image/gif"}


class Source(Protocol):
    """What the viewer reads. Keys are strings the source chooses (a record's place in a file, a rollout id)."""

    title: str

    def runs(self) -> dict[str, Any]:
        """The runs page: ``rows`` (:func:`~tito_core.viewer.pages.run_row`), status counts, group rewards."""
        ...

    def record(self, key: str) -> dict[str, Any]:
        """The record page of ``key`` (:func:`~tito_core.viewer.pages.record_view`); KeyError when unknown."""
        ...

    def image(self, key: str, sha256: str) -> tuple[bytes, str]:
        """An image of record ``key``: its bytes and content type; KeyError when unknown."""
        ...

    def figure(self, index: int) -> Path:
        """The ``index``-th figure (a PNG) shown on the runs page; IndexError when there is none."""
        ...


def runs_page(title: str, rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The runs page's data: the rows, their status counts and each group's rewards, and ``extra``."""
    return {
        "title": title,
        "rows": rows,
        "statuses": dict(Counter(row["status"] for row in rows)),
        "groups": group_rewards(rows),
        **extra,
    }


def image_type(fmt: str) -> str:
    """The content type of an image format name (``png``, ``jpeg``...)."""
    return IMAGE_TYPES.get(fmt.lower(), "application/octet-stream")


def image_of(traj: TrajectoryRecord, sha256: str) -> tuple[bytes, str]:
    """The bytes and content type of picture ``sha256`` (an image, a video's frame) of ``traj`` or its branches.

    Raises:
        KeyError: no branch holds it.
    """
    pending = [traj]
    while pending:
        branch = pending.pop()
        if sha256 in branch.image_data:
            data = branch.image_data[sha256]
            return data, image_type(picture_format(data))
        pending.extend(branch.branches)
    raise KeyError(sha256)


class FileSource:
    """A rollout file (JSONL or Parquet, images from ``<output>.images/``), read once.

    Args:
        path: The rollout file.
        tokenizer: Decodes token ids into text (None: ids only).
        audit: A ``tito audit --json`` report; with ``--per-token`` its token deltas colour the record pages.
        figures: PNG files to show on the runs page (``tito audit --plot``, the A/B benchmark's plots).

    Raises:
        ConfigError: A file that does not exist or is not a report / a PNG.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        tokenizer: Any = None,
        *,
        audit: str | os.PathLike[str] | None = None,
        figures: list[str | os.PathLike[str]] | tuple[()] = (),
    ) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(f"{self.path}: no such rollout file")
        self.title = self.path.name
        self.records: list[RolloutRecord] = list(read_records(self.path))
        self.texts = TokenTexts(tokenizer)
        self.audit, self.deltas = _read_audit(audit)
        self.figures = [Path(f) for f in figures]
        for figure in self.figures:
            if not figure.is_file() or figure.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
                raise ConfigError(f"--figure {figure}: not a PNG file")

    def runs(self) -> dict[str, Any]:
        """The runs page of the file's records (key: the record's place in the file)."""
        rows = [run_row(str(i), record) for i, record in enumerate(self.records)]
        summary = None
        if self.audit is not None:
            summary = {k: self.audit.get(k) for k in ("scorer", "records", "all", "free", "constrained", "skipped")}
        return runs_page(self.title, rows, audit=summary, figures=[f.name for f in self.figures], live=False)

    def _get(self, key: str) -> RolloutRecord:
        if not key.isdigit() or int(key) >= len(self.records):
            raise KeyError(key)
        return self.records[int(key)]

    def record(self, key: str) -> dict[str, Any]:
        """Record number ``key`` of the file, token by token."""
        record = self._get(key)
        deltas = self.deltas.get(f"{record.task_id}:{record.sample}")
        return record_view(record_fields(record), Trajectory.from_record(record.trajectory), self.texts,
                           deltas=deltas, image_url=lambda sha: f"images/{key}/{sha}")  # fmt: skip

    def image(self, key: str, sha256: str) -> tuple[bytes, str]:
        """An image of record ``key`` (any of its branches)."""
        return image_of(self._get(key).trajectory, sha256)

    def figure(self, index: int) -> Path:
        """The ``index``-th ``--figure``."""
        return self.figures[index]


def _read_audit(path: str | os.PathLike[str] | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    if path is None:
        return None, {}
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--audit {path}: not a readable `tito audit --json` report ({exc})") from None
    if not isinstance(report, dict) or "free" not in report:
        raise ConfigError(f"--audit {path}: not a `tito audit --json` report (no `free` figures)")
    return report, report.get("tokens") or {}

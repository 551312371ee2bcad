"""Where the viewer's rollouts come from: the :class:`Source` protocol, and a rollout file (``tito view``)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError
from ..media.image import picture_format
from ..records import RolloutFile, RolloutRecord, highest_token_id, read_rollout_file, rollout_digest
from ..trajectory import Trajectory
from ..trajectory.record import TrajectoryRecord
from ..versions import version_key
from .pages import TokenTexts, group_rewards, record_fields, record_view, run_row, weight_versions

__all__ = ["FileSource", "Source", "check_tokenizer", "image_of", "runs_page"]

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


def check_tokenizer(records: list[RolloutRecord], tokenizer: Any, what: str) -> None:
    """Refuse a tokenizer the records were not made with: one whose vocabulary lacks some of their token ids.

    Raises:
        ConfigError: One line naming the highest id and the tokenizer's size.
    """
    size = len(tokenizer)
    highest = highest_token_id(records)
    if highest >= size:
        raise ConfigError(f"{what}: the records hold token id {highest}, beyond its {size} tokens: they were not "
                          "made with this tokenizer")  # fmt: skip


class FileSource:
    """A rollout file (JSONL or Parquet, images from ``<output>.images/``; or ``tito demo``'s trajectories), read once.

    Args:
        path: The rollout file, or its records already read (:func:`~tito_core.records.read_rollout_file`).
        tokenizer: Decodes token ids into text (None: ids only; :meth:`decode_with` sets one later).
        audit: A ``tito audit --json`` report of these records: its per-rollout figures are columns of the runs
            table, and with ``--per-token`` its token deltas colour the record pages.
        figures: PNG files to show on the runs page (``tito audit --plot``, the A/B benchmark's plots).

    Raises:
        ConfigError: A file that does not exist or is not a report / a PNG; a report made from other records.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | RolloutFile,
        tokenizer: Any = None,
        *,
        audit: str | os.PathLike[str] | None = None,
        figures: list[str | os.PathLike[str]] | tuple[()] = (),
    ) -> None:
        rollouts = path if isinstance(path, RolloutFile) else read_rollout_file(path)
        self.path = Path(rollouts.path)
        self.title = self.path.name
        self.records: list[RolloutRecord] = rollouts.records
        self.texts = TokenTexts(None)
        self.versions = sorted({v for r in self.records for v in weight_versions(r.trajectory)}, key=version_key)
        self.audit, self.deltas, self.audit_rows = _read_audit(audit, self.records, self.path)
        self.figures = [Path(f) for f in figures]
        for figure in self.figures:
            if not figure.is_file() or figure.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
                raise ConfigError(f"--figure {figure}: not a PNG file")
        if tokenizer is not None:
            self.decode_with(tokenizer)

    def decode_with(self, tokenizer: Any, what: str = "the tokenizer") -> None:
        """Show the tokens as ``tokenizer``'s text (:func:`check_tokenizer` first; ``what`` names it in an error)."""
        check_tokenizer(self.records, tokenizer, what)
        self.texts = TokenTexts(tokenizer)

    def runs(self) -> dict[str, Any]:
        """The runs page of the file's records (key: the record's place in the file)."""
        rows = []
        for i, record in enumerate(self.records):
            row = run_row(str(i), record)
            if self.audit is not None:
                gaps = self.audit_rows.get(f"{record.task_id}:{record.sample}") or {}
                row["audit_max_abs"] = (gaps.get("all") or {}).get("max_abs")
                row["audit_free_k3"] = (gaps.get("free") or {}).get("k3")
            rows.append(row)
        summary = None
        if self.audit is not None:
            summary = {k: self.audit.get(k) for k in ("scorer", "records", "all", "free", "constrained", "skipped")}
        return runs_page(self.title, rows, audit=summary, figures=[f.name for f in self.figures], live=False,
                         versions=self.versions)  # fmt: skip

    def _get(self, key: str) -> RolloutRecord:
        if not key.isdigit() or int(key) >= len(self.records):
            raise KeyError(key)
        return self.records[int(key)]

    def record(self, key: str) -> dict[str, Any]:
        """Record number ``key`` of the file, token by token."""
        record = self._get(key)
        deltas = self.deltas.get(f"{record.task_id}:{record.sample}")
        return record_view(record_fields(record), Trajectory.from_record(record.trajectory), self.texts,
                           deltas=deltas, image_url=lambda sha: f"images/{key}/{sha}",
                           versions=self.versions)  # fmt: skip

    def image(self, key: str, sha256: str) -> tuple[bytes, str]:
        """An image of record ``key`` (any of its branches)."""
        return image_of(self._get(key).trajectory, sha256)

    def figure(self, index: int) -> Path:
        """The ``index``-th ``--figure``."""
        return self.figures[index]


def _read_audit(
    path: str | os.PathLike[str] | None, records: list[RolloutRecord], source: Path
) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]:
    """The report, its token deltas and its per-rollout figures; refused unless it was made from ``records``."""
    if path is None:
        return None, {}, {}
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"--audit {path}: not a readable `tito audit --json` report ({reason})") from None
    if not isinstance(report, dict) or "free" not in report:
        raise ConfigError(f"--audit {path}: not a `tito audit --json` report (no `free` figures)")
    rollouts = report.get("rollouts")
    if not isinstance(rollouts, dict):
        raise ConfigError(f"--audit {path}: the report does not say which records it scored (an older `tito "
                          "audit`): run `tito audit --json` on this file again")  # fmt: skip
    digests = {f"{r.task_id}:{r.sample}": rollout_digest(r) for r in records}
    for key, gaps in rollouts.items():
        if key not in digests:
            raise ConfigError(f"--audit {path}: made from other records: it scored rollout {key!r}, which "
                              f"{source.name} does not hold")  # fmt: skip
        if not isinstance(gaps, dict) or gaps.get("digest") != digests[key]:
            raise ConfigError(f"--audit {path}: made from other records: rollout {key!r} has other tokens in "
                              f"{source.name}")  # fmt: skip
    tokens = report.get("tokens") or {}
    stray = next((key for key in tokens if key not in rollouts), None)
    if stray is not None:
        raise ConfigError(f"--audit {path}: its token gaps name rollout {stray!r}, which it did not score")
    return report, tokens, rollouts

"""The token-level record of one rollout: segments, per-turn records, status and branches.

A trajectory is append-only. Token ids and logprobs live in two compact arrays (4 + 8 bytes per token);
segments are offsets into them, and the flat views (:attr:`Trajectory.token_ids`,
:attr:`Trajectory.loss_mask`, :attr:`Trajectory.logprobs`) are derived on demand, never stored twice.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..errors import TrajectoryError
from ..media import Image, MediaSpan, PromptMedia, picture_hashes
from ..status import Closed, status_of
from ..versions import VersionSpan
from . import views
from .arrays import append_tokens, extend_logprobs
from .media import TrajectoryMedia, referenced
from .record import (
    JSON_DECODER,
    JSON_ENCODER,
    MSGPACK_DECODER,
    MSGPACK_ENCODER,
    CallRef,
    ForkKind,
    Segment,
    SegmentKind,
    Status,
    TrajectoryRecord,
    Turn,
    Usage,
    snapshot,
)

__all__ = ["Segment", "SegmentKind", "Status", "Trajectory", "TrajectoryRecord", "Turn", "Usage", "branch_off"]


class Trajectory(TrajectoryMedia):
    """Token ids, loss mask and logprobs of one rollout, exactly as the engine consumed and produced them.

    A live trajectory grows as the model is called; :meth:`close` freezes it. A rollout is a tree of branches:
    :func:`branch_off` starts a new branch that shares the rollout id and keeps a copy of the shared token prefix
    (this one stays open: another lineage of the rollout), :meth:`fork` does the same and closes this branch (the
    new one supersedes it). The trajectory a rollout hands out is the branch of its last call, with every other
    branch of the rollout in :attr:`branches`.
    """

    __slots__ = (
        "_closed",
        "_ids",
        "_image_data",
        "_lps",
        "_media",
        "_segments",
        "_turns",
        "branch",
        "branches",
        "compacted_from",
        "fork_at",
        "fork_kind",
        "fork_reason",
        "label",
        "metadata",
        "parent_branch",
        "rollout_id",
        "status",
        "status_reason",
        "tool_parse_errors",
    )

    def __init__(self, rollout_id: str | None = None, *, branch: int = 0) -> None:
        self.rollout_id: str = rollout_id or uuid.uuid4().hex
        self.branch: int = branch
        self.parent_branch: int | None = None
        self.fork_at: int = 0
        self.fork_reason: str | None = None
        self.fork_kind: ForkKind | None = None
        self.label: str | None = None
        self.compacted_from: CallRef | None = None
        self.status: Status = "running"
        self.status_reason: str | None = None
        self.tool_parse_errors: dict[str, int] = {}
        self.branches: list[Trajectory] = []
        self.metadata: dict[str, Any] = {}
        self._ids = array("i")
        self._lps = array("f")  # widened to "d" by the first logprob float32 cannot hold exactly
        self._segments: list[Segment] = []
        self._turns: list[Turn] = []
        self._media: list[MediaSpan] = []
        self._image_data: dict[str, Image] = {}
        self._closed = False

    # ----------------------------------------------------------------------------------------- views
    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return (
            f"Trajectory(rollout_id={self.rollout_id!r}, branch={self.branch}, tokens={len(self)}, "
            f"turns={len(self._turns)}, status={self.status!r})"
        )

    @property
    def token_ids(self) -> list[int]:
        """Every token of the rollout, in order."""
        return self._ids.tolist()

    @property
    def loss_mask(self) -> list[int]:
        """1 for tokens the model generated, 0 for everything else; aligned with :attr:`token_ids`."""
        return views.loss_mask(self._segments, len(self._ids))

    @property
    def logprobs(self) -> list[float | None]:
        """Per-token logprob (None where the engine gave none); aligned with :attr:`token_ids`."""
        return [None if math.isnan(x) else x for x in self._lps]

    def logprobs_from(self, start: int) -> list[float | None]:
        """The logprobs from token ``start`` on (None where none), without building the whole :attr:`logprobs`."""
        return [None if math.isnan(x) else x for x in self._lps[start:]]

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments, in order; they tile the whole trajectory."""
        return tuple(self._segments)

    @property
    def last_segment(self) -> Segment | None:
        """The most recent segment (None while empty), without copying the segment list."""
        return self._segments[-1] if self._segments else None

    @property
    def turns(self) -> tuple[Turn, ...]:
        """One record per model call whose result was kept."""
        return tuple(self._turns)

    def add_media(self, media: Iterable[PromptMedia]) -> None:
        """Record the media of tokens just appended (in their :meth:`atomic` block); each picture is kept once."""
        self._check_open()
        for entry in media:
            self._media.append(entry.span)
            for picture in entry.item.pictures():
                self._image_data.setdefault(picture.sha256, picture)

    @property
    def closed(self) -> bool:
        """True once the trajectory was closed (by :meth:`close`, a reset or a fork)."""
        return self._closed

    @property
    def prompt_length(self) -> int:
        """Length of the first prompt (system, tools, first user turn, generation header)."""
        return self.first_output_from(0)

    def first_output_from(self, start: int) -> int:
        """Offset of the first generated token at or after ``start`` (the length when there is none)."""
        return views.first_output_from(self._segments, start, len(self._ids))

    @property
    def all_branches(self) -> list[Trajectory]:
        """Every branch of the rollout: the others (:attr:`branches`, by number), then this one.

        A branch with a ``parent_branch`` starts with a copy of its parent's first ``fork_at`` tokens; one without
        (branch 0, a new lineage) starts from nothing.
        """
        return [*self.branches, self]

    def ids_array(self, start: int = 0) -> array[int]:
        """The token ids from ``start`` on as an ``array('i')`` (a copy: cheap, 4 bytes per token)."""
        return self._ids[start:] if start else array("i", self._ids)

    def tokens(self, segment: Segment) -> list[int]:
        """The token ids of one segment."""
        return self._ids[segment.start : segment.end].tolist()

    def routed_experts(self) -> tuple[bytes, tuple[int, int]] | None:
        """Routing rows of the whole trajectory (``len(self) - 1`` rows of ``layers x top_k`` int32).

        Later calls overwrite the rows they report again, so a server that returns the whole request
        and one that crops per call give the same result. None when no call reported routing.
        """
        return views.routed_experts(self._turns, len(self._ids))

    def weight_versions(self, since: int = 0) -> list[VersionSpan] | None:
        """The weights of every generated token: each turn's spans at trajectory token positions.

        Only the turns whose output starts at or after token ``since`` (e.g. a branch's own turns). None when
        one of them generated tokens without versions (its backend reported none).
        """
        return views.weight_versions(self._turns, since)

    def token_weight_versions(self) -> list[str | None] | None:
        """Per token, the version of the weights that generated it (None for prompt and boundary tokens).

        Aligned with :attr:`token_ids`; None when the versions are unknown (see :meth:`weight_versions`).
        """
        spans = self.weight_versions()
        if spans is None:
            return None
        return views.token_weight_versions(spans, len(self._ids))

    def weight_version_range(self, *, branches: bool = False) -> tuple[str, str] | None:
        """``(oldest, newest)`` version of the generated tokens (order: :func:`tito_core.versions.version_key`).

        With ``branches``, the earlier branches' tokens count too. None when nothing was generated, or when
        some generated tokens have no version.
        """
        trajs = (*self.branches, self) if branches else (self,)
        return views.version_range_of(traj.weight_versions() for traj in trajs)

    # -------------------------------------------------------------------------------------- growing
    def _check_open(self) -> None:
        if self._closed:
            raise TrajectoryError(f"trajectory {self.rollout_id}/{self.branch} is closed; it cannot grow")

    def append(
        self,
        kind: SegmentKind,
        token_ids: Iterable[int],
        logprobs: Sequence[float | None] | None = None,
        *,
        turn: int,
    ) -> Segment | None:
        """Append one segment; returns it (None when ``token_ids`` is empty).

        Raises:
            TrajectoryError: when closed, when a token id is not an int32 integer, or when ``logprobs`` does not
                have one entry per token; nothing is appended then.
        """
        self._check_open()
        start = len(self._ids)
        self._lps = append_tokens(self._ids, self._lps, kind, token_ids, logprobs)
        end = len(self._ids)
        if end == start:
            return None
        return views.add_segment(self._segments, kind, start, end, turn)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[Trajectory]:
        """Group appends so they are kept whole or not at all: any exception inside rolls them all back.

        Restores the tokens, logprobs, segments, turns and tool-parse error counts the trajectory had when
        the block began, then re-raises.
        """
        self._check_open()
        n, segments, turns = len(self._ids), list(self._segments), len(self._turns)
        parse_errors, lps, media = dict(self.tool_parse_errors), self._lps, len(self._media)
        try:
            yield self
        except BaseException:
            del self._ids[n:]
            self._lps = lps  # the array of the start: a widening inside the block replaced it
            del self._lps[n:]
            self._segments[:] = segments
            del self._turns[turns:]
            self.tool_parse_errors = parse_errors
            if len(self._media) > media:
                del self._media[media:]
                self._image_data = referenced(self._media, self._image_data)
            raise

    def add_turn(self, turn: Turn) -> None:
        """Record a finished model call."""
        self._check_open()
        self._turns.append(turn)

    def set_status(self, status: Status, reason: str | None = None) -> None:
        """Set the status and the reason for it."""
        self._check_open()
        self.status, self.status_reason = status, reason

    def amend_status(self, status: Status, reason: str | None = None) -> None:
        """Change a closed trajectory's status after the fact (the runner, when the reward function fails)."""
        if not self._closed:
            raise TrajectoryError("amend_status() is for closed trajectories; use set_status()")
        self.status, self.status_reason = status, reason

    def close(self, status: Status | None = None, reason: str | None = None) -> Trajectory:
        """Freeze the trajectory. A still-running one is marked ``aborted`` unless a status is given."""
        if self._closed:
            return self
        if status is not None:
            self.status, self.status_reason = status, reason
        elif self.status == "running":
            self.status, self.status_reason = status_of(Closed(self.status, reason))
        self._closed = True
        return self

    def fork(
        self,
        keep: int,
        reason: str,
        *,
        status: Status | None = None,
        branch: int | None = None,
        kind: ForkKind | None = None,
    ) -> Trajectory:
        """Close this branch (with ``status``, if given) and start the one that supersedes it (:func:`_fork`)."""
        return _fork(self, keep, reason, status=status, branch=branch, kind=kind)

    # -------------------------------------------------------------------------------- serialization
    def to_record(self) -> TrajectoryRecord:
        """A frozen, serializable snapshot (earlier branches included)."""
        return snapshot(self)

    @classmethod
    def from_record(cls, record: TrajectoryRecord) -> Trajectory:
        """Rebuild a (closed) trajectory from its record (picture files must be resolved: ``image_data``)."""
        return _restore(cls(record.rollout_id, branch=record.branch), record)

    def to_json(self) -> bytes:
        """Encode as JSON."""
        return JSON_ENCODER.encode(self.to_record())

    def to_msgpack(self) -> bytes:
        """Encode as MessagePack."""
        return MSGPACK_ENCODER.encode(self.to_record())

    @classmethod
    def from_json(cls, data: bytes | str) -> Trajectory:
        """Decode from :meth:`to_json` output."""
        return cls.from_record(JSON_DECODER.decode(data))

    @classmethod
    def from_msgpack(cls, data: bytes) -> Trajectory:
        """Decode from :meth:`to_msgpack` output."""
        return cls.from_record(MSGPACK_DECODER.decode(data))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trajectory):
            return NotImplemented
        return self.to_record() == other.to_record()

    __hash__ = None  # type: ignore[assignment]


def _restore(traj: Trajectory, record: TrajectoryRecord) -> Trajectory:
    """Fill a new trajectory from ``record`` (earlier branches included) and close it."""
    if len(record.logprobs) != len(record.token_ids):
        raise TrajectoryError("record has a different number of logprobs and token ids")
    traj.parent_branch = record.parent_branch
    traj.fork_at = record.fork_at
    traj.fork_reason = record.fork_reason
    traj.fork_kind = record.fork_kind
    traj.label = record.label
    traj.compacted_from = record.compacted_from
    traj.status = record.status
    traj.status_reason = record.status_reason
    traj.tool_parse_errors = dict(record.tool_parse_errors)
    traj.metadata = dict(record.metadata)
    traj._ids = array("i", record.token_ids)
    traj._lps = extend_logprobs(traj._lps, list(record.logprobs))
    traj._segments = list(record.segments)
    traj._turns = list(record.turns)
    pictures = picture_hashes(record.media)
    missing = sorted(pictures - set(record.image_data))
    if missing:
        where = f" (stored in files: {record.image_paths[missing[0]]!r}; read the record with read_records)"
        raise TrajectoryError(
            f"the record has no bytes for image {missing[0]}" + (where if missing[0] in record.image_paths else "")
        )
    traj._media = list(record.media)
    traj._image_data = {sha: Image(record.image_data[sha]) for sha in sorted(pictures)}
    traj.branches = [_restore(Trajectory(b.rollout_id, branch=b.branch), b) for b in record.branches]
    traj._closed = True
    return traj


def branch_off(
    parent: Trajectory, keep: int, reason: str, *, branch: int | None = None, kind: ForkKind | None = None
) -> Trajectory:
    """A new branch that starts with ``parent``'s first ``keep`` tokens; ``parent`` stays open.

    ``keep`` must fall on a segment boundary. The new branch shares the rollout id, is numbered ``branch``
    (``parent.branch + 1`` when None), names ``parent`` as its parent, says why (``reason``, ``kind``) and keeps
    the turns, media and metadata whose tokens lie entirely within the kept prefix, and ``parent``'s label.

    Raises:
        TrajectoryError: ``keep`` is not a segment boundary.
    """
    bounds = {0, *(s.end for s in parent._segments)}
    if keep not in bounds:
        raise TrajectoryError(f"cannot fork at token {keep}: not a segment boundary")
    child = type(parent)(parent.rollout_id, branch=parent.branch + 1 if branch is None else branch)
    child.parent_branch = parent.branch
    child.fork_at = keep
    child.fork_reason = reason
    child.fork_kind = kind
    child.label = parent.label
    child.metadata = dict(parent.metadata)
    child._ids = parent._ids[:keep]
    child._lps = parent._lps[:keep]
    child._segments = [s for s in parent._segments if s.end <= keep]
    child._turns = [t for t in parent._turns if t.output_start + t.output_len <= keep]
    child._media = [s for s in parent._media if s.end <= keep]
    child._image_data = referenced(child._media, parent._image_data)
    child.tool_parse_errors = dict(parent.tool_parse_errors)
    return child


def _fork(
    parent: Trajectory,
    keep: int,
    reason: str,
    *,
    status: Status | None = None,
    branch: int | None = None,
    kind: ForkKind | None = None,
) -> Trajectory:
    """:func:`branch_off`, then close ``parent`` (with ``status``, if given): the new branch supersedes it.

    ``parent`` is kept in the new branch's ``branches``.
    """
    child = branch_off(parent, keep, reason, branch=branch, kind=kind)
    note = f"forked into branch {child.branch}: {reason}"
    parent.close(status, note) if status is not None else parent.close(reason=note)
    child.branches = [*parent.branches, parent]
    parent.branches = []
    return child

"""A rollout's trajectory as a gateway worker's journal writes it: per call, only what changed since its last line.

A :class:`~tito_core.trajectory.Trajectory` is a set of numbered branches (the current one holds the others), each
append-only: token ids and logprobs, segments that tile them, one turn per recorded call, media spans, and a head
(status, fork, label, metadata, ...). A call adds to one branch or starts one with a prefix of its parent's, and a
call that fails rolls its branch back to where it began. So a :class:`Delta` says, for each branch that changed: how
many of its segments, turns and media spans stay as the journal holds them (for a branch new to the journal: as it
holds the branch it started from, its parent), then the new ones, with the token ids and logprobs after the kept
segments, and its head when that changed; then which branch is current and the order of the others.

What stays is decided by identity: the journal's writer keeps the very ``Segment``, ``Turn`` and ``MediaSpan``
objects it wrote last. A branch never changes them in place (a segment that grows is a new object, a rollback puts
back the list the call began with, a branch started from a parent shares the parent's objects), so leading pieces
that are still the same objects cover the same tokens as when they were written.

:class:`Tracker` is the writer's side (what the journal holds of one rollout's trajectory), :class:`Rebuilt` the
reader's (the trajectory rebuilt line by line: :meth:`Rebuilt.record` equals the worker's ``to_record()`` then).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from ..media import MediaSpan
from ..status import Status
from ..trajectory import Trajectory
from ..trajectory.record import CallRef, ForkKind, Segment, TrajectoryRecord, Turn

__all__ = ["BranchDelta", "Delta", "DeltaError", "Head", "Rebuilt", "Tracker"]

T = TypeVar("T")


class DeltaError(ValueError):
    """A delta that does not apply to the trajectory rebuilt so far (a journal damaged, or written by another)."""


class Head(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A branch's fields besides its tokens and pieces (:class:`~tito_core.trajectory.TrajectoryRecord`'s)."""

    rollout_id: str
    status: Status
    status_reason: str | None = None
    parent_branch: int | None = None
    fork_at: int = 0
    fork_reason: str | None = None
    fork_kind: ForkKind | None = None
    label: str | None = None
    compacted_from: CallRef | None = None
    tool_parse_errors: dict[str, int] = {}
    metadata: dict[str, Any] = {}


class BranchDelta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What changed in branch ``branch``.

    Attributes:
        branch: The branch's number.
        base: For a branch the journal did not hold: the branch whose pieces it starts with (its parent); None: its
            own pieces as the journal holds them (none for a new one).
        segments_kept, turns_kept, media_kept: How many leading segments, turns and media spans of those stay.
        token_ids, logprobs: The tokens after the kept segments (their logprobs, None where none).
        segments, turns, media: The pieces after the kept ones.
        head: The branch's head, when it changed (always for a branch new to the journal).
        pictures: The sha256 of each picture the branch holds, in its order, when they changed.
    """

    branch: int
    base: int | None = None
    segments_kept: int = 0
    turns_kept: int = 0
    media_kept: int = 0
    token_ids: list[int] = []
    logprobs: list[float | None] = []
    segments: list[Segment] = []
    turns: list[Turn] = []
    media: list[MediaSpan] = []
    head: Head | None = None
    pictures: list[str] | None = None


class Delta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What changed in a rollout's trajectory: the branches that did, the current one, the pictures not held yet."""

    current: int
    others: list[int] | None = None
    """The other branches' numbers in the record's order, when they (or the current one) changed."""
    branches: list[BranchDelta] = []
    pictures: dict[str, bytes] = {}


_HEAD = msgspec.json.Encoder()


class _Held:
    """What the journal holds of one branch: the pieces it wrote (by identity), its head and pictures."""

    __slots__ = ("head", "media", "pictures", "segments", "turns")

    def __init__(
        self,
        segments: tuple[Segment, ...],
        turns: tuple[Turn, ...],
        media: tuple[MediaSpan, ...],
        head: bytes,
        pictures: tuple[str, ...],
    ) -> None:
        self.segments = segments
        self.turns = turns
        self.media = media
        self.head = head
        self.pictures = pictures


_NOTHING = _Held((), (), (), b"", ())
Pending = tuple[dict[int, _Held], tuple[int, tuple[int, ...]], dict[str, bytes]]
"""What :meth:`Tracker.delta` gives to :meth:`Tracker.commit`: the branches held, the shape, the pictures added."""


def _same_start(held: Sequence[T], now: Sequence[T]) -> int:
    """How many leading items of ``now`` are the very objects ``held`` has there."""
    n = 0
    for a, b in zip(held, now, strict=False):
        if a is not b:
            break
        n += 1
    return n


def head_of(branch: Trajectory) -> Head:
    """The head of ``branch`` as it stands."""
    return Head(
        rollout_id=branch.rollout_id,
        status=branch.status,
        status_reason=branch.status_reason,
        parent_branch=branch.parent_branch,
        fork_at=branch.fork_at,
        fork_reason=branch.fork_reason,
        fork_kind=branch.fork_kind,
        label=branch.label,
        compacted_from=branch.compacted_from,
        tool_parse_errors=branch.tool_parse_errors,
        metadata=branch.metadata,
    )


class Tracker:
    """What the journal holds of one rollout's trajectory: :meth:`delta` gives what changed, :meth:`commit` takes it."""

    def __init__(self) -> None:
        self._held: dict[int, _Held] = {}
        self._shape: tuple[int, tuple[int, ...]] | None = None  # (current, others) as held
        self._pictures: set[str] = set()

    def delta(self, traj: Trajectory) -> tuple[Delta, Pending] | None:
        """What changed in ``traj`` since the last commit (all of it the first time), and the state to commit.

        :meth:`commit` the state once the delta's line is written. None for a trajectory this format does not hold
        (a branch holding branches, two branches with one number): journal the whole record then, and :meth:`reset`.
        """
        others = traj.branches
        numbers = tuple(b.branch for b in others)
        if len({*numbers, traj.branch}) != len(numbers) + 1 or any(b.branches for b in others):
            return None
        held = dict(self._held)
        pictures: dict[str, bytes] = {}
        changed = []
        for branch in sorted(traj.all_branches, key=lambda b: b.branch):
            found = self._branch(branch, held, pictures)
            if found is not None:
                changed.append(found)
        shape = (traj.branch, numbers)
        delta = Delta(
            current=traj.branch, others=list(numbers) if shape != self._shape else None, branches=changed,
            pictures=pictures,
        )  # fmt: skip
        return delta, (held, shape, pictures)

    def _branch(self, branch: Trajectory, held: dict[int, _Held], pictures: dict[str, bytes]) -> BranchDelta | None:
        """What changed in ``branch`` (None: nothing); ``held`` takes its new state, ``pictures`` its new pictures."""
        mine = held.get(branch.branch)
        base = None
        ref = mine
        if ref is None:
            parent = branch.parent_branch
            if parent is not None and parent in held:
                base, ref = parent, held[parent]
            else:
                ref = _NOTHING
        segments, turns, media = branch.segments, branch.turns, branch.media
        kept_segments = _same_start(ref.segments, segments)
        kept_turns = _same_start(ref.turns, turns)
        kept_media = _same_start(ref.media, media)
        head = head_of(branch)
        encoded = _HEAD.encode(head)
        images = branch.image_bytes()
        keys = tuple(images)
        pieces_same = (
            kept_segments == len(segments) == len(ref.segments)
            and kept_turns == len(turns) == len(ref.turns)
            and kept_media == len(media) == len(ref.media)
        )
        if mine is not None and pieces_same and encoded == mine.head and keys == mine.pictures:
            return None
        for sha in keys:
            if sha not in self._pictures and sha not in pictures:
                pictures[sha] = images[sha]
        start = segments[kept_segments - 1].end if kept_segments else 0
        held[branch.branch] = _Held(segments, turns, media, encoded, keys)
        return BranchDelta(
            branch=branch.branch,
            base=base,
            segments_kept=kept_segments,
            turns_kept=kept_turns,
            media_kept=kept_media,
            token_ids=branch.ids_array(start).tolist(),
            logprobs=branch.logprobs_from(start),
            segments=list(segments[kept_segments:]),
            turns=list(turns[kept_turns:]),
            media=list(media[kept_media:]),
            head=head if mine is None or encoded != mine.head else None,
            pictures=list(keys) if keys != (mine.pictures if mine is not None else ()) else None,
        )

    def commit(self, state: Pending) -> None:
        """Take the state :meth:`delta` gave with a delta whose line is written."""
        held, shape, pictures = state
        self._held = held
        self._shape = shape
        self._pictures.update(pictures)

    def reset(self) -> None:
        """Forget what the journal holds (a whole record was journaled, or a line failed): the next delta is whole."""
        self._held = {}
        self._shape = None
        self._pictures = set()


class _Branch:
    """A branch as rebuilt: token ids, logprobs (NaN where none), its pieces, head and pictures."""

    __slots__ = ("head", "ids", "lps", "media", "pictures", "segments", "turns")

    def __init__(self, segments: list[Segment], turns: list[Turn], media: list[MediaSpan], head: Head,
                 pictures: list[str]) -> None:  # fmt: skip
        self.ids = array("i")
        self.lps = array("d")
        self.segments = segments
        self.turns = turns
        self.media = media
        self.head = head
        self.pictures = pictures


class Rebuilt:
    """One rollout's trajectory rebuilt from its journal lines.

    :meth:`apply` each delta in order (or :meth:`reset` to a whole record), then :meth:`record`.
    """

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        self._branches: dict[int, _Branch] = {}
        self._current: int | None = None
        self._others: list[int] = []
        self._pictures: dict[str, bytes] = {}
        self._whole: TrajectoryRecord | None = None

    def reset(self, record: TrajectoryRecord) -> None:
        """Start over from a whole record (a line that journaled the whole trajectory)."""
        self._branches, self._current, self._others, self._pictures = {}, None, [], {}
        self._whole = record

    def apply(self, delta: Delta) -> None:
        """Apply one line's delta, whole or not at all.

        Raises:
            DeltaError: It does not apply to what was rebuilt so far (nothing is changed then).
        """
        view = dict(self._branches)
        steps = []
        for change in delta.branches:
            mine = view.get(change.branch)
            if change.base is not None:
                ref = view.get(change.base)
                if ref is None:
                    raise DeltaError(f"branch {change.branch} starts from branch {change.base}, which is not held")
            else:
                ref = mine
            if mine is None and change.head is None:
                raise DeltaError(f"branch {change.branch} is new but its head is missing")
            segments, turns, media = (ref.segments, ref.turns, ref.media) if ref is not None else ([], [], [])
            if not (
                change.segments_kept <= len(segments)
                and change.turns_kept <= len(turns)
                and change.media_kept <= len(media)
            ):
                raise DeltaError(f"branch {change.branch} keeps more pieces than the journal holds")
            start = segments[change.segments_kept - 1].end if change.segments_kept else 0
            new_segments = [*segments[: change.segments_kept], *change.segments]
            end = new_segments[-1].end if new_segments else 0
            if len(change.logprobs) != len(change.token_ids) or end != start + len(change.token_ids):
                raise DeltaError(f"branch {change.branch}: its tokens do not tile its segments")
            head = change.head if change.head is not None else mine.head  # type: ignore[union-attr]
            pictures = change.pictures
            if pictures is None:
                pictures = mine.pictures if mine is not None else []
            branch = _Branch(
                new_segments, [*turns[: change.turns_kept], *change.turns], [*media[: change.media_kept],
                *change.media], head, pictures,
            )  # fmt: skip
            steps.append((branch, ref, start, change))
            view[change.branch] = branch
        others = delta.others if delta.others is not None else self._others
        missing = [n for n in (delta.current, *others) if n not in view]
        if missing or delta.current in others:
            raise DeltaError(f"the branches {missing or [delta.current]} are not held, or twice")
        unknown = [sha for b in view.values() for sha in b.pictures if sha not in self._pictures]
        if any(sha not in delta.pictures for sha in unknown):
            raise DeltaError("a branch holds a picture the journal does not")
        for branch, ref, start, change in steps:  # nothing below raises
            if ref is not None and change.base is None:  # its own tokens: cut back in place, then extended
                branch.ids, branch.lps = ref.ids, ref.lps
                del branch.ids[start:], branch.lps[start:]
            elif ref is not None:  # a new branch: a copy of its parent's first tokens
                branch.ids, branch.lps = ref.ids[:start], ref.lps[:start]
            branch.ids.fromlist(change.token_ids)
            branch.lps.fromlist([math.nan if x is None else x for x in change.logprobs])
        self._branches = view
        self._current, self._others = delta.current, list(others)
        self._pictures.update(delta.pictures)
        self._whole = None

    def record(self) -> TrajectoryRecord | None:
        """The trajectory as the last line left it (None before any)."""
        if self._whole is not None or self._current is None:
            return self._whole
        others = [self._record(n, []) for n in self._others]
        return self._record(self._current, others)

    def _record(self, number: int, branches: list[TrajectoryRecord]) -> TrajectoryRecord:
        b = self._branches[number]
        h = b.head
        return TrajectoryRecord(
            rollout_id=h.rollout_id,
            branch=number,
            token_ids=b.ids.tolist(),
            logprobs=[None if math.isnan(x) else x for x in b.lps],
            segments=list(b.segments),
            turns=list(b.turns),
            status=h.status,
            status_reason=h.status_reason,
            parent_branch=h.parent_branch,
            fork_at=h.fork_at,
            fork_reason=h.fork_reason,
            fork_kind=h.fork_kind,
            label=h.label,
            compacted_from=h.compacted_from,
            tool_parse_errors=dict(h.tool_parse_errors),
            branches=branches,
            metadata=dict(h.metadata),
            media=list(b.media),
            image_data={sha: self._pictures[sha] for sha in b.pictures},
        )

"""The branches of one rollout: their numbers, and the trajectory the rollout hands out.

Every branch a rollout starts goes through :class:`BranchTree`: a branch off an open one that leaves it open (a
history rewritten by one lineage while the old one may go on), a new lineage from nothing (another system prompt
or tool list), or a fork that supersedes its parent and closes it (a retried call, a render that differs from the
tokens). Numbers are unique across the rollout, in the order the branches started. The trajectory handed out
(:attr:`BranchTree.current`) is the branch of the last call, with every other branch in its ``branches`` (by
number): the record format of one trajectory and its branches.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..status import Status
from ..trajectory import Trajectory
from ..trajectory.live import branch_off
from ..trajectory.record import ForkKind

__all__ = ["BranchTree", "close_reason", "left_behind"]


class BranchTree:
    """Every branch of one rollout, numbered in the order they started; the current one holds the others."""

    __slots__ = ("_all", "_current")

    def __init__(self, root: Trajectory) -> None:
        self._all: list[Trajectory] = [root]
        self._current = root

    @property
    def current(self) -> Trajectory:
        """The branch of the last call, with every other branch of the rollout in its ``branches``."""
        return self._current

    @property
    def branches(self) -> tuple[Trajectory, ...]:
        """Every branch, by number."""
        return tuple(self._all)

    def focus(self, branch: Trajectory) -> None:
        """Make ``branch`` (one of this rollout's) the current one."""
        if branch is self._current and len(branch.branches) == len(self._all) - 1:
            return  # already current with every other branch: nothing to rebuild
        self._current = branch
        branch.branches = [b for b in self._all if b is not branch]
        for other in branch.branches:
            other.branches = []

    def branch_off(self, parent: Trajectory, keep: int, reason: str, kind: ForkKind | None) -> Trajectory:
        """A new current branch with ``parent``'s first ``keep`` tokens; ``parent`` stays open."""
        return self._add(branch_off(parent, keep, reason, branch=len(self._all), kind=kind))

    def new_lineage(self, reason: str, like: Trajectory, kind: ForkKind = "new_lineage") -> Trajectory:
        """A new current branch from nothing, with no parent (its metadata copied from ``like``)."""
        branch = Trajectory(like.rollout_id, branch=len(self._all))
        branch.fork_reason, branch.fork_kind = reason, kind
        branch.metadata = dict(like.metadata)
        return self._add(branch)

    def fork(
        self, parent: Trajectory, keep: int, reason: str, status: Status | None = None, kind: ForkKind | None = None
    ) -> Trajectory:
        """A new current branch with ``parent``'s first ``keep`` tokens that supersedes it: ``parent`` is closed."""
        return self._add(parent.fork(keep, reason, status=status, branch=len(self._all), kind=kind))

    def _add(self, branch: Trajectory) -> Trajectory:
        self._all.append(branch)
        self.focus(branch)
        return branch


def left_behind(branch: Trajectory, branches: Sequence[Trajectory]) -> str | None:
    """Why ``branch`` was left behind, when the rollout went on from it (another branch forked off it), else None."""
    went_on = [b.branch for b in branches if b.parent_branch == branch.branch and b is not branch]
    if not went_on:
        return None
    return f"left behind: the rollout went on in branch {', '.join(map(str, went_on))}, forked from it, and ended there"


def close_reason(branch: Trajectory, branches: Sequence[Trajectory]) -> str:
    """Why ``branch``, still ``running`` (its last output called tools), ends with a rollout its client finished.

    A branch the rollout went on from was left behind (:func:`left_behind`); one with no output of its own got no
    recorded call; otherwise its last output's tool calls went unanswered.
    """
    behind = left_behind(branch, branches)
    if behind is not None:
        return behind
    if branch.first_output_from(branch.fork_at) == len(branch):
        return "the rollout ended before a call on this branch was recorded"
    return "the rollout ended with the last output's tool calls unanswered"

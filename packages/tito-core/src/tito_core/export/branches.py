"""A rollout's lineages as training samples, one per leaf of its token tree, each generated token trained once.

A rollout is a tree of branches (docs/rollouts.md, "Lineages"): a parent agent and its sub-agents, a history one
harness rewrote, a retried call. :func:`training_branches` makes one training sample per **leaf** of that tree
(``branch_reward="shared"``, the default), not one per call, or keeps only the final branch (``"last"``); every
exporter takes a trajectory (its tokens from the first prompt on) or one :class:`TrainingBranch`.

A leaf is the end of a branch that no other branch continues whole: a branch another branch forked off at its last
token is not a leaf, and its tokens are that child's. A sample trains only the tokens its chain of branches
generated: its prompt is everything before the first of them, the prefix it shares with its parent included, so
what the parent generated is trained in the parent's sample, and every generated token exactly once. One
exception: a retry's kept attempt trains what its lineage generated before the retried call, and the superseded
attempt only its discarded output, so the lineage's earlier outputs keep the reward a superseded attempt is not
given by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from ..trajectory import Trajectory
from ..trajectory.record import CallRef

__all__ = ["BranchReward", "TrainingBranch", "response", "superseded_branches", "training_branches"]

BranchReward = Literal["shared", "last"]
"""How a rollout with several branches becomes training samples: ``shared`` (every lineage leaf whose branches
generated tokens is a sample, each given the episode's reward unless rewarded on its own) or ``last`` (only the
final branch, trained whole)."""

BRANCH_REWARDS: tuple[BranchReward, ...] = ("shared", "last")


class TrainingBranch(msgspec.Struct, frozen=True, kw_only=True):
    """One branch of a rollout as one training sample.

    Attributes:
        trajectory: The branch (its own tokens: the shared prefix is a copy of its parent's).
        shared_prefix: How many leading tokens it shares with its parent branch (0 for the first branch).
        trained_from: The first token the sample may train: ``shared_prefix`` under ``branch_reward="shared"``
            (the parent trains the rest), 0 for the only sample under ``"last"``.
        final: Whether this is the rollout's last branch (the one the agent finished on), or continues it.
        superseded: Whether the branch is a retried call's abandoned attempt (:func:`superseded_branches`).
        covers: The branches this one continues whole (not leaves: their tokens are this sample's), nearest first.
        compacted_from: The compaction link of the sample's lineage: its branch's own, else the nearest one of a
            branch it continues whole or retries (a compaction continuation later retried keeps its link).
    """

    trajectory: Trajectory
    shared_prefix: int
    trained_from: int
    final: bool
    superseded: bool = False
    covers: tuple[int, ...] = ()
    compacted_from: CallRef | None = None

    @property
    def prompt_length(self) -> int:
        """The sample's prompt: every token before the first one this branch generated (from ``trained_from``)."""
        return self.trajectory.first_output_from(self.trained_from)

    def reward(
        self, rollout: float | None, given: Sequence[float | None] | None, *, superseded: bool = False
    ) -> float | None:
        """The sample's reward (docs/rollouts.md, "Rewards per lineage").

        The one ``given`` (a record's ``branch_rewards``) for its branch or a branch it continues whole, else the
        rollout's, except for a superseded attempt: None, unless ``superseded``.
        """
        for number in (self.trajectory.branch, *self.covers):
            if given is not None and number < len(given) and given[number] is not None:
                return given[number]
        return None if self.superseded and not superseded else rollout

    def lineage(self) -> dict[str, Any]:
        """The sample's lineage as export columns (``rollout_id``, ``branch``, ``parent_branch`` ... ``superseded``).

        ``fork_kind`` is how its branch began (:data:`~tito_core.trajectory.record.ForkKind`; None for a root that
        forked off nothing); ``compacted_from_branch`` and ``compacted_from_turn`` name the call whose output (the
        summary) a compaction continuation's prompt carries, so credit can flow back to it (None otherwise).
        """
        traj = self.trajectory
        source = self.compacted_from or traj.compacted_from
        return {
            "rollout_id": traj.rollout_id,
            "branch": traj.branch,
            "parent_branch": traj.parent_branch,
            "shared_prefix": self.shared_prefix,
            "final": self.final,
            "superseded": self.superseded,
            "fork_kind": traj.fork_kind,
            "compacted_from_branch": None if source is None else source.branch,
            "compacted_from_turn": None if source is None else source.turn,
        }


def training_branches(traj: Trajectory, *, branch_reward: BranchReward = "shared") -> list[TrainingBranch]:
    """The training samples of one rollout (``traj``: its final branch, as ``TitoModel.reset()`` returns it).

    ``shared``: one sample per leaf (see the module doc), oldest branch first, each holding its whole lineage's
    tokens and training the tokens its chain of branches generated; a leaf whose chain generated nothing gives no
    sample unless it holds the final branch. ``last``: the final branch alone, trained from its first token (the
    behaviour of exporting ``traj`` itself). Rewards and advantages are the episode's: give each sample its
    rollout's values (docs/rollouts.md, "Rewards per lineage", for a reward per branch).

    Raises:
        ValueError: An unknown ``branch_reward``.
    """
    if branch_reward not in BRANCH_REWARDS:
        raise ValueError(f"branch_reward must be one of {list(BRANCH_REWARDS)}, not {branch_reward!r}")
    if branch_reward == "last":
        return [TrainingBranch(trajectory=traj, shared_prefix=traj.fork_at, trained_from=0, final=True)]
    branches = sorted(traj.all_branches, key=lambda b: b.branch)
    superseded = superseded_branches(traj)
    continued_by: dict[int, Trajectory] = {}  # a branch forked off at its last token -> the oldest such child
    for branch in branches:
        parent = branch.parent_branch
        if parent is not None and parent not in continued_by and branch.fork_at == _length(branches, parent):
            continued_by[parent] = branch
    trained_from = {b.branch: b.fork_at for b in branches}  # where each branch's chain starts generating
    holds_final = {b.branch: b is traj for b in branches}
    covers: dict[int, tuple[int, ...]] = {b.branch: () for b in branches}
    link = {b.branch: b.compacted_from for b in branches}  # the compaction link each lineage carries on
    for branch in branches:  # parents before children: a child takes over what its covered parent trains
        if branch.fork_kind == "retry" and branch.parent_branch in trained_from:
            # the kept attempt trains what its lineage generated before the retried call (its copy of it), so a
            # superseded attempt, rewarded nothing by default, trains only its discarded output
            attempt = branch.parent_branch
            trained_from[branch.branch], trained_from[attempt] = trained_from[attempt], branch.fork_at
            link[branch.branch] = link[branch.branch] or link[attempt]
        child = continued_by.get(branch.branch)
        if child is not None:
            trained_from[child.branch] = trained_from[branch.branch]
            holds_final[child.branch] = holds_final[child.branch] or holds_final[branch.branch]
            covers[child.branch] = (branch.branch, *covers[branch.branch])
            link[child.branch] = link[child.branch] or link[branch.branch]
    samples = []
    for branch in branches:
        if branch.branch in continued_by:
            continue  # not a leaf: its child's sample holds (and trains) its tokens
        start, final = trained_from[branch.branch], holds_final[branch.branch]
        if final or branch.first_output_from(start) < len(branch):
            samples.append(
                TrainingBranch(
                    trajectory=branch,
                    shared_prefix=branch.fork_at,
                    trained_from=start,
                    final=final,
                    superseded=branch.branch in superseded,
                    covers=covers[branch.branch],
                    compacted_from=link[branch.branch],
                )
            )
    return samples


def superseded_branches(traj: Trajectory) -> set[int]:
    """The numbers of a rollout's branches that a retried call superseded (the abandoned attempts).

    A retry forks a new branch at the attempt's prompt and closes the attempt, its output discarded
    (:mod:`~tito_core.rollout_core.lineages`); the attempt's tokens are still the policy's, so it stays a sample,
    marked ``superseded``: it gets no reward unless one is asked for (docs/rollouts.md, "Rewards per lineage").
    """
    return {b.parent_branch for b in traj.all_branches if b.parent_branch is not None and b.fork_kind == "retry"}


def _length(branches: list[Trajectory], number: int) -> int:
    return next((len(b) for b in branches if b.branch == number), -1)


def response(item: Trajectory | TrainingBranch) -> tuple[Trajectory, int, list[int], list[int], list[float]]:
    """The trajectory, where its response starts, all its ids, and the response's loss mask and logprobs."""
    traj = item.trajectory if isinstance(item, TrainingBranch) else item
    start = item.prompt_length
    ids = traj.token_ids
    mask = traj.loss_mask[start:]
    logprobs = [0.0 if (lp is None or not m) else lp for lp, m in zip(traj.logprobs[start:], mask, strict=True)]
    return traj, start, ids, mask, logprobs

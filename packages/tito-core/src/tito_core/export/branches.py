"""A rollout's branches as training samples, and the rule that trains each generated token once.

A rollout whose history was rewritten (a trimming or summarizing conversation manager, a retried call) has
several branches. :func:`training_branches` makes each branch a training sample (``branch_reward="shared"``,
the default) or keeps only the final one (``"last"``); every exporter takes a trajectory (its tokens from the
first prompt on) or one :class:`TrainingBranch`. A branch's sample trains only the tokens that branch generated:
its prompt is everything before its first own output token, the prefix it shares with its parent included, so
what the parent generated is trained in the parent's sample.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..trajectory import Trajectory

__all__ = ["BranchReward", "TrainingBranch", "response", "training_branches"]

BranchReward = Literal["shared", "last"]
"""How a rollout with several branches becomes training samples: ``shared`` (every branch that generated tokens
is a sample, each given the episode's reward and advantage) or ``last`` (only the final branch, trained whole)."""

BRANCH_REWARDS: tuple[BranchReward, ...] = ("shared", "last")


class TrainingBranch(msgspec.Struct, frozen=True, kw_only=True):
    """One branch of a rollout as one training sample.

    Attributes:
        trajectory: The branch (its own tokens: the shared prefix is a copy of its parent's).
        shared_prefix: How many leading tokens it shares with its parent branch (0 for the first branch).
        trained_from: The first token the sample may train: ``shared_prefix`` under ``branch_reward="shared"``
            (the parent trains the rest), 0 for the only sample under ``"last"``.
        final: Whether this is the rollout's last branch (the one the agent finished on).
    """

    trajectory: Trajectory
    shared_prefix: int
    trained_from: int
    final: bool

    @property
    def prompt_length(self) -> int:
        """The sample's prompt: every token before the first one this branch generated (from ``trained_from``)."""
        return self.trajectory.first_output_from(self.trained_from)

    def lineage(self) -> dict[str, Any]:
        """``rollout_id``, ``branch``, ``parent_branch``, ``shared_prefix`` and ``final``, as export columns."""
        traj = self.trajectory
        return {
            "rollout_id": traj.rollout_id,
            "branch": traj.branch,
            "parent_branch": traj.parent_branch,
            "shared_prefix": self.shared_prefix,
            "final": self.final,
        }


def training_branches(traj: Trajectory, *, branch_reward: BranchReward = "shared") -> list[TrainingBranch]:
    """The training samples of one rollout (``traj``: its final branch, as ``TitoModel.reset()`` returns it).

    ``shared``: one sample per branch that generated at least one token of its own, oldest first, and always
    the final branch. ``last``: the final branch alone, trained from its first token (the behaviour of exporting
    ``traj`` itself). Rewards and advantages are the episode's: give each sample its rollout's values.

    Raises:
        ValueError: An unknown ``branch_reward``.
    """
    if branch_reward not in BRANCH_REWARDS:
        raise ValueError(f"branch_reward must be one of {list(BRANCH_REWARDS)}, not {branch_reward!r}")
    if branch_reward == "last":
        return [TrainingBranch(trajectory=traj, shared_prefix=traj.fork_at, trained_from=0, final=True)]
    samples = []
    for branch in traj.all_branches:
        final = branch is traj
        if final or branch.first_output_from(branch.fork_at) < len(branch):
            samples.append(
                TrainingBranch(
                    trajectory=branch, shared_prefix=branch.fork_at, trained_from=branch.fork_at, final=final
                )
            )
    return samples


def response(item: Trajectory | TrainingBranch) -> tuple[Trajectory, int, list[int], list[int], list[float]]:
    """The trajectory, where its response starts, all its ids, and the response's loss mask and logprobs."""
    traj = item.trajectory if isinstance(item, TrainingBranch) else item
    start = item.prompt_length
    ids = traj.token_ids
    mask = traj.loss_mask[start:]
    logprobs = [0.0 if (lp is None or not m) else lp for lp, m in zip(traj.logprobs[start:], mask, strict=True)]
    return traj, start, ids, mask, logprobs

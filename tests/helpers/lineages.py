"""The five-call example of a rollout with two lineages (issue 48): a parent agent and a sub-agent with another
system prompt taking turns (parent 1, sub 1, parent 2, sub 2, parent 3), and the check of its two branches. The
scenarios themselves are :mod:`tito_testing.rollout_trees`' (the benchmarks use them too)."""

from __future__ import annotations

from tito_core import Trajectory
from tito_testing.rollout_trees import (
    PARENT,
    REPLIES,
    SUB,
    TREE_REPLIES,
    interleave,
    record_group,
    record_sub_agent,
    record_tree,
)

__all__ = [
    "NEW_LINEAGE",
    "PARENT",
    "REPLIES",
    "SUB",
    "TREE_REPLIES",
    "assert_two_lineages",
    "by_number",
    "interleave",
    "record_group",
    "record_sub_agent",
    "record_tree",
]

NEW_LINEAGE = "a new lineage (the system prompt changed)"


def by_number(traj: Trajectory) -> list[Trajectory]:
    """Every branch of the rollout, by number (``all_branches`` ends with the branch of the last call)."""
    branches = sorted(traj.all_branches, key=lambda b: b.branch)
    assert [b.branch for b in branches] == list(range(len(branches)))
    return branches


def assert_two_lineages(traj: Trajectory, reason: str = NEW_LINEAGE) -> None:
    """The five calls made two branches: the parent's (3 turns) and the sub-agent's (2), a root each; the rollout is
    the branch of the last call (the parent's), the other in its ``branches``."""
    branches = by_number(traj)
    assert len(branches) == 2, [(b.branch, b.fork_reason) for b in branches]
    parent, sub = branches
    assert (len(parent.turns), len(sub.turns)) == (3, 2)
    assert (parent.parent_branch, parent.fork_at, parent.fork_reason) == (None, 0, None)
    assert (sub.parent_branch, sub.fork_at, sub.fork_reason) == (None, 0, reason)
    assert traj is parent and traj.branches == [sub]

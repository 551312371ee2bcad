"""``tito inspect --id``'s branch lines: each branch of a rollout, what started it, its lineage label and status."""

from __future__ import annotations

from ..trajectory import TrajectoryRecord

__all__ = ["branch_lines"]


def branch_lines(traj: TrajectoryRecord) -> list[str]:
    """One line per branch of the rollout of record ``traj``, by number, indented under the branch it forked from.

    ``branch 2 <- 1 at token 40 [retry] lineage sub-1: completed, 3 calls: a retry of the call at turn 0 ...``
    """
    branches = sorted([*traj.branches, traj], key=lambda b: b.branch)
    depth: dict[int, int] = {}
    lines = []
    for branch in branches:
        parent = branch.parent_branch
        depth[branch.branch] = depth.get(parent, -1) + 1 if parent is not None else 0
        where = f" <- {parent} at token {branch.fork_at}" if parent is not None else ""
        kind = f" [{branch.fork_kind}]" if branch.fork_kind else ""
        label = f" lineage {branch.label}" if branch.label else ""
        own = sum(1 for turn in branch.turns if turn.output_start >= branch.fork_at)
        line = f"{'  ' * depth[branch.branch]}branch {branch.branch}{where}{kind}{label}: {branch.status}, {own} calls"
        if branch.compacted_from is not None:
            line += f", continues from call {branch.compacted_from.turn} of branch {branch.compacted_from.branch}"
        if branch.fork_reason:
            line += f": {branch.fork_reason}"
        lines.append(line)
    return lines

"""Compaction lineage: a branch that continues from a summary is linked to the call that wrote the summary.

A harness compacts a long history by asking the model for a summary, then going on from a new, shorter prompt that
carries it. That prompt extends no branch: it starts a new lineage or rewrites one. When its new tokens hold the
output ids of an earlier call of the rollout that the conversation does not replay as an assistant message (the
summary, in a user or system message; its end-of-turn token dropped, at least
:data:`MIN_SUMMARY` tokens, or the same without its first and last token when the template's boundary merged with
them), the new branch is a **compaction** continuation: its ``fork_kind`` is ``compaction`` and ``compacted_from``
names that call (the longest such output; ties: the latest branch and turn). A label with ``; compaction``
(:mod:`~tito_core.rollout_core.labels`) makes it explicit; with no output found in the prompt, the link is the
rollout's last recorded call.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Sequence

from ..trajectory import Trajectory
from ..trajectory.record import CallRef

__all__ = ["MIN_SUMMARY", "find_summary", "link_compaction"]

MIN_SUMMARY = 8
"""The fewest output tokens a summary found in a prompt may have (shorter ones match by chance)."""


def _contains(haystack: bytes, needle: bytes) -> bool:
    """Whether int32 ``needle`` occurs in int32 ``haystack`` at a token boundary."""
    at = haystack.find(needle)
    while at != -1:
        if at % 4 == 0:
            return True
        at = haystack.find(needle, at + 1)
    return False


def find_summary(
    branches: Sequence[Trajectory],
    prompt_ids: Sequence[int],
    end_of_turn_ids: Collection[int] = (),
    skip: Collection[CallRef] = (),
) -> CallRef | None:
    """The earlier call whose output ids ``prompt_ids`` carry (the longest; ties: the latest), or None.

    Each call is looked for on the branch that generated it (not in the prefixes other branches copied); the calls
    of ``skip`` are not (their reply is replayed as an assistant message: history, not a summary).
    """
    haystack = array("i", prompt_ids).tobytes()
    best: tuple[int, int, int] | None = None
    for branch in branches:
        ids = branch.ids_array()
        for turn in branch.turns:
            if turn.output_start < branch.fork_at or not turn.output_len or CallRef(branch.branch, turn.index) in skip:
                continue  # copied from the parent (found there), or replayed as an assistant turn
            out = ids[turn.output_start : turn.output_start + turn.output_len]
            while out and out[-1] in end_of_turn_ids:
                out = out[:-1]
            for core in (out, out[1:-1]):
                if len(core) < MIN_SUMMARY:
                    break
                if _contains(haystack, core.tobytes()):
                    found = (len(core), branch.branch, turn.index)
                    best = found if best is None or found > best else best
                    break
    return None if best is None else CallRef(best[1], best[2])


def link_compaction(traj: Trajectory, found: CallRef | None, *, explicit: bool) -> bool:
    """Mark ``traj`` a compaction continuation of call ``found`` (explicit: labelled so); whether it was marked."""
    if found is None and not explicit:
        return False
    traj.fork_kind = "compaction"
    traj.compacted_from = found
    how = "labelled a compaction" if explicit else "its prompt carries that call's output"
    source = f"call {found.turn} of branch {found.branch}" if found is not None else "no recorded call"
    traj.fork_reason = f"a compaction: continues from the summary of {source} ({how})"
    return True

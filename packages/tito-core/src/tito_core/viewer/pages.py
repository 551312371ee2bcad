"""What the viewer's pages show, as plain data: a row per record, and one record token by token.

No HTML here: :mod:`~tito_core.viewer.app` serves these as JSON and the page's script draws them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..records import RolloutRecord
from ..trajectory import Trajectory, TrajectoryRecord
from ..versions import version_key

__all__ = ["TokenTexts", "group_rewards", "model_calls", "record_fields", "record_view", "run_row", "weight_versions"]

KIND_CODES = {"prompt": "p", "output": "o", "boundary": "b"}
"""One letter per token in a branch's ``kinds`` string: what the model saw (p), produced (o: loss mask 1), or the
template wrote between a turn's end and the next prompt (b)."""


class TokenTexts:
    """Each token id's own text, decoded once per id (a viewer sees the same few thousand ids again and again).

    Args:
        tokenizer: A Hugging Face tokenizer, or None: the pages then show ids only.
    """

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str] | None:
        """The text of each of ``ids``; None without a tokenizer."""
        if self.tokenizer is None:
            return None
        cache, decode = self._cache, self.tokenizer.decode
        for token in set(ids).difference(cache):
            cache[token] = decode([token])
        return [cache[token] for token in ids]


def model_calls(traj: TrajectoryRecord) -> int:
    """The model calls of a rollout, over all its branches: a fork's copy of its parent's turns counted once."""
    return sum(
        sum(1 for turn in branch.turns if turn.output_start + turn.output_len > branch.fork_at)
        for branch in (*traj.branches, traj)
    )


def weight_versions(traj: TrajectoryRecord) -> set[str]:
    """The weight versions of a rollout's generated tokens, over all its branches."""
    return {
        span.version
        for branch in (*traj.branches, traj)
        for turn in branch.turns
        for span in turn.weight_versions or ()
    }


def run_row(index: str, record: RolloutRecord) -> dict[str, Any]:
    """The runs table's row of one record: its key (e.g. its place in the file), fields and counts.

    ``turns`` counts the model calls of every branch; ``turn_tokens`` are the final branch's output lengths.
    """
    traj = record.trajectory
    return {
        "index": index,
        **record_fields(record),
        "tokens": record.tokens.total,
        "output_tokens": record.tokens.output,
        "turns": model_calls(traj),
        "tool_calls": record.tokens.tool_calls,
        "branches": 1 + len(traj.branches),
        "images": len(traj.media),
        "turn_tokens": [turn.output_len for turn in traj.turns],
    }


def _version_range(low: str | None, high: str | None) -> str | None:
    if low is None and high is None:
        return None
    return str(low) if low == high else f"{low}..{high}"


def record_fields(record: RolloutRecord) -> dict[str, Any]:
    """The record page's header fields of a written record."""
    return {
        "task_id": record.task_id,
        "sample": record.sample,
        "group": record.group,
        "status": record.status,
        "status_reason": record.status_reason,
        "reward": record.reward,
        "advantage": record.advantage,
        "turn_rewards": record.turn_rewards,
        "server": record.server,
        "weight_versions": _version_range(record.weight_version_min, record.weight_version_max),
    }


def record_view(
    fields: Mapping[str, Any],
    traj: Trajectory,
    texts: TokenTexts,
    *,
    deltas: Mapping[str, Sequence[float | None]] | None = None,
    image_url: Any = None,
    versions: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One rollout for the record page: ``fields`` (its header), and every branch of ``traj`` token by token.

    Args:
        fields: The header (:func:`record_fields` of a record; a live rollout's own).
        traj: The trajectory (a written record's, or a live one: read between two of its calls).
        texts: Decodes token ids (or gives None: ids only).
        deltas: Per branch number (as a string), each token's ``new - old`` logprob from an audit
            (``tito audit --per-token``), None where not scored.
        image_url: ``image_url(sha256) -> str`` for the images of the record.
        versions: Every weight version of the file, in order: each keeps one colour on every page (the record's
            own versions, in order, without it).
    """
    branches = [_branch_view(branch, texts, image_url, (deltas or {}).get(str(branch.branch)))
                for branch in traj.all_branches]  # fmt: skip
    ids = {branch.branch: branch.token_ids for branch in traj.all_branches}
    for view in branches:
        parent = ids.get(view["parent"]) if view["parent"] is not None else None
        view["shared"] = _common_prefix(view["ids"], parent) if parent is not None else 0
    if versions is None:
        own = {v for branch in branches for v in branch["versions"] or () if v is not None}
        versions = sorted(own, key=version_key)
    return {**fields, "decoded": texts.tokenizer is not None, "branches": branches, "version_order": list(versions)}


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _branch_view(branch: Trajectory, texts: TokenTexts, image_url: Any, deltas: Sequence[float | None] | None) -> Any:
    ids = branch.token_ids
    kinds = [""] * len(ids)
    turn_of = [0] * len(ids)
    for segment in branch.segments:
        kinds[segment.start : segment.end] = [KIND_CODES.get(segment.kind, "p")] * segment.length
        turn_of[segment.start : segment.end] = [segment.turn] * segment.length
    return {
        "branch": branch.branch,
        "parent": branch.parent_branch,
        "fork_at": branch.fork_at,
        "fork_reason": branch.fork_reason,
        "fork_kind": branch.fork_kind,
        "label": branch.label,
        "status": branch.status,
        "status_reason": branch.status_reason,
        "ids": ids,
        "texts": texts(ids),
        "kinds": "".join(kinds),
        "turn_of": turn_of,
        "logprobs": branch.logprobs,
        "versions": branch.token_weight_versions(),
        "deltas": list(deltas) if deltas is not None and len(deltas) == len(ids) else None,
        "turns": [_turn_view(turn) for turn in branch.turns],
        "images": [
            {
                "start": span.start,
                "length": span.length,
                "sha256": span.sha256,
                "format": span.format,
                "kind": span.kind,
                "size": list(span.size) if span.size is not None else None,
                "url": image_url(span.pictures[0]) if image_url is not None else None,  # a video: its first frame
            }
            for span in branch.media
        ],
    }


def _turn_view(turn: Any) -> dict[str, Any]:
    return {
        "index": turn.index,
        "prompt_start": turn.prompt_start,
        "output_start": turn.output_start,
        "output_len": turn.output_len,
        "finish_reason": turn.finish_reason,
        "stop_reason": turn.stop_reason,
        "tool_calls": turn.tool_calls,
        "tool_parse_errors": turn.tool_parse_errors,
        "constrained": turn.constrained,
        "versions": [[s.start, s.end, s.version] for s in turn.weight_versions or ()],
    }


def group_rewards(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per group (task), its rewards: the runs page's reward spread chart."""
    groups: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        if row["reward"] is not None:
            groups.setdefault((row["group"], row["task_id"]), []).append(row["reward"])
    return [{"group": g, "task_id": t, "rewards": r} for (g, t), r in sorted(groups.items())]

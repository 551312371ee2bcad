"""The train demo's off-policy token count, on hand-made records (no model, no torch)."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from tito_core import Trajectory
from tito_core.records import RolloutRecord, Timings, TokenCounts
from tito_core.trajectory import Turn, Usage
from tito_core.versions import VersionSpan

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_reinforce as demo


def record(*turns: tuple[int, tuple[VersionSpan, ...] | None]) -> RolloutRecord:
    """A record whose trajectory has one model call per ``(output length, version spans)``."""
    traj = Trajectory("t:0")
    for index, (n, spans) in enumerate(turns):
        start = len(traj.token_ids)
        traj.append("prompt", [1, 2], turn=index)
        traj.append("output", list(range(10, 10 + n)), [-0.5] * n, turn=index)
        traj.add_turn(
            Turn(
                index=index, rid="x", prompt_start=start, prompt_len=2, output_len=n, finish_reason="stop",
                stop_reason="end_turn", usage=Usage(prompt_tokens=start + 2, completion_tokens=n),
                weight_versions=spans,
            )
        )  # fmt: skip
    traj.set_status("completed")
    return RolloutRecord(
        task_id="t",
        sample=0,
        group=0,
        status="completed",
        status_reason=None,
        reward=1.0,
        trajectory=traj.to_record(),
        timings=Timings(started=0.0, wall_s=0.0, agent_s=0.0),
        tokens=TokenCounts(total=len(traj.token_ids), output=0, prompt=0, model_calls=len(turns), tool_calls=0),
    )


def span(version: str, start: int, end: int) -> VersionSpan:
    return VersionSpan(version=version, start=start, end=end)


def test_tokens_older_than_the_trained_weights_are_off_policy() -> None:
    records = [
        record((4, (span("2", 0, 4),)), (6, (span("2", 0, 2), span("3", 2, 6)))),  # a call across an update
        record((3, (span("1", 0, 3),)), (5, None)),  # a backend that reported nothing
        record((2, (span("default", 0, 2),))),  # not a round: not counted either way
    ]
    counts = demo.off_policy_tokens(records, trained_version=3)
    assert counts == demo.OffPolicy(tokens=13, off_policy=4 + 2 + 3, unknown=5 + 2)
    assert counts.share == 9 / 13
    assert demo.off_policy_tokens(records, trained_version=1).off_policy == 0  # nothing older than 1
    assert demo.off_policy_tokens([], trained_version=0).share is None
    assert msgspec.json.decode(msgspec.json.encode(records[0]), type=RolloutRecord) == records[0]

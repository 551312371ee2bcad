"""What a rollout file holds: the record structs, their JSON codecs, and their Parquet row form and Arrow schema.

The writers (:mod:`~tito_core.records.jsonl`, :mod:`~tito_core.records.parquet`) and
:func:`~tito_core.records.read_records` share these; the file layout is described in
:mod:`tito_core.records`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..status import GroupFailed, status_of
from ..trajectory import TrajectoryRecord

__all__ = [
    "ADVANTAGES_DECODER",
    "ENCODER",
    "KEY_DECODER",
    "RECORD_DECODER",
    "FinalStatus",
    "GroupAdvantages",
    "Key",
    "Outcome",
    "RolloutRecord",
    "Timings",
    "TokenCounts",
    "arrow_schema",
    "record_from_row",
    "record_to_row",
    "with_advantage",
]

FinalStatus = Literal["completed", "truncated", "aborted", "failed"]
Key = tuple[str, int]


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """When a rollout ran and where its time went (seconds; ``started`` is Unix time)."""

    started: float
    wall_s: float
    agent_s: float
    reward_s: float = 0.0


class TokenCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Token and call counts of a rollout's final branch."""

    total: int
    output: int
    prompt: int
    model_calls: int
    tool_calls: int


class RolloutRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One finished rollout, as written to the output file.

    Attributes:
        task_id: The task's id.
        sample: Index of the rollout within its group (0 to ``group_size - 1``).
        group: The group id: the task's position in the dataset.
        status: ``completed``, ``truncated`` (token or loop limit), ``aborted`` (timeout, cancelled) or
            ``failed`` (an error in the rollout or in its reward function).
        status_reason: Why, when not ``completed``.
        reward: The reward function's value; None without one, or when it raised.
        advantage: The group reward function's value for this rollout (e.g. a group-normalised advantage).
        server: The inference server the rollout ran on (its base URL), when known.
        trajectory: The token-level record (ids, logprobs, segments, turns, branches).
        timings: Wall-clock times.
        tokens: Token and call counts.
        weight_version_min: The oldest weight version of the rollout's generated tokens, every branch included
            (order: :func:`tito_core.versions.version_key`); None when the backend reported no versions.
        weight_version_max: The newest one; None likewise.
        staleness: Versions between ``rollout.current_version`` and ``weight_version_min`` when the record was
            written (:func:`tito_core.runner.staleness.staleness`); None without a current version, or when the
            versions are not integers.
        stale: True when ``staleness`` exceeded ``rollout.max_staleness`` and ``rollout.stale = "mark"`` kept the
            record: a trainer filters these out (with ``"drop"``, stale records are not written at all).
        turn_rewards: One reward per model call of the latest branch, by turn index (None for a call without
            one), when the reward came per turn (:mod:`tito_core.turn_rewards`); ``reward`` is then their total.
        branch_rewards: One reward per branch of the rollout, by branch number (None for a branch without one), when
            rewards were given per branch (docs/rollouts.md, "Rewards per lineage"); a training row of a branch
            without one gets the rollout's ``reward`` (none for a superseded attempt).
    """

    task_id: str
    sample: int
    group: int
    status: FinalStatus
    status_reason: str | None
    reward: float | None
    trajectory: TrajectoryRecord
    timings: Timings
    tokens: TokenCounts
    advantage: float | None = None
    server: str | None = None
    weight_version_min: str | None = None
    weight_version_max: str | None = None
    staleness: int | None = None
    stale: bool = False
    turn_rewards: list[float | None] | None = None
    branch_rewards: list[float | None] | None = None

    @property
    def key(self) -> Key:
        """``(task_id, sample)``: what makes a rollout unique in a file."""
        return (self.task_id, self.sample)


class GroupAdvantages(msgspec.Struct, frozen=True, kw_only=True, tag="advantages", tag_field="kind"):
    """The group reward function's values for one group, written once the group's records are all written.

    The last entry of a task wins: a rerun that adds samples to a group writes a new entry for all of them.

    Attributes:
        task_id: The group's task.
        samples: The samples the values belong to, in order.
        values: The advantage of each sample (None where the function gave none).
        error: Why the group reward function failed; its records then read back as ``failed``.
    """

    task_id: str
    samples: list[int]
    values: list[float | None]
    error: str | None = None

    def apply(self, record: RolloutRecord) -> RolloutRecord:
        """``record`` with this entry's advantage (or, for a failed entry, status ``failed`` and the reason)."""
        if self.error is not None:
            status, reason = status_of(GroupFailed(self.error))
            trajectory = msgspec.structs.replace(record.trajectory, status=status, status_reason=reason)
            return msgspec.structs.replace(
                record, status=status, status_reason=reason, advantage=None, trajectory=trajectory
            )
        try:
            value = self.values[self.samples.index(record.sample)]
        except ValueError:
            return record  # a sample written after this entry: the group's next entry covers it
        return msgspec.structs.replace(record, advantage=value)


class _KeyView(msgspec.Struct):
    """What resuming reads of a line: a record's key, status and reward, or that it is an advantages entry."""

    task_id: str
    sample: int = -1
    status: str = ""
    reward: float | None = None
    kind: str | None = None


Outcome = tuple[str, float | None]
"""``(status, reward)`` of a record already in an output file."""

ENCODER = msgspec.json.Encoder()
RECORD_DECODER = msgspec.json.Decoder(RolloutRecord)
KEY_DECODER = msgspec.json.Decoder(_KeyView)
"""Reads only a line's key, status, reward and kind (what resuming needs)."""
ADVANTAGES_DECODER = msgspec.json.Decoder(GroupAdvantages)


def with_advantage(record: RolloutRecord, entries: dict[str, GroupAdvantages]) -> RolloutRecord:
    """``record`` with the advantage of its task's entry in ``entries``, if it has one."""
    entry = entries.get(record.task_id)
    return record if entry is None else entry.apply(record)


def record_to_row(record: RolloutRecord) -> dict[str, Any]:
    """A record as one row of the Parquet file (and of a Ray Data batch): ``trajectory`` as its JSON text."""
    row: dict[str, Any] = msgspec.to_builtins(record)
    row["trajectory"] = ENCODER.encode(record.trajectory).decode()
    return row


def record_from_row(row: dict[str, Any]) -> RolloutRecord:
    """The record of a row written by :func:`record_to_row` (a Parquet or Ray Data row)."""
    fields = dict(row)
    fields["trajectory"] = msgspec.json.decode(fields["trajectory"], type=TrajectoryRecord)
    if fields.get("stale") is None:  # a part written before the column existed
        fields["stale"] = False
    return msgspec.convert(fields, RolloutRecord)


def arrow_schema(pa: Any) -> Any:
    """The Arrow schema of the Parquet file's rows (``pa`` is the ``pyarrow`` module)."""
    timings = pa.struct([(name, pa.float64()) for name in Timings.__struct_fields__])
    tokens = pa.struct([(name, pa.int64()) for name in TokenCounts.__struct_fields__])
    return pa.schema(
        [
            ("task_id", pa.string()),
            ("sample", pa.int64()),
            ("group", pa.int64()),
            ("status", pa.string()),
            ("status_reason", pa.string()),
            ("reward", pa.float64()),
            ("trajectory", pa.string()),
            ("timings", timings),
            ("tokens", tokens),
            ("advantage", pa.float64()),
            ("server", pa.string()),
            ("weight_version_min", pa.string()),
            ("weight_version_max", pa.string()),
            ("staleness", pa.int64()),
            ("stale", pa.bool_()),
            ("turn_rewards", pa.list_(pa.float64())),
            ("branch_rewards", pa.list_(pa.float64())),
        ]
    )

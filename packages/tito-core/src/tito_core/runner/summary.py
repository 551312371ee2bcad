"""Run statistics: live counters while rollouts finish, and the frozen summary of a run."""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import msgspec

from ..records import Key, Outcome, RolloutRecord
from ..trajectory import TrajectoryRecord
from ..versions import version_range

__all__ = ["GroupStats", "RunStats", "RunSummary"]


class GroupStats(msgspec.Struct, frozen=True, kw_only=True):
    """Rewards of one group (the rollouts of one task written by this run)."""

    task_id: str
    rollouts: int
    reward_mean: float | None
    reward_std: float | None


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What one run did.

    Attributes:
        output: The output file.
        planned: Rollouts this run had to do (the dataset times the group size, minus ``skipped``).
        skipped: Rollouts already in the output when the run started.
        written: Records written by this run.
        statuses: Records per status.
        reward_mean: Mean reward over the records that have one.
        reward_std: Their population standard deviation.
        groups: Reward statistics per group.
        total_tokens: Tokens in the written trajectories.
        output_tokens: Generated tokens (loss 1) among them.
        wall_s: Seconds from the first rollout's start to the end.
        rollouts_per_s: ``written / wall_s``.
        output_tokens_per_s: ``output_tokens / wall_s``.
        servers: Records per server.
        interrupted: True when the run stopped before every rollout was done (Ctrl-C, an error).
        file_records: Records in the output file after the run: those it held before (a resumed run) and
            those this run wrote.
        file_statuses: Their statuses.
        file_reward_mean: Their mean reward (over the records that have one).
        file_reward_std: Its population standard deviation.
        weight_version_min: The oldest weight version of the records this run wrote (None: none reported).
        weight_version_max: The newest one.
        current_version: ``rollout.current_version``, as text (None: not set).
        max_staleness: ``rollout.max_staleness`` (None: off).
        stale: Stale records this run wrote, marked ``stale`` (``rollout.stale = "mark"``); counted in ``written``.
        dropped: Stale rollouts this run did not write (``rollout.stale = "drop"``); not in ``written``. A rerun on
            the same output runs them again.
        partial_calls: Model calls of the written records that a weight update in abort mode cut and tito
            continued from their tokens (partial rollouts; ``Turn.continued_rids``), every branch counted.
    """

    output: str
    planned: int
    skipped: int
    written: int
    statuses: dict[str, int]
    reward_mean: float | None
    reward_std: float | None
    groups: list[GroupStats]
    total_tokens: int
    output_tokens: int
    wall_s: float
    rollouts_per_s: float
    output_tokens_per_s: float
    servers: dict[str, int]
    interrupted: bool = False
    file_records: int = 0
    file_statuses: dict[str, int] = msgspec.field(default_factory=dict)
    file_reward_mean: float | None = None
    file_reward_std: float | None = None
    weight_version_min: str | None = None
    weight_version_max: str | None = None
    current_version: str | None = None
    max_staleness: int | None = None
    stale: int = 0
    dropped: int = 0
    partial_calls: int = 0


def _partial_calls(traj: TrajectoryRecord) -> int:
    """Calls continued after an abort-mode weight update, in ``traj`` and every branch it holds."""
    return sum(1 for turn in traj.turns if turn.continued_rids) + sum(_partial_calls(b) for b in traj.branches)


class RunStats:
    """Counters updated as rollouts start and finish (one event loop; no locking)."""

    def __init__(
        self,
        output: str,
        planned: int,
        skipped: int,
        previous: Mapping[Key, Outcome] | None = None,
        *,
        current_version: str | int | None = None,
        max_staleness: int | None = None,
        drop_stale: bool = False,
    ) -> None:
        self.output = output
        self.drop_stale = drop_stale
        self.current_version = None if current_version is None else str(current_version)
        self.max_staleness = max_staleness
        self.stale = 0
        self.dropped = 0
        self.partial_calls = 0
        self.versions: set[str] = set()
        self.previous = dict(previous or {})
        self.planned = planned
        self.skipped = skipped
        self.in_flight = 0
        self.written = 0
        self.statuses: Counter[str] = Counter()
        self.rewards: list[float] = []
        self.groups: dict[str, list[float | None]] = defaultdict(list)
        self.total_tokens = 0
        self.output_tokens = 0
        self.servers: Counter[str] = Counter()
        self.started = time.perf_counter()

    @property
    def failed(self) -> int:
        """Records that did not complete for an error (status ``failed``)."""
        return self.statuses["failed"]

    @property
    def elapsed(self) -> float:
        """Seconds since the run started."""
        return max(time.perf_counter() - self.started, 1e-9)

    def start(self) -> None:
        """A rollout started."""
        self.in_flight += 1

    def add(self, record: RolloutRecord, *, was_in_flight: bool = True) -> None:
        """A record was written."""
        if was_in_flight:
            self.in_flight -= 1
        self.written += 1
        self.statuses[record.status] += 1
        if record.reward is not None:
            self.rewards.append(record.reward)
        self.groups[record.task_id].append(record.reward)
        self.total_tokens += record.tokens.total
        self.output_tokens += record.tokens.output
        if record.server is not None:
            self.servers[record.server] += 1
        self.versions.update(v for v in (record.weight_version_min, record.weight_version_max) if v is not None)
        if record.stale:
            self.stale += 1
        self.partial_calls += _partial_calls(record.trajectory)

    def drop(self, record: RolloutRecord) -> None:
        """A stale rollout finished and was not written (``rollout.stale = "drop"``)."""
        self.dropped += 1

    def was_dropped(self, record: RolloutRecord) -> bool:
        """Whether ``record`` (given to a reporter) was dropped as stale rather than written."""
        return record.stale and self.drop_stale

    @property
    def done(self) -> int:
        """Rollouts of this run that finished: written or dropped."""
        return self.written + self.dropped

    def regrade(self, statuses: Sequence[str], status: str) -> None:
        """Records written with ``statuses`` now read back as ``status`` (their group reward function failed)."""
        for old in statuses:
            self.statuses[old] -= 1
            self.statuses[status] += 1
        self.statuses = +self.statuses  # drop counts that fell to zero

    def mean_reward(self) -> float | None:
        """Mean reward so far."""
        return statistics.fmean(self.rewards) if self.rewards else None

    def summary(self, *, interrupted: bool = False) -> RunSummary:
        """Freeze the counters."""
        wall = self.elapsed
        versions = version_range(self.versions) or (None, None)
        file_statuses = Counter(status for status, _ in self.previous.values()) + self.statuses
        file_rewards = [reward for _, reward in self.previous.values() if reward is not None] + self.rewards
        groups = []
        for task_id, rewards in self.groups.items():
            values = [r for r in rewards if r is not None]
            groups.append(
                GroupStats(
                    task_id=task_id,
                    rollouts=len(rewards),
                    reward_mean=statistics.fmean(values) if values else None,
                    reward_std=statistics.pstdev(values) if values else None,
                )
            )
        return RunSummary(
            output=self.output,
            planned=self.planned,
            skipped=self.skipped,
            written=self.written,
            statuses=dict(sorted(self.statuses.items())),
            reward_mean=self.mean_reward(),
            reward_std=statistics.pstdev(self.rewards) if self.rewards else None,
            groups=groups,
            total_tokens=self.total_tokens,
            output_tokens=self.output_tokens,
            wall_s=wall,
            rollouts_per_s=self.written / wall,
            output_tokens_per_s=self.output_tokens / wall,
            servers=dict(sorted(self.servers.items())),
            interrupted=interrupted,
            file_records=len(self.previous) + self.written,
            file_statuses=dict(sorted(file_statuses.items())),
            file_reward_mean=statistics.fmean(file_rewards) if file_rewards else None,
            file_reward_std=statistics.pstdev(file_rewards) if file_rewards else None,
            weight_version_min=versions[0],
            weight_version_max=versions[1],
            current_version=self.current_version,
            max_staleness=self.max_staleness,
            stale=self.stale,
            dropped=self.dropped,
            partial_calls=self.partial_calls,
        )

"""Rewards per lineage from the runner's reward function (``{"branches": {...}}``), and the advantage baseline of
rows with rewards of their own: over the group's rollouts by default, over its rows when asked."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.helpers.lineages import record_tree
from tito_core.records import RolloutRecord, rollout_record
from tito_core.runner.dataset import Task
from tito_core.runner.finish import Ran, rewarded_record
from tito_core.runner.samples import training_rows
from tito_core.turn_rewards import TurnRewardError, branch_reward_of


def _rewarded(tok: Any, value: Any) -> RolloutRecord:
    traj = record_tree(tok)  # branches 0 (parent), 1 (superseded attempt), 2 (retry), 3 (edited parent)
    ran = Ran(text="", messages=[], server="s", started=time.time(), t0=time.perf_counter(), agent_s=0.0, tool_calls=0)
    return asyncio.run(rewarded_record(Task(id="t", prompt="p"), 0, traj, ran, lambda sample: value))


def test_a_reward_function_rewards_each_branch_and_the_total_defaults_to_the_final_branch_s(qwen25_tokenizer) -> None:
    record = _rewarded(qwen25_tokenizer, {"branches": {"2": 1.0, 0: 0.25, 3: None}})
    final = record.trajectory.branch
    assert record.branch_rewards == [0.25, None, 1.0, None] and record.turn_rewards is None
    assert record.reward == record.branch_rewards[final] and record.status == "completed"
    rows = {r["branch"]: r["reward"] for r in training_rows([record], "verl")}
    assert final == 2 and rows == {0: 0.25, 1: None, 2: 1.0, 3: 1.0}  # 3 has none of its own: the rollout's
    broken = _rewarded(qwen25_tokenizer, {"branches": {7: 1.0}})
    assert broken.status == "failed" and "branch 7 is not one of the rollout's branches (0 to 3)" in (
        broken.status_reason or ""
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"branches": [1.0]}, "a per-branch reward is"),
        ({"branches": {0: 1.0}, "turns": [1.0]}, "a per-branch reward is"),
        ({"branches": {0: float("nan")}}, "the reward of branch 0 must be finite"),
        ({"branches": {0: 1.0}}, "no total and no reward for branch 1"),
    ],
)
def test_bad_branch_rewards_are_refused_by_name(value: Any, message: str) -> None:
    with pytest.raises(TurnRewardError, match=message):
        branch_reward_of(value, branches=2, final=1)


def _record(tok: Any, sample: int, reward: float, branch_rewards: list[float | None] | None) -> RolloutRecord:
    return rollout_record(
        record_tree(tok), task_id="t", sample=sample, group=0, reward=reward, server=None, started=0.0, wall_s=0.0,
        agent_s=0.0, tool_calls=0, branch_rewards=branch_rewards,
    )  # fmt: skip


def test_the_baseline_is_over_the_group_s_rollouts_unless_asked_over_its_rows(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    records = [_record(tok, 0, 1.0, [None, None, 3.0, None]), _record(tok, 1, 0.0, None)]
    plain = list(training_rows(records, "trl"))
    assert all("advantage" not in row for row in plain)  # no group function ran: no advantage of the record's
    rollouts = list(training_rows(records, "trl", baseline="rollouts"))
    mean, std = 0.5, 0.5  # over the two rollouts' rewards
    rewards = [row["reward"] for row in rollouts]
    assert rewards == [1.0, None, 3.0, 1.0, 0.0, None, 0.0, 0.0]
    for row in rollouts:
        if row["reward"] is None:
            assert "advantage" not in row  # a superseded attempt: no reward, no advantage
        else:
            assert row["advantage"] == pytest.approx((row["reward"] - mean) / (std + 1e-6))
    branches = list(training_rows(records, "trl", baseline="branches"))
    values = [r for r in rewards if r is not None]
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    assert [row.get("advantage") for row in branches] == pytest.approx(
        [None if r is None else (r - mean) / (std + 1e-6) for r in rewards]
    )

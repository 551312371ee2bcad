"""A finished rollout's closed trajectory becomes its record: the reward, then the record itself.

Shared by every kind of rollout the worker runs (a Strands agent, an agent of any framework through the
gateway), so their records are built the same way; a rollout that could not run at all gets :func:`failed_record`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import msgspec

from ..harbor.verifier import Verdict
from ..records import FinalStatus, RolloutRecord, Timings, TokenCounts, rollout_record
from ..status import NoVerifierReward, RewardFailed, status_of
from ..trajectory import Trajectory
from ..turn_rewards import branch_reward_of, reward_of
from .dataset import Task
from .rewards import RewardFn, Sample, call_maybe_async

__all__ = ["Ran", "failed_record", "final_status", "rewarded_record"]


class Ran(msgspec.Struct, frozen=True, kw_only=True):
    """What one rollout's agent left: the answer, its history and the clocks, beside the closed trajectory.

    Attributes:
        text: The agent's final answer ("" when it gave none).
        messages: Its conversation as the reward function sees it (:attr:`Sample.messages`).
        server: The name of the server the rollout ran on.
        started: Wall-clock start (``time.time()``).
        t0: ``time.perf_counter()`` at the start.
        agent_s: Seconds the agent ran.
        tool_calls: Tool calls the agent ran.
        lost_engine: A model call lost its connection to the engine (the worker has the server checked).
        verdict: A Harbor task's verifier verdict: the reward (the reward function is not called for it).
    """

    text: str
    messages: Any
    server: str
    started: float
    t0: float
    agent_s: float
    tool_calls: int
    lost_engine: bool = False
    verdict: Verdict | None = None


async def rewarded_record(
    task: Task, sample: int, traj: Trajectory, ran: Ran, reward_fn: RewardFn | None
) -> RolloutRecord:
    """Reward the closed ``traj`` of ``task``'s rollout ``sample`` and build its record.

    The reward function returns a number, per-turn rewards (:func:`~tito_core.turn_rewards.reward_of`) or per-branch
    ones (``{"branches": {...}}``, :func:`~tito_core.turn_rewards.branch_reward_of`). The record
    is :func:`~tito_core.records.rollout_record`'s, which the gateway's records share. A reward
    function that raises leaves the reward empty and the rollout ``failed``, in the trajectory and the record alike.
    """
    reward: float | None = None
    turn_rewards: list[float | None] | None = None
    branch_rewards: list[float | None] | None = None
    t1 = time.perf_counter()
    if ran.verdict is not None:  # a Harbor task: its verifier is the reward; none is never 0
        reward = ran.verdict.reward
        if reward is None and traj.status != "failed":
            traj.amend_status(*status_of(NoVerifierReward(ran.verdict.reason or "the verifier gave none")))
    elif reward_fn is not None:
        view = Sample(task, sample, ran.text, ran.messages, traj, final_status(traj), traj.status_reason)
        try:
            value = await call_maybe_async(reward_fn, view, in_thread=True)
            if isinstance(value, Mapping) and "branches" in value:
                reward, branch_rewards = branch_reward_of(value, len(traj.all_branches), traj.branch)
            else:
                reward, turn_rewards = reward_of(value, len(traj.turns))
        except Exception as exc:
            traj.amend_status(*status_of(RewardFailed(exc)))  # the trajectory and its record say the same
    now = time.perf_counter()
    return rollout_record(
        traj,
        task_id=task.id,
        sample=sample,
        group=task.index,
        reward=reward,
        server=ran.server,
        started=ran.started,
        wall_s=now - ran.t0,
        agent_s=ran.agent_s,
        reward_s=now - t1,
        turn_rewards=turn_rewards,
        branch_rewards=branch_rewards,
        tool_calls=ran.tool_calls,
    )


def failed_record(task: Task, sample: int, server: str, started: float, exc: Exception) -> RolloutRecord:
    """The record of a rollout that could not run at all."""
    status, reason = status_of(exc)
    if status == "running":
        raise AssertionError(f"status_of gave a failed rollout the status running: {exc!r}")
    traj = Trajectory(f"{task.id}:{sample}").close(status, reason)
    return RolloutRecord(
        task_id=task.id,
        sample=sample,
        group=task.index,
        status=status,
        status_reason=reason,
        reward=None,
        server=server,
        trajectory=traj.to_record(),
        timings=Timings(started=started, wall_s=time.time() - started, agent_s=0.0),
        tokens=TokenCounts(total=0, output=0, prompt=0, model_calls=0, tool_calls=0),
    )


def final_status(traj: Trajectory) -> FinalStatus:
    """The status of a closed trajectory (never ``running``)."""
    if traj.status == "running":
        raise RuntimeError("a closed trajectory is still running")
    return traj.status

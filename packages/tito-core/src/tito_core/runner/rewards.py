"""Reward functions: what they receive, how they are called, and a group-normalised advantage.

A reward function takes a :class:`Sample` and returns a number (or awaits one); a sync one runs in a worker
thread (so it must be thread-safe), an async one on the event loop. A group reward function takes the rewards
of one finished group (None where a rollout has none) and returns one value per rollout, written as
``advantage``. Either may be sync or async; an exception marks only the rollout (or group) at hand.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..records import FinalStatus
from ..trajectory import Trajectory
from .dataset import Task

if TYPE_CHECKING:
    from strands.types.content import Messages  # a type only: the agent path runs without Strands

__all__ = ["GroupRewardFn", "RewardFn", "Sample", "call_maybe_async", "group_normalized"]


@dataclass(frozen=True)
class Sample:
    """One finished rollout, as a reward function sees it.

    Attributes:
        task: The task (prompt, reference ``answer``, metadata).
        sample: Index of the rollout in its group.
        text: The agent's final answer text ("" when it produced none).
        messages: The whole Strands conversation (empty for an ``[rollout.agent]`` rollout: the agent keeps its
            own history, and the trajectory has every turn).
        trajectory: The rollout's trajectory (closed).
        status: The rollout's status before the reward.
        status_reason: Why, when not completed.
    """

    task: Task
    sample: int
    text: str
    messages: Messages
    trajectory: Trajectory
    status: FinalStatus
    status_reason: str | None


RewardFn = Callable[[Sample], float | Awaitable[float]]
GroupRewardFn = Callable[[list[float | None]], Sequence[float | None] | Awaitable[Sequence[float | None]]]


async def call_maybe_async(fn: Callable[..., Any], *args: Any, in_thread: bool = False) -> Any:
    """Call ``fn``; await its result when it is awaitable.

    With ``in_thread``, a plain (not ``async def``) function runs in a worker thread, so that a slow one (a
    verifier, a sandbox) does not stall the rollouts in flight on the event loop.
    """
    if in_thread and not inspect.iscoroutinefunction(fn):
        result = await asyncio.to_thread(fn, *args)
    else:
        result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def group_normalized(rewards: list[float | None]) -> list[float | None]:
    """GRPO's advantage: ``(r - mean) / (std + 1e-6)`` over the group's rewards (None stays None)."""
    values = [r for r in rewards if r is not None and math.isfinite(r)]
    if not values:
        return [None] * len(rewards)
    mean = statistics.fmean(values)
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return [None if r is None else (r - mean) / (std + 1e-6) for r in rewards]

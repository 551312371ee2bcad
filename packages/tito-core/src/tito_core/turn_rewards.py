"""Per-turn rewards: the forms a reward may take, their one check, and a per-turn advantage.

A rollout's reward is a number, or one reward per model call (turn) of its latest branch: a reward function may
return a list (``[r0, r1, ...]``) or ``{"turns": [...], "total": x}`` (``total`` defaults to the sum), and the
gateway takes them call by call (``POST /rollouts/<id>/reward``) or at ``finish``. Records carry both:
``reward`` (the total) and ``turn_rewards``.

:func:`turn_advantages` is a per-turn advantage for a group of rollouts that stays unbiased when the policy
decides when to stop: each turn's reward-to-go minus a baseline taken from the *other* rollouts of the group at
the same turn index (leave-one-out), never normalised by the rollout's own length. A baseline that used the
rollout's own number of turns, or its own later rewards, would depend on the actions it is meant to judge
(the concern of verl RFC 7244); one from the other rollouts cannot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TurnRewardError", "branch_reward_of", "finite_number", "reward_of", "turn_advantages"]


class TurnRewardError(ValueError):
    """A reward value tito cannot read: the message names what is wrong."""


def finite_number(value: Any, what: str) -> float:
    """``value`` as a float, or a :class:`TurnRewardError` naming ``what`` when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TurnRewardError(f"{what} must be a number, got {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result):
        raise TurnRewardError(f"{what} must be finite, got {result}")
    return result


def _turns(values: Any, turns: int) -> list[float | None]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TurnRewardError(f"per-turn rewards must be a list, got {type(values).__name__}")
    if len(values) != turns:
        raise TurnRewardError(
            f"{len(values)} per-turn rewards for a rollout of {turns} model calls: give one per call (None for none)"
        )
    return [None if v is None else finite_number(v, f"the reward of turn {i}") for i, v in enumerate(values)]


def reward_of(value: Any, turns: int) -> tuple[float, list[float | None] | None]:
    """``(total, per-turn rewards or None)`` of what a reward function returned for a rollout of ``turns`` calls.

    A number is the total; a list is one reward per turn (total: their sum, None counting 0); a mapping is
    ``{"turns": [...]}`` with an optional ``"total"``.

    Raises:
        TurnRewardError: Not a number, a list or such a mapping; a value that is not a finite number; a list of
            another length than the rollout's model calls; unknown keys.
    """
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"turns", "total"})
        if unknown or "turns" not in value:
            raise TurnRewardError(f'a reward mapping is {{"turns": [...], "total"?: x}}, got keys {sorted(value)}')
        per_turn = _turns(value["turns"], turns)
        total = value.get("total")
        return (sum(r or 0.0 for r in per_turn) if total is None else finite_number(total, "total")), per_turn
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        per_turn = _turns(value, turns)
        return sum(r or 0.0 for r in per_turn), per_turn
    return finite_number(value, "a reward"), None


def branch_reward_of(value: Mapping[str, Any], branches: int, final: int) -> tuple[float, list[float | None]]:
    """``(total, one reward per branch)`` of ``{"branches": {number: reward, ...}, "total"?: x}``.

    A reward per branch of a rollout with ``branches`` branches (keys: branch numbers, as ints or their decimal
    text; a value may be None); ``total`` (the record's ``reward``) defaults to the reward of branch ``final`` (the
    one the rollout finished on).

    Raises:
        TurnRewardError: Unknown keys; a branch the rollout does not have; a value that is not a finite number; no
            ``total`` and no reward for the final branch.
    """
    unknown = sorted(set(value) - {"branches", "total"})
    given = value.get("branches")
    if unknown or not isinstance(given, Mapping):
        raise TurnRewardError(f'a per-branch reward is {{"branches": {{number: x}}, "total"?: x}}, got {dict(value)!r}')
    per_branch: list[float | None] = [None] * branches
    for key, reward in given.items():
        number = int(key) if isinstance(key, str) and key.isdecimal() else key
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < branches:
            raise TurnRewardError(f"branch {key!r} is not one of the rollout's branches (0 to {branches - 1})")
        per_branch[number] = None if reward is None else finite_number(reward, f"the reward of branch {number}")
    total, last = value.get("total"), per_branch[final]
    if total is not None:
        return finite_number(total, "total"), per_branch
    if last is None:
        raise TurnRewardError(f"no total and no reward for branch {final}, the one the rollout finished on")
    return last, per_branch


def turn_advantages(group: Sequence[Sequence[float | None]]) -> list[list[float]]:
    """Per-turn advantages of one group: reward-to-go minus the other rollouts' mean reward-to-go at that turn.

    ``group`` holds each rollout's per-turn rewards (None counts 0). For rollout ``i`` and turn ``t``, the
    reward-to-go is ``G[i][t] = sum(r[i][t:])``; the baseline is the mean of ``G[j][t]`` over the other rollouts
    ``j`` that reached turn ``t`` (0 when none did). The baseline never looks at rollout ``i``, so it does not
    depend on its actions, whatever they decide about stopping: the estimate stays unbiased. No division by a
    rollout's number of turns; scale the result by a constant if you need to.
    """
    returns = []
    for rewards in group:
        to_go, running = [], 0.0
        for r in reversed(rewards):
            running += r or 0.0
            to_go.append(running)
        returns.append(to_go[::-1])
    out = []
    for i, mine in enumerate(returns):
        row = []
        for t, g in enumerate(mine):
            others = [other[t] for j, other in enumerate(returns) if j != i and len(other) > t]
            row.append(g - (sum(others) / len(others) if others else 0.0))
        out.append(row)
    return out

"""A gateway rollout's rewards: per call or per branch as they come (``POST /rollouts/<id>/reward``), and at finish.

The forms and their check are :mod:`tito_core.turn_rewards`'; this keeps what a client gave for one rollout and
turns it into the record's ``reward``, ``turn_rewards`` and ``branch_rewards`` when the rollout ends. A reward per
branch (``{"value", "branch"}``) is the reward of that lineage's training row (docs/rollouts.md, "Rewards per
lineage"); a retried call's superseded attempt gets one only this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..turn_rewards import TurnRewardError, finite_number, reward_of
from .errors import GatewayError, bad_request

if TYPE_CHECKING:
    from ..trajectory import Trajectory

__all__ = ["TurnRewards"]


class TurnRewards:
    """The per-call and per-branch rewards given so far to one rollout, by turn index and by branch number."""

    def __init__(self) -> None:
        self.by_turn: dict[int, float] = {}
        self.by_branch: dict[int, float] = {}

    def give_branch(self, value: Any, branch: Any, branches: int) -> int:
        """Reward branch ``branch`` of a rollout that has ``branches`` branches; returns the branch rewarded.

        Raises:
            GatewayError: 400 for a value that is not a finite number or a branch the rollout does not have, 409 for
                a branch rewarded already.
        """
        try:
            number = finite_number(value, "the reward")
        except TurnRewardError as exc:
            raise bad_request("value", str(exc)) from None
        if isinstance(branch, bool) or not isinstance(branch, int) or not 0 <= branch < branches:
            raise bad_request("branch", f"must be a branch number from 0 to {branches - 1}, got {branch!r}")
        if branch in self.by_branch:
            raise GatewayError(409, f"branch {branch} has a reward already ({self.by_branch[branch]})", param="branch")
        self.by_branch[branch] = number
        return branch

    def branches(self, branches: Sequence[Trajectory]) -> list[float | None] | None:
        """The record's ``branch_rewards``: one per branch by number (None where none), or None when none was given."""
        if not self.by_branch:
            return None
        return [self.by_branch.get(number) for number in range(len(branches))]

    def give(self, value: Any, turn: Any, calls: int) -> int:
        """Reward turn ``turn`` (None: the last call so far) of a rollout that has made ``calls`` model calls.

        Returns the turn rewarded.

        Raises:
            GatewayError: 400 for a value that is not a finite number, a turn the rollout has not made (or none
                yet), 409 for a turn rewarded already.
        """
        try:
            number = finite_number(value, "the reward")
        except TurnRewardError as exc:
            raise bad_request("value", str(exc)) from None
        if calls == 0:
            raise bad_request("turn", "the rollout has made no model call yet: there is no turn to reward")
        if turn is None:
            turn = calls - 1
        if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn < calls:
            raise bad_request("turn", f"must be a turn index from 0 to {calls - 1} (the calls made), got {turn!r}")
        if turn in self.by_turn:
            raise GatewayError(409, f"turn {turn} has a reward already ({self.by_turn[turn]})", param="turn")
        self.by_turn[turn] = number
        return turn

    def final(
        self, reward: float | None, turn_rewards: Sequence[Any] | None, calls: int
    ) -> tuple[float | None, list[float | None] | None]:
        """The record's ``(reward, turn_rewards)``: ``finish``'s and the per-call ones merged.

        ``reward`` given is the total; without it, per-turn rewards sum to it. A turn rewarded both per call and in
        ``turn_rewards`` is a 400.
        """
        given: list[float | None] | None = None
        if turn_rewards is not None:
            try:
                _, given = reward_of(list(turn_rewards), calls)
            except TurnRewardError as exc:
                raise bad_request("turn_rewards", str(exc)) from None
        if not self.by_turn and given is None:
            return reward, None
        merged: list[float | None] = list(given) if given is not None else [None] * calls
        for turn, value in self.by_turn.items():
            if merged[turn] is not None:
                raise bad_request("turn_rewards", f"turn {turn} was rewarded per call already ({value})")
            merged[turn] = value
        total = reward if reward is not None else sum(r or 0.0 for r in merged)
        return total, merged

    def so_far(self, calls: int) -> list[float | None] | None:
        """The per-call rewards given, one per call (None where none), for a rollout that ends without ``finish``."""
        return [self.by_turn.get(turn) for turn in range(calls)] if self.by_turn else None

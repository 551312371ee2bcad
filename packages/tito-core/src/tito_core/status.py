"""How a rollout ends: the one function that decides a trajectory's status and its reason.

Every way out of a model call, a closed trajectory, the runner's own ends (a timeout, a loop limit, an agent
that raised) and a reward function that failed ask :func:`status_of`, so a trajectory and the record written
for it never disagree. A front whose framework has exceptions of its own (Strands' context-window overflow)
tells this module how they end a rollout with :func:`end_with`.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import msgspec

from .errors import ContextLengthError, ContextWindowFullError, GenerationAbortedError, LoopLimitError

__all__ = [
    "CallEnd",
    "Closed",
    "FinalStatus",
    "NoModelCall",
    "RewardFailed",
    "RolloutTimedOut",
    "Status",
    "end_with",
    "status_of",
]

Status = Literal["running", "completed", "truncated", "aborted", "failed"]
FinalStatus = Literal["completed", "truncated", "aborted", "failed"]


class CallEnd(msgspec.Struct, frozen=True, gc=False):
    """A model call that was recorded: how the engine ended it and what the output asked for next."""

    finish_reason: str
    tool_calls: int
    output_len: int


class Closed(msgspec.Struct, frozen=True, gc=False):
    """A trajectory closed while in ``status`` (its agent loop may still have been running)."""

    status: Status
    reason: str | None = None


class NoModelCall(msgspec.Struct, frozen=True, gc=False):
    """A rollout ended without a single model call (an agent that answered without the model): no output."""


class RolloutTimedOut(msgspec.Struct, frozen=True, gc=False):
    """The runner stopped a rollout at its time limit."""

    seconds: float


class RewardFailed(msgspec.Struct, frozen=True, gc=False):
    """The reward function raised ``error`` for a rollout."""

    error: BaseException


Outcome = BaseException | CallEnd | Closed | NoModelCall | RolloutTimedOut | RewardFailed

_TRUNCATING: tuple[type[BaseException], ...] = (ContextWindowFullError, ContextLengthError, LoopLimitError)
_extra: dict[type[BaseException], Status] = {}


def end_with(kind: type[BaseException], status: Status) -> None:
    """Let exceptions of ``kind`` (a front's framework's own) end a rollout with ``status``."""
    _extra[kind] = status


def status_of(outcome: Outcome) -> tuple[Status, str | None]:
    """The status, and the reason for it, that ``outcome`` leaves a trajectory in.

    - a recorded call (:class:`CallEnd`): ``truncated`` at the token limit, ``running`` when its tool calls let
      the loop go on, else ``completed``;
    - an exception out of a call or an agent: ``truncated`` when the context window or a loop limit is reached,
      ``aborted`` when cancelled, interrupted or aborted by the engine, else ``failed``;
    - :class:`Closed`: a still-running trajectory is ``aborted``; any other keeps its status;
    - :class:`RolloutTimedOut`: ``aborted``; :class:`RewardFailed`: ``failed``;
    - :class:`NoModelCall`: ``failed`` (nothing the engine produced: the rollout is no sample to learn from).
    """
    if isinstance(outcome, CallEnd):
        if outcome.finish_reason == "length":
            return "truncated", f"generation hit the token limit after {outcome.output_len} tokens"
        return ("running", None) if outcome.tool_calls else ("completed", None)
    if isinstance(outcome, Closed):
        if outcome.status == "running":
            return "aborted", outcome.reason or "closed while the agent loop was still running"
        return outcome.status, outcome.reason
    if isinstance(outcome, RolloutTimedOut):
        return "aborted", f"timed out after {outcome.seconds:g} s"
    if isinstance(outcome, NoModelCall):
        return "failed", "the rollout ended without any model call: it holds no output"
    if isinstance(outcome, RewardFailed):
        return "failed", f"reward function raised {type(outcome.error).__name__}: {outcome.error}"
    return _exception_status(outcome)


def _exception_status(exc: BaseException) -> tuple[Status, str]:
    if isinstance(exc, _TRUNCATING):
        return "truncated", f"{type(exc).__name__}: {exc}" if not isinstance(exc, LoopLimitError) else str(exc)
    for kind, status in _extra.items():
        if isinstance(exc, kind):
            return status, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, asyncio.CancelledError):
        return "aborted", "the model call was cancelled"
    if isinstance(exc, GenerationAbortedError):
        return "aborted", str(exc)
    if isinstance(exc, Exception):
        return "failed", f"{type(exc).__name__}: {exc}"
    return "aborted", f"the model call was interrupted ({type(exc).__name__})"

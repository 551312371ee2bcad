"""How a rollout ends: the one function that decides a trajectory's status and its reason.

Every way out of a model call, a closed trajectory, the runner's own ends (a timeout, a loop limit, an agent
that raised), a gateway that stops a rollout, a front's call limit, a discarded branch and a reward function
that failed ask :func:`status_of`, so a trajectory and the record written for it never disagree; which of those
ends may replace the status a model call left is :func:`replaces`'s one rule. Nothing else writes a status
(``tests/core/test_status_owner.py`` checks the source). A front whose framework has exceptions of its own
(Strands' context-window overflow) tells this module how they end a rollout with :func:`end_with`.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import msgspec

from .errors import ContextLengthError, ContextWindowFullError, GenerationAbortedError, LoopLimitError

__all__ = [
    "AgentFailed",
    "CallEnd",
    "CallLimit",
    "Closed",
    "Discarded",
    "FinalStatus",
    "GroupFailed",
    "NoModelCall",
    "NoVerifierReward",
    "Outcome",
    "RewardFailed",
    "RolloutTimedOut",
    "Status",
    "Stopped",
    "WorkerLost",
    "end_with",
    "replaces",
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


class NoVerifierReward(msgspec.Struct, frozen=True, gc=False):
    """A Harbor task's verifier gave no reward (it never ran, timed out or wrote none), for ``reason``."""

    reason: str


class WorkerLost(msgspec.Struct, frozen=True, gc=False):
    """The gateway worker holding a rollout was lost, for ``reason``.

    The branch was in ``status`` (for ``status_reason``) then, and was the rollout's current one or not.
    """

    reason: str
    status: Status
    status_reason: str | None = None
    current: bool = True


class AgentFailed(msgspec.Struct, frozen=True, gc=False):
    """The rollout's agent failed (it crashed, or raised), for ``reason``.

    Its runner says so when it finishes the rollout on a gateway in another process (``POST /rollouts/<id>/finish``
    with ``ended.error``).
    """

    reason: str


class GroupFailed(msgspec.Struct, frozen=True, gc=False):
    """The group reward function (advantages) failed for the rollout's group, for ``reason``."""

    reason: str


class Stopped(msgspec.Struct, frozen=True, gc=False):
    """The rollout was stopped from outside before its agent ended it (a server shutting down, an idle timeout)."""

    reason: str


class CallLimit(msgspec.Struct, frozen=True, gc=False):
    """A front stopped the agent after ``calls`` model calls, its own limit (the demo's)."""

    calls: int


class Discarded(msgspec.Struct, frozen=True, gc=False):
    """The client discarded the branch's last output (it retried the call): the branch ends there."""


Outcome = (
    BaseException
    | CallEnd
    | Closed
    | NoModelCall
    | RolloutTimedOut
    | RewardFailed
    | NoVerifierReward
    | WorkerLost
    | AgentFailed
    | GroupFailed
    | Stopped
    | CallLimit
    | Discarded
)

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
    - :class:`RolloutTimedOut`: ``aborted``; :class:`RewardFailed` and :class:`NoVerifierReward`: ``failed``;
    - :class:`NoModelCall`: ``failed`` (nothing the engine produced: the rollout is no sample to learn from);
    - :class:`WorkerLost`: ``failed`` for a branch still open (``running``, or the current branch ``completed``:
      its client might have called again), else its status stands;
    - :class:`AgentFailed` and :class:`GroupFailed`: ``failed``; :class:`Stopped` and :class:`Discarded`: ``aborted``;
      :class:`CallLimit`: ``truncated``.
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
    if isinstance(outcome, WorkerLost):
        if outcome.status == "running" or (outcome.current and outcome.status == "completed"):
            return "failed", outcome.reason
        return outcome.status, outcome.status_reason
    if isinstance(outcome, NoVerifierReward):
        return "failed", f"no verifier reward: {outcome.reason}"
    if isinstance(outcome, (AgentFailed, GroupFailed)):
        return "failed", outcome.reason
    if isinstance(outcome, Stopped):
        return "aborted", outcome.reason
    if isinstance(outcome, CallLimit):
        return "truncated", f"stopped after {outcome.calls} model calls (the front's call limit)"
    if isinstance(outcome, Discarded):
        return "aborted", "the client discarded the last output (it retried the call)"
    return _exception_status(outcome)


def replaces(ended: Outcome, status: Status) -> bool:
    """Whether a rollout that ``ended`` this way takes its status from that end rather than from its last call.

    The one rule for the runner and the gateway, which see a rollout end after its calls did:

    - a time limit replaces ``running``, ``completed`` and ``aborted`` (the agent gave no answer in time: the
      call the limit cancelled says only "cancelled", so say why);
    - a limit on the loop (:class:`~tito_core.errors.LoopLimitError`, :class:`CallLimit`) replaces ``running``
      only: it cuts a loop that was going on, not an answer the model had given;
    - anything else (an agent that raised, a gateway that stops the rollout) replaces ``running`` and
      ``completed`` (the calls went well, the agent around them did not end well).

    A status a model call set (``truncated``, ``failed``, an engine's abort) stands.
    """
    if isinstance(ended, RolloutTimedOut):
        return status in ("running", "completed", "aborted")
    if isinstance(ended, (LoopLimitError, CallLimit)):
        return status == "running"
    return status in ("running", "completed")


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

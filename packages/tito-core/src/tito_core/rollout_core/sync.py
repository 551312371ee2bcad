"""Conversation sync: which messages a rollout's tokens cover, and the one way a rollout forks.

Each call brings the whole conversation (:class:`~tito_core.conversation.Conversation`). :class:`ConversationSync`
matches it with the messages already consumed: the assistant message after the last output must be the one the
rollout gave back (:func:`~tito_core.conversation.reply_message`); anything else (a trimming conversation
manager, a retried call, an edited message, a changed system prompt or tool list) is a rewritten history, and
the rollout forks a new branch that keeps the longest token prefix still consistent with the conversation.
Every fork, here or in the prompt builder, goes through :meth:`ConversationSync.fork`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from ..conversation import ChatMessage, Conversation, canonical
from ..status import Discarded, Status, status_of
from ..trajectory import Trajectory

__all__ = ["ConversationSync", "Plan"]

logger = logging.getLogger("tito")

_Seen = bytes | Mapping[str, Any]
_MarkKind = Literal["prompt", "output"]


class _Mark(msgspec.Struct, frozen=True, gc=False):
    """After ``count`` messages, the trajectory stood at ``offset`` tokens, at the end of a ``kind`` chunk."""

    count: int
    offset: int
    kind: _MarkKind


class Plan(msgspec.Struct, frozen=True):
    """What to render: the whole conversation (``initial``) or only ``chat``, the messages after ``count``."""

    initial: bool
    count: int
    chat: list[ChatMessage]


def _same(message: ChatMessage, seen: _Seen) -> bool:
    if isinstance(seen, bytes):
        return canonical(message) == seen
    return message is seen or message == seen


def _common_prefix(messages: Sequence[ChatMessage], seen: Sequence[_Seen]) -> int:
    """How many leading ``messages`` agree with the consumed ones in what determines their tokens."""
    n = min(len(messages), len(seen))
    for i in range(n):
        if not _same(messages[i], seen[i]):
            return i
    return n


def _has_assistant(messages: Sequence[ChatMessage]) -> bool:
    return any(m.get("role") == "assistant" for m in messages)


class ConversationSync:
    """The live branch of one rollout and the conversation its tokens cover.

    Owns the trajectory branch, the consumed messages (as :func:`~tito_core.conversation.canonical` JSON), the
    token offsets where message chunks end (the fork points), the output waiting to come back as the next
    assistant message, and the system prompt and tools the branch was rendered with.
    """

    def __init__(self, trajectory: Trajectory) -> None:
        self.restart(trajectory)

    @property
    def trajectory(self) -> Trajectory:
        """The live branch."""
        return self._traj

    @property
    def system(self) -> str | None:
        """The system prompt of the live branch."""
        return self._system

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The chat-template tools of the live branch."""
        return self._tools

    def restart(self, trajectory: Trajectory) -> None:
        """Start over on ``trajectory`` (a new rollout), with nothing consumed."""
        self._traj = trajectory
        self._consumed: list[_Seen] = []
        self._marks: list[_Mark] = []
        self._pending: _Seen | None = None
        self._system: str | None = None
        self._tools: list[dict[str, Any]] | None = None

    def last_kind(self) -> str | None:
        """The kind of the live branch's last segment (None when it is empty)."""
        last = self._traj.last_segment
        return last.kind if last is not None else None

    # ------------------------------------------------------------------------------------------ planning
    def plan(self, conversation: Conversation, tools: list[dict[str, Any]] | None) -> Plan:
        """Match ``conversation`` with what the branch holds; fork when its history was rewritten."""
        messages, system = conversation.messages, conversation.system
        if self._traj.last_segment is None:
            self._system, self._tools = system, tools
            return Plan(initial=True, count=0, chat=conversation.chat())
        if system != self._system or tools != self._tools:
            changed = [
                what
                for what, same in (("system prompt", system == self._system), ("tool list", tools == self._tools))
                if not same
            ]
            return self._rewritten(conversation, tools, 0, f"the {' and the '.join(changed)} changed")
        n = len(self._consumed)
        agree = _common_prefix(messages, self._consumed)
        pending = self._pending
        if pending is not None and agree == n and len(messages) == n:
            reason = "the previous output was discarded (model call retried)"
            return self._rewritten(conversation, tools, n, reason, discarded=True)
        output_back = (
            pending is not None
            and agree == n
            and messages[n].get("role") == "assistant"  # len(messages) > n: the retry case returned above
            and _same(messages[n], pending)
        )
        if agree < n or (pending is not None and not output_back):
            reason = f"the conversation history was rewritten at message {agree}"
            return self._rewritten(conversation, tools, agree, reason)
        if pending is not None:  # its output came back as the next message
            self._consumed.append(pending)
            self._marks.append(_Mark(n + 1, len(self._traj), "output"))
            self._pending = None
            n += 1
        new = list(messages[n:])
        if _has_assistant(new):
            return self._rewritten(conversation, tools, n, "assistant messages were inserted into the history")
        if new and self.last_kind() != "output":
            # The trajectory ends with a generation prompt that got no output; messages cannot follow it.
            return self._rewritten(conversation, tools, n, "messages were added after a prompt that got no output")
        return Plan(initial=False, count=n, chat=new)  # no new messages: a retry of a call that failed before output

    def _rewritten(
        self,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
        agree: int,
        reason: str,
        *,
        discarded: bool = False,
    ) -> Plan:
        """Fork at the last mark still consistent with ``conversation`` (from scratch when there is none)."""
        messages, system = conversation.messages, conversation.system
        keep: _Mark | None = None
        if system == self._system and tools == self._tools:
            for mark in reversed(self._marks):
                rest = messages[mark.count :]
                if mark.count > agree or _has_assistant(rest):
                    continue
                if mark.kind == "prompt" and rest:
                    continue  # the prompt chunk already ends with the generation header
                keep = mark
                break
        status = status_of(Discarded())[0] if discarded else None
        if keep is None:
            self.fork(0, reason, messages=0, status=status)
            self._system, self._tools = system, tools
            return Plan(initial=True, count=0, chat=conversation.chat())
        self.fork(keep.offset, reason, messages=keep.count, status=status)
        if keep.kind == "prompt":
            return Plan(initial=False, count=keep.count, chat=[])
        return Plan(initial=False, count=keep.count, chat=list(messages[keep.count :]))

    # ------------------------------------------------------------------------------------------- forking
    def fork(self, at: int, reason: str, *, messages: int | None = None, status: Status | None = None) -> None:
        """Start a new branch keeping the first ``at`` tokens (a segment boundary) and, when given, ``messages``.

        The one fork of a rollout: a rewritten history, a full render that differs from the tokens, a server
        prompt that does not extend them. The old branch is closed (with ``status`` when given) and kept in
        the new one's history; marks past ``at`` and any pending output are dropped.
        """
        old = self._traj
        self._traj = old.fork(at, reason, status=status)
        self._marks = [m for m in self._marks if m.offset <= at]
        if messages is not None:
            del self._consumed[messages:]
        self._pending = None
        logger.info(
            "rollout %s: forked to branch %d keeping %d tokens: %s", old.rollout_id, self._traj.branch, at, reason
        )

    # ------------------------------------------------------------------------------------------ recording
    def consumed(self, plan: Plan, conversation: Conversation, prompt_end: int) -> None:
        """The call planned as ``plan`` was recorded: its messages are consumed up to ``prompt_end`` tokens."""
        messages = conversation.messages
        if plan.initial:
            self._consumed = [canonical(m) for m in messages]
        else:
            self._consumed.extend(canonical(m) for m in messages[plan.count :])
        self._marks.append(_Mark(len(self._consumed), prompt_end, "prompt"))

    def expect(self, reply: ChatMessage) -> None:
        """Until ``reply`` comes back as the next assistant message, the last output is pending.

        A conversation that comes back without it (a retry, a consumer that stopped early, an engine abort)
        forks the rollout.
        """
        self._pending = canonical(reply)

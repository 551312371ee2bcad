"""Conversation sync: which messages one lineage's tokens cover, and how a conversation relates to them.

Each call brings the whole conversation (:class:`~tito_core.conversation.Conversation`). :class:`ConversationSync`
matches it with the messages its branch consumed: the assistant message after the last output must be the one the
rollout gave back (:func:`~tito_core.conversation.reply_message`); anything else (a trimming conversation
manager, a retried call, an edited message, a changed system prompt or tool list) does not extend the branch.
:meth:`ConversationSync.decide` says so without changing anything (:class:`Decision`); the rollout's lineages
(:mod:`~tito_core.rollout_core.lineages`) compare every open branch that way and then :meth:`~ConversationSync.follow`
one, :meth:`~ConversationSync.branch` off one (it stays open) or :meth:`~ConversationSync.supersede` one (a retry:
the attempt is closed). A fork keeps the longest token prefix still consistent with the conversation; every
branch is started by the rollout's :class:`~tito_core.rollout_core.tree.BranchTree`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from ..conversation import ChatMessage, Conversation, canonical
from ..status import Discarded, Status, status_of
from ..trajectory import Trajectory
from ..trajectory.record import ForkKind
from .tree import BranchTree

__all__ = ["ConversationSync", "Decision", "Plan"]

logger = logging.getLogger("tito")

_Seen = bytes | Mapping[str, Any]
_MarkKind = Literal["prompt", "output"]


class _Mark(msgspec.Struct, frozen=True, gc=False):
    """After ``count`` messages, the trajectory stood at ``offset`` tokens, at the end of a ``kind`` chunk."""

    count: int
    offset: int
    kind: _MarkKind


class Decision(msgspec.Struct, frozen=True):
    """How a call's conversation relates to one branch, decided without changing anything.

    Attributes:
        extends: The branch is a prefix of the conversation: the call continues it.
        depth: Tokens of the branch the call keeps: all of them when it extends, else up to the fork point.
        agree: Leading messages that agree with the consumed ones (the last output counted when it came back).
        same_head: The system prompt and the tools are the branch's (else only a new lineage fits).
        retry: The conversation is the one of the call whose output is pending: that output is discarded.
        fresh: No message of the conversation is one of the branch's: a new conversation.
        reason: Why the conversation does not extend the branch (None when it does).
        kind: What a fork from the branch would be (None when the call extends it).
        keep: Where a fork keeps the branch's tokens (None: nothing is consistent); where the branch ends when the
            call extends it (a call from the same point as one in flight there branches off at it).
    """

    extends: bool
    depth: int
    agree: int
    same_head: bool = True
    retry: bool = False
    fresh: bool = False
    reason: str | None = None
    kind: ForkKind | None = None
    keep: _Mark | None = None


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
    """One lineage of a rollout: its branch and the conversation the branch's tokens cover.

    Owns the branch, the consumed messages (as :func:`~tito_core.conversation.canonical` JSON), the token offsets
    where message chunks end (the fork points), the output waiting to come back as the next assistant message,
    and the system prompt and tools the branch was rendered with. ``tree`` starts its branches (a tree of its own
    when None: a rollout of one lineage).
    """

    def __init__(self, trajectory: Trajectory, tree: BranchTree | None = None) -> None:
        self._tree = tree if tree is not None else BranchTree(trajectory)
        self.restart(trajectory)

    @property
    def trajectory(self) -> Trajectory:
        """The lineage's branch."""
        return self._traj

    @property
    def system(self) -> str | None:
        """The system prompt of the branch."""
        return self._system

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The chat-template tools of the branch."""
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
        """The kind of the branch's last segment (None when it is empty)."""
        last = self._traj.last_segment
        return last.kind if last is not None else None

    # ------------------------------------------------------------------------------------------ deciding
    def decide(self, conversation: Conversation, tools: list[dict[str, Any]] | None) -> Decision:
        """How ``conversation`` relates to the branch: it extends it, retries its last call, or forks from it."""
        messages, system = conversation.messages, conversation.system
        if self._traj.last_segment is None:
            return Decision(extends=True, depth=0, agree=0)
        if system != self._system or tools != self._tools:
            changed = [
                what
                for what, same in (("system prompt", system == self._system), ("tool list", tools == self._tools))
                if not same
            ]
            reason = f"the {' and the '.join(changed)} changed"
            return Decision(extends=False, depth=0, agree=0, same_head=False, reason=reason, kind="new_lineage")
        n = len(self._consumed)
        agree = _common_prefix(messages, self._consumed)
        pending = self._pending
        if pending is not None and agree == n and len(messages) == n:
            reason = f"a retry of the call at turn {len(self._traj.turns) - 1} (its output discarded)"
            return self._fork_at(messages, n, reason, kind="retry")
        output_back = (
            pending is not None
            and agree == n
            and messages[n].get("role") == "assistant"  # len(messages) > n: the retry case returned above
            and _same(messages[n], pending)
        )
        if agree < n or (pending is not None and not output_back):
            if agree == 0 and messages and self._shares_none(messages):
                return Decision(
                    extends=False, depth=0, agree=0, fresh=True, reason="a new conversation", kind="new_lineage"
                )
            return self._fork_at(messages, agree, f"the conversation history was rewritten at message {agree}")
        if output_back:  # its output came back as the next message
            n += 1
        new = messages[n:]
        if _has_assistant(new):
            return self._fork_at(messages, n, "assistant messages were inserted into the history", output_back)
        if new and self.last_kind() != "output":
            # The branch ends with a generation prompt that got no output; messages cannot follow it.
            reason = "messages were added after a prompt that got no output"
            return self._fork_at(messages, n, reason, output_back)
        end = self._fork_at(messages, n, "", output_back).keep  # where a call from the same point would branch off
        return Decision(extends=True, depth=len(self._traj), agree=n, keep=end)  # no new messages: before any output

    def _shares_none(self, messages: Sequence[ChatMessage]) -> bool:
        """No message of ``messages`` is one the branch consumed (or its pending output): a new conversation."""
        seen = self._consumed_with(True)
        known = {s for s in seen if isinstance(s, bytes)}
        others = [s for s in seen if not isinstance(s, bytes)]
        for message in messages:
            mine = canonical(message)
            if (mine in known) if isinstance(mine, bytes) else any(_same(message, s) for s in others):
                return False
        return True

    def _fork_at(
        self,
        messages: Sequence[ChatMessage],
        agree: int,
        reason: str,
        output_back: bool = False,
        *,
        kind: ForkKind = "rewrite",
    ) -> Decision:
        """Fork at the last mark still consistent with ``messages`` (the output that came back counts)."""
        marks = self._marks_with(output_back)
        keep: _Mark | None = None
        for mark in reversed(marks):
            rest = messages[mark.count :]
            if mark.count > agree or _has_assistant(rest):
                continue
            if mark.kind == "prompt" and rest:
                continue  # the prompt chunk already ends with the generation header
            keep = mark
            break
        depth = keep.offset if keep is not None else 0
        retry = kind == "retry"
        return Decision(extends=False, depth=depth, agree=agree, retry=retry, reason=reason, kind=kind, keep=keep)

    def _marks_with(self, output_back: bool) -> list[_Mark]:
        if not output_back:
            return self._marks
        return [*self._marks, _Mark(len(self._consumed) + 1, len(self._traj), "output")]

    def _consumed_with(self, output_back: bool) -> list[_Seen]:
        if not output_back or self._pending is None:
            return self._consumed
        return [*self._consumed, self._pending]

    # ------------------------------------------------------------------------------------------ planning
    def plan(self, conversation: Conversation, tools: list[dict[str, Any]] | None) -> Plan:
        """Match ``conversation`` with the branch: continue it, or fork a new branch that supersedes it."""
        decision = self.decide(conversation, tools)
        if decision.extends:
            return self.follow(conversation, tools)
        return self.supersede(conversation, tools, decision)

    def follow(self, conversation: Conversation, tools: list[dict[str, Any]] | None) -> Plan:
        """Continue the branch with ``conversation``, which :meth:`decide` found extends it (its output came back)."""
        messages = conversation.messages
        if self._traj.last_segment is None:
            self._system, self._tools = conversation.system, tools
            return Plan(initial=True, count=0, chat=conversation.chat())
        if self._pending is not None:  # its output came back as the next message
            self._take_back()
        n = len(self._consumed)
        return Plan(initial=False, count=n, chat=list(messages[n:]))

    def _take_back(self) -> None:
        """The pending output came back: it is consumed, and its end is a fork point."""
        if self._pending is not None:
            self._consumed.append(self._pending)
            self._marks.append(_Mark(len(self._consumed), len(self._traj), "output"))
            self._pending = None

    def supersede(self, conversation: Conversation, tools: list[dict[str, Any]] | None, decision: Decision) -> Plan:
        """Fork a new branch for ``conversation`` that replaces this one, which is closed (a retry: discarded)."""
        keep = decision.keep
        reason = decision.reason or "the conversation does not extend the branch"
        status = status_of(Discarded())[0] if decision.retry else None
        if keep is None:
            self.fork(0, reason, messages=0, status=status, kind=decision.kind)
            self._system, self._tools = conversation.system, tools
            return Plan(initial=True, count=0, chat=conversation.chat())
        if keep.count > len(self._consumed):
            self._take_back()
        self.fork(keep.offset, reason, messages=keep.count, status=status, kind=decision.kind)
        return _kept_plan(conversation, keep)

    def branch(
        self, conversation: Conversation, tools: list[dict[str, Any]] | None, decision: Decision
    ) -> tuple[ConversationSync, Plan]:
        """A new lineage for ``conversation``, branched off this one where ``decision`` forks; this one stays open."""
        keep = decision.keep
        reason = decision.reason or "the conversation does not extend the branch"
        at = keep.offset if keep is not None else 0
        child = ConversationSync(self._tree.branch_off(self._traj, at, reason, decision.kind), self._tree)
        if keep is None:
            child._system, child._tools = conversation.system, tools
            return child, Plan(initial=True, count=0, chat=conversation.chat())
        back = keep.count > len(self._consumed)
        child._consumed = self._consumed_with(back)[: keep.count]
        child._marks = [m for m in self._marks_with(back) if m.offset <= keep.offset]
        child._system, child._tools = self._system, self._tools
        return child, _kept_plan(conversation, keep)

    def new_lineage(self, reason: str, kind: ForkKind = "new_lineage") -> ConversationSync:
        """A new lineage from nothing, on an empty branch (another system prompt or tool list); this one stays open."""
        return ConversationSync(self._tree.new_lineage(reason, self._traj, kind), self._tree)

    # ------------------------------------------------------------------------------------------- forking
    def fork(
        self,
        at: int,
        reason: str,
        *,
        messages: int | None = None,
        status: Status | None = None,
        kind: ForkKind | None = "render",
    ) -> None:
        """Start a new branch keeping the first ``at`` tokens (a segment boundary) and, when given, ``messages``.

        The fork that supersedes the branch (``kind``): a retried call, a full render that differs from the tokens, a
        server prompt that does not extend them. The old branch is closed (with ``status`` when given) and kept in
        the new one's history; marks past ``at`` and any pending output are dropped.
        """
        old = self._traj
        self._traj = self._tree.fork(old, at, reason, status, kind)
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
        does not extend the branch.
        """
        self._pending = canonical(reply)


def _kept_plan(conversation: Conversation, keep: _Mark) -> Plan:
    """What to render on a branch that kept the tokens up to ``keep``."""
    if keep.kind == "prompt":
        return Plan(initial=False, count=keep.count, chat=[])
    return Plan(initial=False, count=keep.count, chat=list(conversation.messages[keep.count :]))

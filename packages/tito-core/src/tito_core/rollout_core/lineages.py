"""The open lineages of one rollout, and which one each call goes on.

A rollout may hold several lineages at once: a parent agent and its sub-agents (another system prompt, or the same
one with a new conversation), taking turns or running at once; a history one harness rewrote while the old one may
still go on. Each open lineage is one branch with its conversation
(:class:`~tito_core.rollout_core.sync.ConversationSync`) and its backend sequence
(:class:`~tito_core.rollout_core.sequence.SequenceTracker`). :meth:`Lineages.choose` asks every open lineage how
the call's conversation relates to it (:meth:`~ConversationSync.decide`, which changes nothing) and then:

1. the call **extends** the deepest branch that is a prefix of its conversation (ties: the most recently used);
2. else, a **retry** (the conversation of a call whose output is still pending) supersedes that attempt: a new
   branch keeps its prompt and the attempt is closed, its output discarded;
3. else, it **forks** where the longest common prefix ends, branching off the lineage that holds it, which stays
   open (a lineage that may go on later);
4. else (no lineage has its system prompt and tools, or its conversation shares no message with any) it starts a
   **new lineage** from nothing.

An empty branch (nothing recorded yet) extends any conversation; it is taken only where nothing deeper fits.

**Calls in flight.** A call holds its lineage from :meth:`Lineages.choose` to :meth:`Lineages.release`. Calls on
different lineages run at once. A call that would extend (or retry) a lineage whose call is still in flight
branches off it where it stands instead (fork kind ``parallel``): the record stays exact, each branch holding the
tokens its own request was sent, whichever call ends first; a lineage in flight is never superseded, and keeps its
backend sequence.

**Labels.** A call labelled ``L`` (:mod:`~tito_core.rollout_core.labels`) goes on no branch labelled otherwise: it
branches off it (a ``new_lineage``); the branch it goes on takes its label.

Each open lineage keeps its backend sequence (an SGLang session, an adapter's ids JSON) so that its next call
sends only its new ids, but only the ``live_sequences`` most recently used lineages do (:data:`LIVE_SEQUENCES`): a
rollout whose history a sliding window rewrites on every call would otherwise hold one per rewrite. A lineage
whose sequence was ended stays open; its next call starts a new sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..backend import Backend
from ..conversation import ChatMessage, Conversation, canonical
from ..status import Closed, status_of
from ..trajectory import Trajectory
from ..trajectory.record import CallRef
from .sequence import SequenceTracker
from .sync import ConversationSync, Decision, Plan
from .tree import BranchTree, left_behind

__all__ = ["LIVE_SEQUENCES", "Lineage", "Lineages"]

LIVE_SEQUENCES = 4
"""How many lineages of one rollout keep their backend sequence (a parent, its sub-agents, a retry or two)."""


class Lineage:
    """One open lineage: its conversation sync (which holds its branch), its backend sequence, its calls in flight."""

    __slots__ = ("first", "running", "sequence", "sync", "used")

    def __init__(self, sync: ConversationSync, backend: Backend) -> None:
        self.sync = sync
        self.sequence = SequenceTracker(backend)
        self.used = 0
        self.running = 0
        self.first: bytes | Any = None  # the first message of the call in flight on the empty branch

    @property
    def trajectory(self) -> Trajectory:
        """The lineage's branch."""
        return self.sync.trajectory


class Lineages:
    """The open lineages of one rollout; each call goes on the one :meth:`choose` picks until :meth:`release`."""

    def __init__(
        self, backend: Backend, rollout_id: str | None = None, *, live_sequences: int = LIVE_SEQUENCES
    ) -> None:
        self._backend = backend
        self._live_sequences = max(1, live_sequences)
        self.restart(rollout_id)

    def restart(self, rollout_id: str | None = None) -> None:
        """Start a new rollout: one empty lineage on branch 0."""
        root = Trajectory(rollout_id)
        self._tree = BranchTree(root)
        first = Lineage(ConversationSync(root, self._tree), self._backend)
        self._open = [first]
        self._last = first
        self._clock = 0
        self.recorded: CallRef | None = None  # the last call recorded (a compaction's summary, by default)
        self._replies: dict[bytes, CallRef] = {}  # each recorded call's reply, as canonical JSON

    def replied(self, call: CallRef, reply: ChatMessage) -> None:
        """Call ``call`` was recorded and answered ``reply``."""
        self.recorded = call
        seen = canonical(reply)
        if isinstance(seen, bytes):
            self._replies[seen] = call

    def replayed(self, messages: Sequence[ChatMessage]) -> set[CallRef]:
        """The recorded calls whose reply ``messages`` replay as an assistant message (not a summary of them)."""
        found = (canonical(m) for m in messages if m.get("role") == "assistant")
        return {self._replies[seen] for seen in found if isinstance(seen, bytes) and seen in self._replies}

    @property
    def trajectory(self) -> Trajectory:
        """The branch of the last call, with every other branch of the rollout in its ``branches``."""
        return self._tree.current

    @property
    def branches(self) -> tuple[Trajectory, ...]:
        """Every branch of the rollout, by number."""
        return self._tree.branches

    @property
    def last(self) -> Lineage:
        """The lineage of the last call (the first one before any)."""
        return self._last

    def choose(
        self, conversation: Conversation, tools: list[dict[str, Any]] | None, label: str | None = None
    ) -> tuple[Lineage, Plan]:
        """The lineage the call of ``conversation`` goes on, and what to render there (it may be a new one).

        The call holds the lineage until :meth:`release`: a lineage with a call in flight is never extended,
        superseded or told to end its sequence; a call that would go on it branches off it where it stands (a
        ``parallel`` fork). A call labelled ``label`` goes on no branch labelled otherwise: it branches off it (a
        ``new_lineage``). The chosen branch takes ``label`` (it had none, or the same; a new one may have copied its
        parent's).
        """
        decided = [(lineage, self._decide(lineage, conversation, tools, label)) for lineage in self._open]
        extend = max(((lin, d) for lin, d in decided if d.extends), key=lambda c: (c[1].depth, c[0].used), default=None)
        fork = max(
            ((lin, d) for lin, d in decided if d.same_head and not d.extends and not d.fresh),
            key=lambda c: (c[1].depth, c[1].retry, c[1].agree, c[0].used),
            default=None,
        )
        if extend is not None and (extend[1].depth > 0 or fork is None or fork[1].depth == 0):
            lineage = extend[0]  # an empty branch is taken only where no fork keeps any token
            plan = lineage.sync.follow(conversation, tools)
        elif fork is not None and (fork[1].depth > 0 or fork[1].kind in ("rewrite", "retry")):
            lineage, decision = fork
            if decision.retry:
                plan = lineage.sync.supersede(conversation, tools, decision)  # the attempt is closed
            else:
                sync, plan = lineage.sync.branch(conversation, tools, decision)
                lineage = self._add(sync)
        else:  # nothing to keep: a new lineage from nothing
            lineage = self._add(self._new_lineage(decided, fork[1] if fork is not None else None))
            plan = lineage.sync.follow(conversation, tools)
        traj = lineage.trajectory
        if label is not None:  # a branch labelled otherwise is never chosen; a new one may copy its parent's label
            traj.label = label
        self._use(lineage)
        lineage.running += 1
        if traj.last_segment is None and conversation.messages:
            lineage.first = canonical(conversation.messages[0])
        return lineage, plan

    def _decide(
        self, lineage: Lineage, conversation: Conversation, tools: list[dict[str, Any]] | None, label: str | None
    ) -> Decision:
        """How the call relates to ``lineage``: a call in flight there, or another label, makes any fit a fork."""
        decision = lineage.sync.decide(conversation, tools)
        theirs = lineage.trajectory.label
        other_label = label is not None and theirs is not None and theirs != label
        if not (lineage.running or other_label) or not decision.same_head or decision.fresh:
            return decision
        if not decision.extends and not decision.retry and not other_label:
            return decision  # a rewrite of its history branches off it, as from any open lineage
        keep = decision.keep
        number = lineage.trajectory.branch
        first = conversation.messages[0] if conversation.messages else None
        if decision.extends and not decision.depth and first is not None and canonical(first) != lineage.first:
            why = "a new conversation"  # not the one of the first call in flight on the empty branch
            return Decision(extends=False, depth=0, agree=0, fresh=True, reason=why, kind="new_lineage")
        if other_label:
            reason, kind = f"a new lineage (labelled {label!r}, the branch {theirs!r})", "new_lineage"
        else:
            reason, kind = f"a call from the same point as the call in flight on branch {number}", "parallel"
        depth = keep.offset if keep is not None else 0
        return msgspec.structs.replace(decision, extends=False, retry=False, depth=depth, reason=reason, kind=kind)

    def _new_lineage(self, decided: list[tuple[Lineage, Decision]], fork: Decision | None) -> ConversationSync:
        """An empty lineage, its reason taken from how the conversation differs from the open ones.

        ``fork`` is a fork that keeps nothing (a call in flight at the start of its branch, another label).
        """
        if fork is not None and fork.kind is not None:
            return self._last.sync.new_lineage(fork.reason or "a new lineage", fork.kind)
        if any(d.fresh for _, d in decided):
            why = "a new conversation"
        else:
            last = next((d for lin, d in decided if lin is self._last), None)
            why = last.reason if last is not None and last.reason else "a new conversation"
        return self._last.sync.new_lineage(f"a new lineage ({why})")

    def release(self, lineage: Lineage) -> None:
        """The call on ``lineage`` ended (recorded or not)."""
        lineage.running = max(0, lineage.running - 1)

    def _add(self, sync: ConversationSync) -> Lineage:
        lineage = Lineage(sync, self._backend)
        self._open.append(lineage)
        return lineage

    def _use(self, lineage: Lineage) -> None:
        self._clock += 1
        lineage.used = self._clock
        self._last = lineage
        self._tree.focus(lineage.trajectory)
        holding = sorted(
            (o for o in self._open if o is not lineage and o.sequence.live and not o.running), key=lambda o: -o.used
        )
        for other in holding[self._live_sequences - 1 :]:
            other.sequence.end()

    def close(self) -> Trajectory:
        """Close every open branch, end their sequences; return the rollout's view.

        A branch still ``running`` ends ``aborted``: "left behind" when the rollout went on from it
        (:func:`~tito_core.rollout_core.tree.left_behind`), else closed while its agent loop was running.
        """
        branches = self._tree.branches
        for lineage in self._open:
            lineage.sequence.end()
            traj = lineage.trajectory
            behind = left_behind(traj, branches) if not traj.closed and traj.status == "running" else None
            if behind is not None:
                traj.close(*status_of(Closed("running", behind)))
            traj.close()
        return self._tree.current

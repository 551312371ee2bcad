"""The open lineages of one rollout, and which one each call goes on.

A rollout may hold several lineages at once: a parent agent and its sub-agent (another system prompt), taking
turns; a history one harness rewrote while the old one may still go on. Each open lineage is one branch with its
conversation (:class:`~tito_core.rollout_core.sync.ConversationSync`) and its backend sequence
(:class:`~tito_core.rollout_core.sequence.SequenceTracker`). :meth:`Lineages.choose` asks every open lineage how
the call's conversation relates to it (:meth:`~ConversationSync.decide`, which changes nothing) and then:

1. the call **extends** the deepest branch that is a prefix of its conversation (ties: the most recently used);
2. else, a **retry** (the conversation of a call whose output is still pending) supersedes that attempt: a new
   branch keeps its prompt and the attempt is closed, its output discarded;
3. else, it **forks** where the longest common prefix ends, branching off the lineage that holds it, which stays
   open (a lineage that may go on later);
4. else (no lineage has its system prompt and tools) it starts a **new lineage** from nothing.

An empty branch (nothing recorded yet) extends any conversation; it is taken only where nothing deeper fits.

Each open lineage keeps its backend sequence (an SGLang session, an adapter's ids JSON) so that its next call
sends only its new ids, but only the ``live_sequences`` most recently used lineages do (:data:`LIVE_SEQUENCES`): a
rollout whose history a sliding window rewrites on every call would otherwise hold one per rewrite. A lineage
whose sequence was ended stays open; its next call starts a new sequence.
"""

from __future__ import annotations

from typing import Any

from ..backend import Backend
from ..conversation import Conversation
from ..trajectory import Trajectory
from .sequence import SequenceTracker
from .sync import ConversationSync, Decision, Plan
from .tree import BranchTree

__all__ = ["LIVE_SEQUENCES", "Lineage", "Lineages"]

LIVE_SEQUENCES = 4
"""How many lineages of one rollout keep their backend sequence (a parent, its sub-agents, a retry or two)."""


class Lineage:
    """One open lineage: its conversation sync (which holds its branch) and its backend sequence."""

    __slots__ = ("sequence", "sync", "used")

    def __init__(self, sync: ConversationSync, backend: Backend) -> None:
        self.sync = sync
        self.sequence = SequenceTracker(backend)
        self.used = 0

    @property
    def trajectory(self) -> Trajectory:
        """The lineage's branch."""
        return self.sync.trajectory


class Lineages:
    """The open lineages of one rollout; each call goes on the one :meth:`choose` picks."""

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

    @property
    def trajectory(self) -> Trajectory:
        """The branch of the last call, with every other branch of the rollout in its ``branches``."""
        return self._tree.current

    @property
    def last(self) -> Lineage:
        """The lineage of the last call (the first one before any)."""
        return self._last

    def choose(self, conversation: Conversation, tools: list[dict[str, Any]] | None) -> tuple[Lineage, Plan]:
        """The lineage the call of ``conversation`` goes on, and what to render there (it may be a new one)."""
        decided = [(lineage, lineage.sync.decide(conversation, tools)) for lineage in self._open]
        extend = max(((lin, d) for lin, d in decided if d.extends), key=lambda c: (c[1].depth, c[0].used), default=None)
        fork = max(
            ((lin, d) for lin, d in decided if d.same_head and not d.extends),
            key=lambda c: (c[1].depth, c[1].retry, c[1].agree, c[0].used),
            default=None,
        )
        if extend is not None and (extend[1].depth > 0 or fork is None or fork[1].depth == 0):
            lineage = extend[0]  # an empty branch is taken only where no fork keeps any token
            plan = lineage.sync.follow(conversation, tools)
        elif fork is not None:
            lineage, decision = fork
            if decision.retry:
                plan = lineage.sync.supersede(conversation, tools, decision)  # the attempt is closed
            else:
                sync, plan = lineage.sync.branch(conversation, tools, decision)
                lineage = self._add(sync)
        else:
            lineage = self._add(self._new_lineage(decided))
            plan = lineage.sync.follow(conversation, tools)
        self._use(lineage)
        return lineage, plan

    def _new_lineage(self, decided: list[tuple[Lineage, Decision]]) -> ConversationSync:
        """An empty lineage, its reason taken from how the conversation differs from the last call's."""
        last = next((d for lin, d in decided if lin is self._last), None)
        why = last.reason if last is not None and last.reason else "a new conversation"
        return self._last.sync.new_lineage(f"a new lineage ({why})")

    def _add(self, sync: ConversationSync) -> Lineage:
        lineage = Lineage(sync, self._backend)
        self._open.append(lineage)
        return lineage

    def _use(self, lineage: Lineage) -> None:
        self._clock += 1
        lineage.used = self._clock
        self._last = lineage
        self._tree.focus(lineage.trajectory)
        holding = sorted((o for o in self._open if o is not lineage and o.sequence.live), key=lambda o: -o.used)
        for other in holding[self._live_sequences - 1 :]:
            other.sequence.end()

    def close(self) -> Trajectory:
        """Close every open branch (a running one is ``aborted``), end their sequences; return the rollout's view."""
        for lineage in self._open:
            lineage.sequence.end()
            lineage.trajectory.close()
        return self._tree.current

"""Rollouts whose token tree has several lineages, recorded by the rollout core on the scripted backend.

A parent agent and its sub-agent taking turns, a retried call, an edited history, a GRPO group on one prompt, a
compaction (the parent going on from a summary an earlier call wrote).

Shared by the tests of issue 48 (``tests/helpers/lineages.py``) and ``benchmarks/tree.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tito_core import Trajectory
from tito_core.conversation import Conversation
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout

from .scripted import ScriptedBackend

__all__ = [
    "COMPACTION_REPLIES",
    "PARENT",
    "REPLIES",
    "SUB",
    "SUMMARIZER",
    "SUMMARY",
    "TREE_REPLIES",
    "interleave",
    "record_compaction",
    "record_group",
    "record_sub_agent",
    "record_tree",
]

PARENT, SUB = "You are the parent agent.", "You are a sub-agent."
REPLIES = ["p1", "s1", "p2", "s2", "p3"]


async def interleave(user: Callable[[str], Any], ask: Callable[[str, list[Any]], Awaitable[Any]]) -> list[Any]:
    """Parent 1, sub 1, parent 2, sub 2, parent 3; returns what each ``ask`` returned.

    ``ask(system, history)`` makes one call on ``history`` and appends the reply as the client replays it;
    ``user(text)`` is a user message in the front's form. Each agent replays its own history, never the other's.
    """
    parent, sub = [user("plan the work")], [user("do part one")]
    results = [await ask(PARENT, parent), await ask(SUB, sub)]
    parent.append(user("part one is done"))
    results.append(await ask(PARENT, parent))
    sub.append(user("now part two"))
    results.append(await ask(SUB, sub))
    parent.append(user("part two is done"))
    results.append(await ask(PARENT, parent))
    return results


TREE_REPLIES = ["p1", "s1", "s1 again", "p2", "p2 after the edit", "s2"]


def record_tree(tokenizer: Any) -> Trajectory:
    """A closed rollout of four leaves from six calls.

    The parent (branch 0: p1, p2), the sub-agent's first attempt (branch 1, superseded by a retry of the same call),
    the retry (branch 2: "s1 again", s2) and the parent's history edited after p1 (branch 3, forked off branch 0).
    """
    rollout = _rollout(tokenizer, TREE_REPLIES)

    async def ask(system: str, history: list[Any], *, keep: bool = True) -> None:
        result = await rollout.call(Conversation(messages=list(history), system=system), CallOptions())
        if keep:
            history.append(result.reply())

    async def run() -> None:
        parent, sub = [_user("plan the work")], [_user("do part one")]
        await ask(PARENT, parent)
        await ask(SUB, sub, keep=False)  # its reply is dropped: the client retries the call
        await ask(SUB, sub)
        await ask(PARENT, [*parent, _user("part one is done")])
        await ask(PARENT, [*parent, _user("part one went wrong")])  # the history after p1, edited
        sub.append(_user("now part two"))
        await ask(SUB, sub)

    asyncio.run(run())
    return rollout.reset()


SUMMARIZER = "You summarize the work so far."
SUMMARY = "The user asked for a plan; the parent agent wrote three steps and finished the first two of them."
COMPACTION_REPLIES = ["p1", "p2", "a summary cut short", SUMMARY, "p3", "p4"]


def record_compaction(tokenizer: Any) -> Trajectory:
    """A closed rollout of a compaction after a retried summary call: four branches from six calls.

    The parent (branch 0: p1, p2), the summarizer's first attempt (branch 1, a new lineage, superseded by a retry
    of the same call), the retry (branch 2, which writes :data:`SUMMARY`) and the parent going on from a new prompt
    that carries the summary (branch 3: p3, p4), which the rollout core links to the call that wrote it from the
    tokens alone: its ``fork_kind`` is ``compaction`` and ``compacted_from`` is call 0 of branch 2.
    """
    rollout = _rollout(tokenizer, COMPACTION_REPLIES)

    async def ask(system: str, history: list[Any], *, keep: bool = True) -> None:
        result = await rollout.call(Conversation(messages=list(history), system=system), CallOptions())
        if keep:
            history.append(result.reply())

    async def run() -> None:
        parent = [_user("plan the work")]
        await ask(PARENT, parent)
        parent.append(_user("part one is done"))
        await ask(PARENT, parent)
        summarize = [_user("summarize: a plan of three steps, two of them done")]
        await ask(SUMMARIZER, summarize, keep=False)  # its reply is dropped: the client retries the call
        await ask(SUMMARIZER, summarize)
        compacted = [_user(f"Summary of the work so far:\n{SUMMARY}"), _user("go on")]
        await ask(PARENT, compacted)
        compacted.append(_user("part three is done"))
        await ask(PARENT, compacted)

    asyncio.run(run())
    return rollout.reset()


def record_sub_agent(tokenizer: Any) -> Trajectory:
    """The five-call example (:func:`interleave`) as one closed rollout: the parent's and the sub-agent's lineages."""
    rollout = _rollout(tokenizer, REPLIES)

    async def ask(system: str, history: list[Any]) -> None:
        result = await rollout.call(Conversation(messages=list(history), system=system), CallOptions())
        history.append(result.reply())

    asyncio.run(interleave(_user, ask))
    return rollout.reset()


def record_group(
    tokenizer: Any, size: int, *, prompt: str = "solve the task", reply_words: int = 0
) -> list[Trajectory]:
    """A GRPO group: ``size`` closed one-call rollouts of one prompt, each its own reply (``reply_words`` longer)."""
    rollouts = []
    for k in range(size):
        rollout = _rollout(tokenizer, [f"answer {k}: " + "step " * (k + reply_words)], rollout_id=f"group-{k}")
        conversation = Conversation(messages=[_user(prompt)], system=PARENT)
        asyncio.run(rollout.call(conversation, CallOptions()))
        rollouts.append(rollout.reset())
    return rollouts


def _rollout(tokenizer: Any, replies: list[str], rollout_id: str | None = None) -> Rollout:
    backend = ScriptedBackend(tokenizer, replies)
    return Rollout(backend, ChatRenderer(tokenizer), get_tool_parser("hermes"), rollout_id=rollout_id)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}

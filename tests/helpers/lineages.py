"""The five-call example of a rollout with two lineages (issue 48): a parent agent and a sub-agent with another
system prompt taking turns (parent 1, sub 1, parent 2, sub 2, parent 3), and the check of its two branches."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tito_core import Trajectory

__all__ = [
    "NEW_LINEAGE",
    "PARENT",
    "REPLIES",
    "SUB",
    "TREE_REPLIES",
    "assert_two_lineages",
    "by_number",
    "interleave",
    "record_group",
    "record_tree",
]

PARENT, SUB = "You are the parent agent.", "You are a sub-agent."
NEW_LINEAGE = "a new lineage (the system prompt changed)"
REPLIES = ["p1", "s1", "p2", "s2", "p3"]


async def interleave(user: Callable[[str], Any], ask: Callable[[str, list[Any]], Awaitable[Any]]) -> list[Any]:
    """Parent 1, sub 1, parent 2, sub 2, parent 3: ``ask(system, history)`` makes one call on ``history`` and appends
    the reply as the client replays it; ``user(text)`` is a user message in the front's form. Each agent replays
    its own history, never the other's. Returns what each ``ask`` returned."""
    parent, sub = [user("plan the work")], [user("do part one")]
    results = [await ask(PARENT, parent), await ask(SUB, sub)]
    parent.append(user("part one is done"))
    results.append(await ask(PARENT, parent))
    sub.append(user("now part two"))
    results.append(await ask(SUB, sub))
    parent.append(user("part two is done"))
    results.append(await ask(PARENT, parent))
    return results


def by_number(traj: Trajectory) -> list[Trajectory]:
    """Every branch of the rollout, by number (``all_branches`` ends with the branch of the last call)."""
    branches = sorted(traj.all_branches, key=lambda b: b.branch)
    assert [b.branch for b in branches] == list(range(len(branches)))
    return branches


def assert_two_lineages(traj: Trajectory, reason: str = NEW_LINEAGE) -> None:
    """The five calls made two branches: the parent's (3 turns) and the sub-agent's (2), a root each; the rollout is
    the branch of the last call (the parent's), the other in its ``branches``."""
    branches = by_number(traj)
    assert len(branches) == 2, [(b.branch, b.fork_reason) for b in branches]
    parent, sub = branches
    assert (len(parent.turns), len(sub.turns)) == (3, 2)
    assert (parent.parent_branch, parent.fork_at, parent.fork_reason) == (None, 0, None)
    assert (sub.parent_branch, sub.fork_at, sub.fork_reason) == (None, 0, reason)
    assert traj is parent and traj.branches == [sub]


TREE_REPLIES = ["p1", "s1", "s1 again", "p2", "p2 after the edit", "s2"]


def record_tree(tokenizer: Any) -> Trajectory:
    """A closed rollout of four leaves from six calls, recorded by the rollout core on the scripted backend: the
    parent (branch 0: p1, p2), the sub-agent's first attempt (branch 1, superseded by a retry of the same call), the
    retry (branch 2: "s1 again", s2) and the parent's history edited after p1 (branch 3, forked off branch 0)."""
    import asyncio

    from tito_core.conversation import Conversation
    from tito_core.plugins import get_tool_parser
    from tito_core.render.renderer import ChatRenderer
    from tito_core.rollout_core import CallOptions, Rollout
    from tito_testing.scripted import ScriptedBackend

    rollout = Rollout(ScriptedBackend(tokenizer, TREE_REPLIES), ChatRenderer(tokenizer), get_tool_parser("hermes"))

    def user(text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    async def ask(system: str, history: list[Any], *, keep: bool = True) -> None:
        result = await rollout.call(Conversation(messages=list(history), system=system), CallOptions())
        if keep:
            history.append(result.reply())

    async def run() -> None:
        parent, sub = [user("plan the work")], [user("do part one")]
        await ask(PARENT, parent)
        await ask(SUB, sub, keep=False)  # its reply is dropped: the client retries the call
        await ask(SUB, sub)
        await ask(PARENT, [*parent, user("part one is done")])
        await ask(PARENT, [*parent, user("part one went wrong")])  # the history after p1, edited
        sub.append(user("now part two"))
        await ask(SUB, sub)

    asyncio.run(run())
    return rollout.reset()


def record_group(tokenizer: Any, size: int, *, prompt: str = "solve the task") -> list[Trajectory]:
    """A GRPO group: ``size`` closed one-call rollouts of one prompt, each with its own reply."""
    import asyncio

    from tito_core.conversation import Conversation
    from tito_core.plugins import get_tool_parser
    from tito_core.render.renderer import ChatRenderer
    from tito_core.rollout_core import CallOptions, Rollout
    from tito_testing.scripted import ScriptedBackend

    rollouts = []
    for k in range(size):
        backend = ScriptedBackend(tokenizer, [f"answer {k}: " + "step " * k])
        rollout = Rollout(backend, ChatRenderer(tokenizer), get_tool_parser("hermes"), rollout_id=f"group-{k}")
        conversation = Conversation(messages=[{"role": "user", "content": prompt}], system=PARENT)
        asyncio.run(rollout.call(conversation, CallOptions()))
        rollouts.append(rollout.reset())
    return rollouts

"""Calls in flight together on one rollout, through the real gateway over local sockets (openai SDK, scripted backend):
each lineage holds its own calls, a call from the same point as one in flight branches off it (``parallel``), and
every branch holds exactly the tokens its own request was sent, whichever call ends first. Tests wait on gates."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.gateway.test_chat_surface import client
from tests.helpers.lineages import PARENT, SUB, by_number
from tito_core import Trajectory
from tito_core.backend import GenerateRequest
from tito_core.gateway import Gateway
from tito_core.gateway.errors import GatewayError


class Gates:
    """Holds each generation until the test opens its gate, and answers it, both chosen by the prompt's last user
    message (each key must be one): ``entered[key]`` is set once that call reached the engine."""

    def __init__(self, backend: Any, tokenizer: Any, answers: dict[str, str], held: set[str]) -> None:
        self.answers = answers
        self.entered = {key: asyncio.Event() for key in answers}
        self.gates = {key: asyncio.Event() for key in answers}
        for key in answers:
            if key not in held:
                self.gates[key].set()
        self.tokenizer = tokenizer
        original = backend.generate

        async def generate(request: GenerateRequest) -> Any:
            key = self.key(request)
            self.entered[key].set()
            await self.gates[key].wait()
            return await original(request)

        backend.generate = generate
        backend.add(*([lambda request: self.answers[self.key(request)]] * len(answers)))

    def key(self, request: GenerateRequest) -> str:
        text = self.tokenizer.decode(list(request.input_ids))
        return max(self.answers, key=lambda key: text.rfind(f"{key}<|im_end|>"))


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def ask(sdk: Any, system: str, history: list[Any]) -> str:
    """One call on ``history`` (the system prompt first); its reply is appended as the client replays it."""
    answer = await sdk.chat.completions.create(model="m", messages=[{"role": "system", "content": system}, *history])
    content = answer.choices[0].message.content or ""
    history.append({"role": "assistant", "content": content})
    return content


def sent_exactly(traj: Trajectory, backend: Any) -> None:
    """Every request the engine got is the prefix of one branch up to that call's output, sent on its sequence."""
    branches = by_number(traj)
    for request in backend.requests:
        owner = next(
            b for b in branches for t in b.turns if t.rid == request.rid and t.output_start >= b.fork_at
        )  # the branch that generated it
        turn = next(t for t in owner.turns if t.rid == request.rid)
        assert list(request.input_ids) == owner.token_ids[: turn.output_start]
        assert request.sequence.split("/")[1] == str(owner.branch)


async def test_parallel_sub_agents_run_at_once_and_finish_out_of_order(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    """Two sub-agents with one system prompt, each with its own task, run at once while the parent waits."""
    answers = {"plan": "p1", "task A": "a1", "task B": "b1", "more A": "a2", "more B": "b2", "merge": "p2"}
    gates = Gates(backend, qwen3_tokenizer, answers, held={"task A", "more B"})
    rollout = gateway.open()
    sdk = client(rollout)
    parent, sub_a, sub_b = [user("plan")], [user("task A")], [user("task B")]
    await ask(sdk, PARENT, parent)
    first_a = asyncio.create_task(ask(sdk, SUB, sub_a))
    await gates.entered["task A"].wait()
    assert await ask(sdk, SUB, sub_b) == "b1"  # while A's first call is in flight
    assert not first_a.done()
    gates.gates["task A"].set()
    assert await first_a == "a1"
    sub_a.append(user("more A"))
    sub_b.append(user("more B"))
    second_b = asyncio.create_task(ask(sdk, SUB, sub_b))
    await gates.entered["more B"].wait()
    assert await ask(sdk, SUB, sub_a) == "a2"
    gates.gates["more B"].set()
    assert await second_b == "b2"
    parent.append(user("merge"))
    await ask(sdk, PARENT, parent)
    record = await gateway.finish(rollout.id)
    traj = Trajectory.from_record(record.trajectory)
    main, a, b = by_number(traj)
    assert [len(x.turns) for x in (main, a, b)] == [2, 2, 2]
    assert (a.parent_branch, a.fork_kind, a.fork_reason) == (
        None,
        "new_lineage",
        "a new lineage (the system prompt changed)",
    )
    assert (b.parent_branch, b.fork_kind, b.fork_reason) == (None, "new_lineage", "a new lineage (a new conversation)")
    assert [x.status for x in (main, a, b)] == ["completed"] * 3
    sent_exactly(traj, backend)


async def test_two_calls_from_one_point_branch_off_as_siblings(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    """Two continuations of one branch in flight together: the second branches off where the branch stands."""
    answers = {"start": "s1", "left": "l1", "right": "r1", "right again": "r2"}
    gates = Gates(backend, qwen3_tokenizer, answers, held={"left"})
    rollout = gateway.open()
    sdk = client(rollout)
    history = [user("start")]
    await ask(sdk, PARENT, history)
    left, right = [*history, user("left")], [*history, user("right")]
    held = asyncio.create_task(ask(sdk, PARENT, left))
    await gates.entered["left"].wait()
    assert await ask(sdk, PARENT, right) == "r1"
    right.append(user("right again"))
    assert await ask(sdk, PARENT, right) == "r2"  # goes on on its own branch, the left call still in flight
    gates.gates["left"].set()
    assert await held == "l1"
    record = await gateway.finish(rollout.id)
    traj = Trajectory.from_record(record.trajectory)
    trunk, sibling = by_number(traj)
    assert [len(trunk.turns), len(sibling.turns)] == [2, 3]
    first = trunk.turns[0]
    assert (sibling.parent_branch, sibling.fork_at, sibling.fork_kind) == (
        0,
        first.output_start + first.output_len,
        "parallel",
    )
    assert sibling.fork_reason == "a call from the same point as the call in flight on branch 0"
    assert sibling.token_ids[: sibling.fork_at] == trunk.token_ids[: sibling.fork_at]
    sent_exactly(traj, backend)


async def test_the_same_request_twice_in_flight_is_recorded_twice(gateway: Gateway, backend: Any) -> None:
    """A client that sends a request again while the first is in flight gets both answers; each has its branch."""
    arrived: list[asyncio.Event] = []
    original = backend.generate

    async def generate(request: GenerateRequest) -> Any:
        arrived.append(asyncio.Event())
        arrived[-1].set()
        if len(arrived) == 1:
            await both.wait()  # the first call is held until the second one reached the engine
        return await original(request)

    both = asyncio.Event()
    backend.generate = generate
    backend.add("second", "first")
    rollout = gateway.open()
    sdk = client(rollout)
    first = asyncio.create_task(ask(sdk, PARENT, [user("hi")]))
    second = asyncio.create_task(ask(sdk, PARENT, [user("hi")]))
    await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
    assert len(arrived) == 2  # the second call went through while the first was held
    both.set()
    assert sorted([await first, await second]) == ["first", "second"]
    traj = Trajectory.from_record((await gateway.finish(rollout.id)).trajectory)
    root, twin = by_number(traj)
    assert (twin.parent_branch, twin.fork_at, twin.fork_kind) == (None, 0, "parallel")
    assert root.token_ids[: root.turns[0].output_start] == twin.token_ids[: twin.turns[0].output_start]
    assert {root.status, twin.status} == {"completed"}


async def test_finishing_a_rollout_while_a_call_runs_is_409(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    gates = Gates(backend, qwen3_tokenizer, {"hi": "done"}, held={"hi"})
    rollout = gateway.open()
    call = asyncio.create_task(ask(client(rollout), PARENT, [user("hi")]))
    await gates.entered["hi"].wait()
    with pytest.raises(GatewayError) as refused:
        await gateway.finish(rollout.id)
    assert (refused.value.status, refused.value.code) == (409, "rollout_busy")
    gates.gates["hi"].set()
    assert await call == "done"
    assert (await gateway.finish(rollout.id)).status == "completed"

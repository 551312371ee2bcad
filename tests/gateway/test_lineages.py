"""A parent agent and a sub-agent with another system prompt taking turns through one rollout, over each HTTP front
with its own SDK: one branch per lineage (3 turns and 2), each call on its lineage's backend sequence, and every open
branch closed with a status when the rollout finishes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from google.genai import types

from tests.gateway.test_chat_surface import ADD
from tests.gateway.test_chat_surface import client as chat_client
from tests.gateway.test_gemini import client as gemini_client
from tests.gateway.test_messages import client as messages_client
from tests.helpers import hermes_call
from tests.helpers.lineages import PARENT, REPLIES, SUB, assert_two_lineages, by_number, interleave
from tito_core import Trajectory
from tito_core.gateway import Gateway

Front = Callable[[Any], tuple[Callable[[str], Any], Callable[[str, list[Any]], Awaitable[str]]]]


def chat_completions(rollout: Any) -> tuple[Callable[[str], Any], Callable[[str, list[Any]], Awaitable[str]]]:
    sdk = chat_client(rollout)

    async def ask(system: str, history: list[Any]) -> str:
        answer = await sdk.chat.completions.create(
            model="m", messages=[{"role": "system", "content": system}, *history]
        )
        message = answer.choices[0].message
        history.append({"role": "assistant", "content": message.content})
        return message.content or ""

    return (lambda text: {"role": "user", "content": text}), ask


def responses(rollout: Any) -> tuple[Callable[[str], Any], Callable[[str, list[Any]], Awaitable[str]]]:
    sdk = chat_client(rollout)

    async def ask(system: str, history: list[Any]) -> str:
        answer = await sdk.responses.create(model="m", instructions=system, input=history, store=False)
        history.extend(item.model_dump(exclude_none=True) for item in answer.output)
        return answer.output_text

    return (lambda text: {"role": "user", "content": text}), ask


def messages(rollout: Any) -> tuple[Callable[[str], Any], Callable[[str, list[Any]], Awaitable[str]]]:
    sdk = messages_client(rollout)

    async def ask(system: str, history: list[Any]) -> str:
        answer = await sdk.messages.create(model="m", max_tokens=64, system=system, messages=history)
        history.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]}
        )
        return "".join(getattr(block, "text", "") for block in answer.content)

    return (lambda text: {"role": "user", "content": text}), ask


def gemini(rollout: Any) -> tuple[Callable[[str], Any], Callable[[str, list[Any]], Awaitable[str]]]:
    sdk = gemini_client(rollout)

    async def ask(system: str, history: list[Any]) -> str:
        setup = types.GenerateContentConfig(system_instruction=system)
        answer = await sdk.aio.models.generate_content(model="tito", contents=history, config=setup)
        history.append(answer.candidates[0].content)  # type: ignore[index]
        return answer.text or ""

    return (lambda text: types.Content(role="user", parts=[types.Part(text=text)])), ask


@pytest.mark.parametrize("front", [chat_completions, responses, messages, gemini])
async def test_a_parent_and_a_sub_agent_taking_turns_keep_one_branch_each(
    gateway: Gateway, backend: Any, front: Front
) -> None:
    for reply in REPLIES:
        backend.add(reply)
    rollout = gateway.open()
    user, ask = front(rollout)
    answers = await interleave(user, ask)
    assert answers == REPLIES
    record = await gateway.finish(rollout.id)
    traj = Trajectory.from_record(record.trajectory)
    assert_two_lineages(traj)
    sequences = [request.sequence for request in backend.requests]
    assert sequences[0] == sequences[2] == sequences[4] != sequences[1] == sequences[3]  # one per lineage
    assert [b.status for b in traj.all_branches] == ["completed", "completed"] and record.status == "completed"


async def test_finishing_closes_every_open_branch_with_its_own_status(gateway: Gateway, backend: Any) -> None:
    """The parent's last output asked for a tool the client never ran; the sub-agent answered: each branch says so."""
    backend.add(hermes_call("add", {"a": 2, "b": 3}), "s1")
    rollout = gateway.open()
    sdk = chat_client(rollout)
    first = await sdk.chat.completions.create(
        model="m", messages=[{"role": "system", "content": PARENT}, {"role": "user", "content": "add"}], tools=[ADD]
    )
    assert first.choices[0].finish_reason == "tool_calls"
    await sdk.chat.completions.create(
        model="m", messages=[{"role": "system", "content": SUB}, {"role": "user", "content": "part one"}]
    )
    record = await gateway.finish(rollout.id)
    parent, sub = by_number(Trajectory.from_record(record.trajectory))
    unanswered = "the rollout ended with the last output's tool calls unanswered"
    assert (parent.status, parent.status_reason) == ("aborted", unanswered)
    assert sub.status == record.status == "completed" and sub.parent_branch is None  # a new lineage: no tools

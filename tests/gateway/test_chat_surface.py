"""The chat-completions surface frameworks send: several leading system messages (pydantic-ai's system_prompt and
instructions, LangChain's two SystemMessages) and tool messages checked as OpenAI checks them."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.helpers import hermes_call
from tito_core.gateway import Gateway
from tito_testing.families import FAMILIES, family_template

from .conftest import config

ADD = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
}


def client(rollout: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)


async def test_leading_system_and_developer_messages_are_joined_in_order(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    backend.add("ok")
    rollout = gateway.open()
    messages: list[Any] = [
        {"role": "system", "content": "You are terse."},  # pydantic-ai's system_prompt
        {"role": "developer", "content": "Answer in French."},  # and its instructions
        {"role": "user", "content": "Hi"},
    ]
    await client(rollout).chat.completions.create(model="m", messages=messages)
    prompt = qwen3_tokenizer.decode(backend.requests[0].input_ids)
    assert "<|im_start|>system\nYou are terse.\n\nAnswer in French.<|im_end|>" in prompt
    assert gateway.registry.get(rollout.id).core.trajectory.branch == 0


async def test_a_later_system_message_is_rendered_where_it_stands_without_a_fork(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    backend.add("first")
    backend.add("second")
    rollout = gateway.open()
    messages: list[Any] = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    first = await client(rollout).chat.completions.create(model="m", messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "developer", "content": "Validation failed: answer again."},  # pydantic-ai's retry, say
        {"role": "user", "content": "Again"},
    ]
    await client(rollout).chat.completions.create(model="m", messages=messages)
    second = qwen3_tokenizer.decode(backend.requests[1].input_ids)
    assert second.endswith(
        "first<|im_end|>\n<|im_start|>system\nValidation failed: answer again.<|im_end|>\n"
        "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    ), second
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2


async def test_a_template_that_cannot_place_it_gets_it_in_the_system_prompt_and_the_rollout_forks(
    backend: Any, qwen3_tokenizer: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    template = family_template(FAMILIES["qwen3_5"])  # "System message must be at the beginning."
    gw = Gateway(config(chat_template=template), tokenizer=qwen3_tokenizer, backend=backend, output=tmp_path / "o")
    await gw.start()
    try:
        backend.add("first")
        backend.add("second")
        rollout = gw.open()
        messages: list[Any] = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
        await client(rollout).chat.completions.create(model="m", messages=messages)
        messages += [
            {"role": "assistant", "content": "first"},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Again"},
        ]
        await client(rollout).chat.completions.create(model="m", messages=messages)
        traj = gw.registry.get(rollout.id).core.trajectory
    finally:
        await gw.close()
    second = qwen3_tokenizer.decode(backend.requests[1].input_ids)
    assert second.startswith("<|im_start|>system\nYou are terse.\n\nBe brief.<|im_end|>\n"), second
    assert "first" in second and second.count("Be brief.") == 1
    assert traj.branch == 1 and traj.fork_reason == "a new lineage (the system prompt changed)"
    assert "joined into the system prompt and the rollout forks" in caplog.text


def _turn(call_id: str) -> list[Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    return [{"role": "user", "content": "add"}, {"role": "assistant", "content": None, "tool_calls": [call]}]


@pytest.mark.parametrize(
    ("messages", "param", "text"),
    [
        ([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "2"}],
         "messages[1].role", "must answer a tool call"),
        ([*_turn("c1"), {"role": "tool", "tool_call_id": "c9", "content": "2"}],
         "messages[2].tool_call_id", "'c9' is not a tool call"),
        ([*_turn("c1"), {"role": "tool", "tool_call_id": "c1", "content": "2"},
          {"role": "tool", "tool_call_id": "c1", "content": "2"}], "messages[3].tool_call_id", "answered twice"),
        ([*_turn("c1"), {"role": "assistant", "content": "moving on"}],
         "messages", "'c1' of the assistant message is not answered before messages[2]"),
        (_turn("c1"), "messages", "not answered before the end of messages"),
    ],
    ids=["answers-no-call", "unknown-id", "twice", "unanswered-then-assistant", "unanswered-at-the-end"],
)  # fmt: skip
async def test_tool_messages_that_answer_no_call_are_400_and_record_nothing(
    gateway: Gateway, backend: Any, messages: list[Any], param: str, text: str
) -> None:
    rollout = gateway.open()
    with pytest.raises(openai.BadRequestError) as refused:
        await client(rollout).chat.completions.create(model="m", messages=messages, tools=[ADD])  # type: ignore[arg-type]
    body = refused.value.body
    assert isinstance(body, dict) and body["param"] == param and text in body["message"], body
    assert backend.requests == [] and not gateway.registry.get(rollout.id).core.trajectory.turns


async def test_answered_calls_in_any_order_go_on(gateway: Gateway, backend: Any) -> None:
    backend.add(hermes_call("add", {"a": 1}) + "\n" + hermes_call("add", {"a": 2}), "3")
    rollout = gateway.open()
    api = client(rollout)
    messages: list[Any] = [{"role": "user", "content": "add twice"}]
    first = await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
    reply = first.choices[0].message
    assert len(reply.tool_calls or []) == 2
    messages.append(reply.model_dump(exclude_none=True))
    for call in reversed(reply.tool_calls or []):  # answered out of order: allowed, recorded in call order
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": str(json.loads(call.function.arguments)["a"])}
        )
    second = await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
    assert second.choices[0].message.content == "3"
    assert gateway.registry.get(rollout.id).core.trajectory.branch == 0


async def test_the_same_call_twice_is_matched_by_position_and_never_forks(gateway: Gateway, backend: Any) -> None:
    """A screenshot agent calls the same tool with the same arguments on consecutive turns: two equal replies.
    Matched by content, the second stood for both and the first's tool-call ids were wrong: a fork."""
    same = hermes_call("add", {"a": 1})
    backend.add(same, same, "done")
    rollout = gateway.open()
    api = client(rollout)
    messages: list[Any] = [{"role": "user", "content": "look twice"}]
    for _ in range(2):
        answer = await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
        reply = answer.choices[0].message
        (call,) = reply.tool_calls or []
        messages += [reply.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "1"}]
    final = await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
    assert final.choices[0].message.content == "done"
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 3

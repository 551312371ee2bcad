"""The real OpenAI SDK against the gateway on the scripted backend: answers, streams, tool calls, tool_choice."""

from __future__ import annotations

import json
from typing import Any

import openai
from openai import AsyncOpenAI

from tests.helpers import hermes_call
from tito_core.gateway import Gateway
from tito_core.records import read_records

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def client(rollout: Any, base_url: str | None = None) -> AsyncOpenAI:
    """The OpenAI SDK on ``rollout``: its base URL (or ``base_url``) and its token as the api key."""
    return AsyncOpenAI(base_url=base_url or rollout.base_url, api_key=rollout.token, max_retries=0)


async def test_plain_answer_carries_ids_logprobs_and_the_record(gateway: Gateway, backend: Any) -> None:
    backend.add("Paris.")
    rollout = gateway.open(task_id="t1")
    answer = await client(rollout).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Capital of France?"}], logprobs=True, temperature=0.5
    )
    choice = answer.choices[0]
    assert choice.message.content == "Paris."
    assert choice.finish_reason == "stop"
    traj = gateway.registry.get(rollout.id).core.trajectory
    output = traj.segments[-1]
    extra: dict[str, Any] = answer.model_extra or {}
    assert extra["tito"]["output_ids"] == traj.tokens(output)
    assert [t.logprob for t in choice.logprobs.content] == traj.logprobs[output.start : output.end]
    assert backend.requests[0].sampling.temperature == 0.5
    assert answer.usage.completion_tokens == output.length
    record = await gateway.finish(rollout.id, reward=1.0)
    assert record.status == "completed" and record.reward == 1.0 and record.task_id == "t1"
    assert [r.key for r in read_records(gateway.output_path)] == [("t1", 0)]


async def test_tool_call_round_trip_extends_the_same_tokens(gateway: Gateway, backend: Any) -> None:
    backend.add(hermes_call("add", {"a": 2, "b": 3}), "5")
    rollout = gateway.open()
    api = client(rollout)
    messages: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
    first = await api.chat.completions.create(model="m", messages=messages, tools=[ADD], tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
    assert backend.requests[0].grammar is not None  # forced through the same constrained decoding as TitoModel
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
    assert second.choices[0].message.content == "5"
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2  # replayed unchanged: no fork
    first_ids, second_ids = backend.requests[0].input_ids, backend.requests[1].input_ids
    assert second_ids[: len(first_ids)] == first_ids  # the second prompt starts with the first call's tokens
    assert traj.token_ids[: len(second_ids)] == second_ids
    assert traj.status == "completed"


async def test_replay_with_reordered_keys_other_ids_and_no_reasoning_still_matches(
    gateway: Gateway, backend: Any
) -> None:
    backend.add("<think>\nadding\n</think>\n\n" + hermes_call("add", {"a": 2, "b": 3}), "5")
    rollout = gateway.open()
    api = client(rollout)
    messages: list[Any] = [{"role": "user", "content": "2 + 3?"}]
    first = await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
    message = first.choices[0].message.model_dump(exclude_none=True)
    assert (message.get("model_extra") or first.choices[0].message.model_extra or {}).get(
        "reasoning_content"
    ) == "adding"
    replayed = {
        "role": "assistant",
        "content": "  ",
        "tool_calls": [{"id": "mine", "type": "function", "function": {"name": "add", "arguments": '{"b":3, "a": 2}'}}],
    }
    messages += [replayed, {"role": "tool", "tool_call_id": "mine", "content": "5"}]
    await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2


async def test_changed_history_forks(gateway: Gateway, backend: Any) -> None:
    backend.add("Paris.", "Rome.")
    rollout = gateway.open()
    api = client(rollout)
    await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "France?"}])
    edited = [
        {"role": "user", "content": "France?"},
        {"role": "assistant", "content": "Lyon."},
        {"role": "user", "content": "Italy?"},
    ]
    await api.chat.completions.create(model="m", messages=edited)
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 1 and "rewritten" in (traj.fork_reason or "")


async def test_stream_replays_the_answer_as_chunks(gateway: Gateway, backend: Any) -> None:
    backend.add(hermes_call("add", {"a": 1, "b": 1}))
    rollout = gateway.open()
    stream = await client(rollout).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "1 + 1?"}],
        tools=[ADD],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0][0].function.name == "add" and json.loads(calls[0][0].function.arguments) == {"a": 1, "b": 1}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


async def test_bearer_route_and_models(gateway: Gateway, backend: Any) -> None:
    backend.add("hi")
    rollout = gateway.open()
    api = client(rollout, gateway.base_url + "/v1")
    answer = await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
    assert answer.choices[0].message.content == "hi"
    models = await api.models.list()
    assert [m.id for m in models.data] == [gateway.model_name]


async def test_unsupported_fields_are_400s_naming_the_field(gateway: Gateway, backend: Any) -> None:
    rollout = gateway.open()
    api = client(rollout)
    user = [{"role": "user", "content": "x"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"n": 2}, "n"),
        ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
        ({"extra_body": {"guided_regex": "a"}}, "guided_regex"),
        ({"tools": [ADD], "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [ADD]}, "tool_choice"),
    ]
    for options, field in cases:
        try:
            await api.chat.completions.create(model="m", messages=user, **options)
        except openai.BadRequestError as exc:
            assert exc.status_code == 400
            assert field in exc.message
        else:
            raise AssertionError(f"{options} was accepted")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    try:
        await api.chat.completions.create(model="m", messages=image)
    except openai.BadRequestError as exc:  # a text-only model: the image part is named (tests/gateway/test_images.py)
        assert "messages[0].content[0]: this model takes no images" in exc.message
    else:
        raise AssertionError("an image for a text-only model was accepted")
    assert backend.requests == []
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.status == "failed" and "GatewayError" in (traj.status_reason or "")

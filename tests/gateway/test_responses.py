"""The Responses API front, driven by the real ``openai`` SDK's ``client.responses`` on the scripted backend: the
same conversation as chat completions, chained by ``previous_response_id`` or replayed whole (``store: false``)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.helpers import hermes_call
from tito_core.gateway import Gateway
from tito_core.grammar import answer_grammar

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False},
    "strict": True,
}  # fmt: skip


def client(rollout: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)


def script_tool_loop(backend: Any) -> None:
    backend.add("<think>\nadd them\n</think>\n\n" + hermes_call("add", {"a": 2, "b": 3}))
    backend.add("The sum is 5.")


@pytest.mark.parametrize("chained", [True, False], ids=["previous_response_id", "store-false-whole-input"])
async def test_a_tool_loop_records_two_turns_on_one_branch(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any, chained: bool
) -> None:
    script_tool_loop(backend)
    rollout = gateway.open()
    sdk = client(rollout)
    question: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
    first = await sdk.responses.create(
        model="m", instructions="Use the tool.", input=question, tools=[ADD], tool_choice="required",
        store=chained,
    )  # fmt: skip
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call"], first.output
    call = first.output[-1]
    assert call.type == "function_call" and json.loads(call.arguments) == {"a": 2, "b": 3}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
    if chained:
        second = await sdk.responses.create(
            model="m", instructions="Use the tool.", previous_response_id=first.id, input=[result], tools=[ADD]
        )
    else:
        replay = [item.model_dump(exclude_none=True) for item in first.output]
        second = await sdk.responses.create(
            model="m", instructions="Use the tool.", input=[*question, *replay, result], tools=[ADD], store=False
        )
    assert second.output_text == "The sum is 5." and second.status == "completed"
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2
    first_request, second_request = backend.requests
    assert list(second_request.input_ids[: traj.turns[1].prompt_start]) == [
        *first_request.input_ids,
        *traj.token_ids[traj.turns[0].output_start : traj.turns[0].output_start + traj.turns[0].output_len],
    ]
    prompt = qwen3_tokenizer.decode(second_request.input_ids)
    assert "<|im_start|>system\nUse the tool." in prompt and "<tool_response>\n5\n</tool_response>" in prompt
    assert (second.model_extra or {})["tito"]["output_ids"] == traj.token_ids[traj.turns[1].output_start :]
    assert second.usage is not None and second.usage.input_tokens == len(second_request.input_ids)


async def test_the_stream_is_the_apis_events_and_ends_with_the_response(gateway: Gateway, backend: Any) -> None:
    script_tool_loop(backend)
    rollout = gateway.open()
    stream = await client(rollout).responses.create(
        model="m", input="What is 2 + 3?", tools=[ADD], tool_choice="required", stream=True
    )
    events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.output_item.done",  # the reasoning
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1]
    assert done.type == "response.completed" and done.response.output[-1].type == "function_call"
    backend.add("x" * 3)
    answer = await client(rollout).responses.create(
        model="m",
        previous_response_id=done.response.id,
        input=[{"type": "function_call_output", "call_id": done.response.output[-1].call_id, "output": "5"}],
        tools=[ADD],
        max_output_tokens=2,
        stream=True,
    )
    tail = [event async for event in answer]
    text = "".join(e.delta for e in tail if e.type == "response.output_text.delta")
    assert tail[-1].type == "response.incomplete" and text == tail[-1].response.output_text
    assert tail[-1].response.incomplete_details is not None
    assert tail[-1].response.incomplete_details.reason == "max_output_tokens"


class Sum(BaseModel):
    sum: int


async def test_text_format_is_the_structured_answer(gateway: Gateway, backend: Any) -> None:
    backend.add('{"sum": 5}')
    rollout = gateway.open()
    parsed = await client(rollout).responses.parse(model="m", input="2 + 3?", text_format=Sum)
    assert parsed.output_parsed == Sum(sum=5)
    schema = {**Sum.model_json_schema(), "additionalProperties": False}
    assert backend.requests[0].grammar == answer_grammar(schema)


@pytest.mark.parametrize(
    ("kwargs", "param", "text"),
    [
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type", "'web_search_call' is not supported"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id", "is not a response of this"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
        ({"input": "x", "truncation": "auto"}, "truncation", "only 'disabled'"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "input[0].content[0].type", "'input_file' is not supported"),
    ],
    ids=["item-type", "unknown-previous", "hosted-tool", "truncation", "file-part"],
)  # fmt: skip
async def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    gateway: Gateway, backend: Any, kwargs: dict[str, Any], param: str, text: str
) -> None:
    rollout = gateway.open()
    with pytest.raises(openai.BadRequestError) as caught:
        await client(rollout).responses.create(model="m", **kwargs)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param and text in error["message"], error
    assert not backend.requests

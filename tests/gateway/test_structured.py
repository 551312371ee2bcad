"""Structured outputs through the gateway: ``response_format`` becomes the grammar the engine constrains decoding
with (the scripted backend follows its script; what the grammars admit is checked with xgrammar in
tests/transformers/test_grammar_syntax.py, and on the real engines in the integration suites)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from tito_core.gateway import Gateway
from tito_core.grammar import answer_grammar
from tito_core.tool_parsers import HermesToolParser
from tito_testing.scripted import ScriptedBackend

from .conftest import config

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    },
}
ADD_SPEC: Any = {"name": "add", "description": "", "inputSchema": {"json": ADD["function"]["parameters"]}}


class City(BaseModel):
    name: str
    population: int


def client(rollout: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)


async def test_the_sdks_parse_gets_the_constrained_answer_and_the_turn_says_constrained(
    gateway: Gateway, backend: Any
) -> None:
    backend.add('{"name": "Paris", "population": 2102650}')
    rollout = gateway.open()
    answer = await client(rollout).chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "Largest French city?"}], response_format=City
    )
    assert answer.choices[0].message.parsed == City(name="Paris", population=2102650)
    (request,) = backend.requests
    schema = City.model_json_schema()  # what the SDK sends, strict: every property required, no others
    schema["additionalProperties"] = False
    assert request.grammar == answer_grammar(schema)
    turn = gateway.registry.get(rollout.id).core.trajectory.turns[0]
    assert turn.constrained


async def test_json_object_is_any_object_and_text_is_no_constraint(gateway: Gateway, backend: Any) -> None:
    backend.add('{"k": [1, null]}')
    backend.add("free text")
    rollout = gateway.open()
    messages: list[Any] = [{"role": "user", "content": "json please"}]
    first = await client(rollout).chat.completions.create(
        model="m", messages=messages, response_format={"type": "json_object"}
    )
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "x"}]
    await client(rollout).chat.completions.create(model="m", messages=messages, response_format={"type": "text"})
    assert [r.grammar for r in backend.requests] == [answer_grammar({"type": "object"}), None]


async def test_with_tools_the_answer_or_one_call_is_admitted_and_a_forced_call_wins(
    gateway: Gateway, backend: Any
) -> None:
    backend.add('{"a": 1}')
    backend.add('{"a": 2}')
    rollout = gateway.open()
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "a", "schema": ADD["function"]["parameters"]}}
    messages: list[Any] = [{"role": "user", "content": "go"}]
    await client(rollout).chat.completions.create(model="m", messages=messages, tools=[ADD], response_format=fmt)
    other = gateway.open()
    backend.add('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    await client(other).chat.completions.create(
        model="m", messages=messages, tools=[ADD], tool_choice="required", response_format=fmt
    )
    call = HermesToolParser().call_grammar([ADD_SPEC])
    assert backend.requests[0].grammar == answer_grammar(ADD["function"]["parameters"], call=call)
    assert backend.requests[1].grammar == call  # the forced call first; the answer is a later call's


@pytest.mark.parametrize(
    ("fmt", "param", "text"),
    [
        ({"type": "yaml"}, "response_format.type", "must be 'text', 'json_object' or 'json_schema'"),
        ("json", "response_format", "must be an object"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "response_format.json_schema.schema",
         "must be a JSON schema object"),
    ],
)  # fmt: skip
async def test_a_bad_response_format_is_a_400_naming_it(
    gateway: Gateway, backend: Any, fmt: Any, param: str, text: str
) -> None:
    rollout = gateway.open()
    with pytest.raises(openai.BadRequestError) as caught:
        await client(rollout).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], response_format=fmt
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param and text in error["message"], error
    assert not backend.requests


async def test_a_backend_that_cannot_constrain_is_a_400_naming_it(qwen3_tokenizer: Any, tmp_path: Any) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["{}"])  # supports_grammar False
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=tmp_path / "out.jsonl")
    await gateway.start()
    try:
        rollout = gateway.open()
        with pytest.raises(openai.BadRequestError) as caught:
            await client(rollout).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], response_format={"type": "json_object"}
            )
    finally:
        await gateway.close()
    assert "the scripted backend cannot constrain decoding" in str(caught.value), caught.value
    assert not backend.requests

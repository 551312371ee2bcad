"""The OpenAI SDK through a :class:`~tito_core.gateway.Gateway` on a real engine, shared by the vLLM and SGLang suites.

One rollout, two engine calls: a tool call forced by a named ``tool_choice`` (non-streaming, with logprobs), then
the tool's result and a streamed answer. The record must hold exactly what the engine consumed and produced: every
prompt the trajectory so far plus the new messages (the engine's prompt token count agreeing), every output's ids
and logprobs as the engine returned them, no fork. The tiny random model writes gibberish: the call is the
grammar's doing (its arguments are small enums so it closes quickly), the answer is cut at a few tokens.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from openai import AsyncOpenAI
from pydantic import BaseModel

from tito_core.backend import Backend, GenerateRequest, GenerateResult
from tito_core.config import TitoConfig
from tito_core.gateway import Gateway
from tito_testing.tokenizers import qwen_tokenizer_dir

SMALL = {"type": "integer", "enum": [1, 2, 3, 4, 5]}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two small integers.",
        "parameters": {"type": "object", "properties": {"a": SMALL, "b": SMALL}, "required": ["a", "b"]},
    },
}
FORCED = {"type": "function", "function": {"name": "add"}}


def recorded_calls(backend: Backend) -> list[tuple[GenerateRequest, GenerateResult]]:
    """Every (request, result) the backend serves from now on, in order (its ``generate`` wrapped in place)."""
    calls: list[tuple[GenerateRequest, GenerateResult]] = []
    generate = backend.generate

    async def recording(request: GenerateRequest) -> GenerateResult:
        result = await generate(request)
        calls.append((request, result))
        return result

    backend.generate = recording  # type: ignore[method-assign]
    return calls


async def sdk_through_gateway(backend: Backend, tokenizer: Any, *, name: str) -> None:
    """Run the rollout above through a gateway on ``backend`` (the caller's: left open) and check its record."""
    calls = recorded_calls(backend)
    config = TitoConfig(
        backend=name,
        tokenizer=str(qwen_tokenizer_dir("qwen3")),
        tool_parser="hermes",
        sampling={"temperature": 1.0, "max_new_tokens": 96, "seed": 3},
    )
    gateway = Gateway(config, tokenizer=tokenizer, backend=backend)
    await gateway.start()
    try:
        rollout = gateway.open(task_id="gateway")
        client = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0, timeout=120)
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        first = await client.chat.completions.create(
            model="tiny", messages=messages, tools=[ADD], tool_choice=FORCED, logprobs=True
        )
        (call,) = first.choices[0].message.tool_calls or ()
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == {"a", "b"} and all(v in SMALL["enum"] for v in arguments.values()), arguments
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])},
        ]
        stream = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=[ADD],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        traj = await gateway.take(rollout.id)
    finally:
        await gateway.close()

    assert len(calls) == 2 and len(traj.turns) == 2
    assert traj.branch == 0 and not traj.branches  # the replayed call matched what was returned: no fork
    assert traj.turns[0].constrained and calls[0][0].grammar is not None  # the named tool_choice, as a grammar
    for (request, result), turn in zip(calls, traj.turns, strict=True):
        sent = list(request.input_ids)
        assert sent == traj.token_ids[: turn.prompt_start + turn.prompt_len]  # the trajectory so far + new prompt
        assert result.prompt_tokens == len(sent), (result.prompt_tokens, len(sent))  # the engine consumed them
        assert result.prompt_ids in (None, sent)
        end = turn.output_start + turn.output_len
        assert traj.token_ids[turn.output_start : end] == result.output_ids  # the engine's ids, verbatim
        assert traj.logprobs[turn.output_start : end] == result.output_logprobs
        assert traj.loss_mask[turn.output_start : end] == [1] * len(result.output_ids)
    (first_request, first_result), (second_request, second_result) = calls
    assert list(second_request.input_ids[: traj.turns[1].prompt_start]) == [
        *first_request.input_ids,
        *first_result.output_ids,
    ]
    # what the SDK saw is what the engine returned
    assert (first.model_extra or {})["tito"]["output_ids"] == first_result.output_ids
    assert [lp.logprob for lp in (first.choices[0].logprobs.content or ())] == first_result.output_logprobs  # type: ignore[union-attr]
    assert first.usage is not None and first.usage.prompt_tokens == len(first_request.input_ids)
    usage = chunks[-1].usage  # include_usage: a last chunk with usage and no choices
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (
        len(second_request.input_ids),
        len(second_result.output_ids),
    )
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and (finish[0] == "length") == (second_result.finish_reason == "length"), finish
    assert traj.turns[1].output_len == len(second_result.output_ids) <= 6


class Sum(BaseModel):
    """A structured answer whose every value is small, so the tiny random model closes it in a few tokens."""

    sum: Literal[1, 2, 3, 4, 5]
    sure: bool


async def structured_answer_through_gateway(backend: Backend, tokenizer: Any, *, name: str) -> Sum:
    """The SDK's ``chat.completions.parse(response_format=Sum)`` through a gateway on ``backend``: the engine
    decodes under the answer's grammar, the SDK parses what it returned, the record holds the engine's ids."""
    calls = recorded_calls(backend)
    config = TitoConfig(backend=name, tokenizer=str(qwen_tokenizer_dir("qwen3")), sampling={"max_new_tokens": 48})
    gateway = Gateway(config, tokenizer=tokenizer, backend=backend)
    await gateway.start()
    try:
        rollout = gateway.open(task_id="structured")
        client = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0, timeout=120)
        answer = await client.chat.completions.parse(
            model="tiny", messages=[{"role": "user", "content": "What is 2 + 3?"}], response_format=Sum
        )
        traj = await gateway.take(rollout.id)
    finally:
        await gateway.close()
    ((request, result),) = calls
    parsed = answer.choices[0].message.parsed
    assert parsed is not None and answer.choices[0].finish_reason == "stop", answer
    assert request.grammar is not None and traj.turns[0].constrained
    assert traj.token_ids[traj.turns[0].output_start :] == result.output_ids  # the engine's ids, verbatim
    assert Sum.model_validate_json(tokenizer.decode(result.output_ids, skip_special_tokens=True)) == parsed
    return parsed

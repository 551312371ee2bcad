"""The Anthropic Messages API front, driven by the real ``anthropic`` SDK on the scripted backend: the same
conversation as chat completions (thinking, tool_use and tool_result blocks), its stream, count_tokens and errors."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import msgspec
import pytest
from anthropic import AsyncAnthropic

from tests.gateway.conftest import GrammarBackend, config
from tests.helpers import hermes_call
from tito_core.backend import GenerateRequest, GenerateResult
from tito_core.errors import BackendConnectionError, BackendError, BackendThrottledError, BackendTimeoutError
from tito_core.gateway import Gateway
from tito_core.grammar import answer_grammar

ADD = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"]},
}  # fmt: skip
SYSTEM = [{"type": "text", "text": "Use the tool."}]


def client(rollout: Any) -> AsyncAnthropic:
    """The SDK adds ``/v1/messages`` to its base URL: the rollout's base URL without its ``/v1``."""
    return AsyncAnthropic(base_url=rollout.base_url.removesuffix("/v1"), api_key=rollout.token, max_retries=0)


async def test_a_tool_loop_records_two_turns_on_one_branch(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    backend.add("<think>\nadd them\n</think>\n\n" + hermes_call("add", {"a": 2, "b": 3}))
    backend.add("The sum is 5.")
    rollout = gateway.open()
    sdk = client(rollout)
    messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
    first = await sdk.messages.create(
        model="m", max_tokens=64, system=SYSTEM, messages=messages, tools=[ADD], tool_choice={"type": "any"}
    )
    assert [block.type for block in first.content] == ["thinking", "tool_use"] and first.stop_reason == "tool_use"
    use = first.content[-1]
    assert use.type == "tool_use" and use.input == {"a": 2, "b": 3}
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]},
    ]
    second = await sdk.messages.create(model="m", max_tokens=64, system=SYSTEM, messages=messages, tools=[ADD])
    assert [(b.type, getattr(b, "text", None)) for b in second.content] == [("text", "The sum is 5.")]
    assert second.stop_reason == "end_turn"
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2
    first_request, second_request = backend.requests
    turn = traj.turns[0]
    assert list(second_request.input_ids[: traj.turns[1].prompt_start]) == [
        *first_request.input_ids,
        *traj.token_ids[turn.output_start : turn.output_start + turn.output_len],
    ]
    prompt = qwen3_tokenizer.decode(second_request.input_ids)
    assert "<|im_start|>system\nUse the tool." in prompt and "<tool_response>\n5\n</tool_response>" in prompt
    assert second.usage.input_tokens == len(second_request.input_ids)
    assert (second.model_extra or {})["tito"]["output_ids"] == traj.token_ids[traj.turns[1].output_start :]
    counted = await sdk.messages.count_tokens(model="m", system=SYSTEM, messages=messages, tools=[ADD])
    assert counted.input_tokens == len(second_request.input_ids)  # the whole prompt, rendered again
    assert len(backend.requests) == 2  # counting calls no model


async def test_the_stream_is_the_apis_events_and_its_final_message(gateway: Gateway, backend: Any) -> None:
    backend.add("<think>\nhm\n</think>\n\n" + hermes_call("add", {"a": 1, "b": 1}))
    rollout = gateway.open()
    async with client(rollout).messages.stream(
        model="m", max_tokens=64, messages=[{"role": "user", "content": "1 + 1?"}], tools=[ADD]
    ) as stream:
        events = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "tool_use"]
    tool_use = final.content[1]
    assert tool_use.type == "tool_use" and tool_use.input == {"a": 1, "b": 1} and final.stop_reason == "tool_use"
    raw = [e for e in events if e not in ("text", "thinking", "input_json", "signature")]  # the SDK's own extras
    assert raw == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  # + signature
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip


async def test_a_thinking_block_is_signed_and_taken_back(gateway: Gateway, backend: Any) -> None:
    """A thinking block had an empty signature and its stream no signature_delta: Anthropic's stream ends a thinking
    block with one, and its clients keep the signature to send the block back."""
    backend.add("<think>\nsum them\n</think>\n\n" + hermes_call("add", {"a": 1, "b": 2}))
    backend.add("<think>\nsum them\n</think>\n\n" + hermes_call("add", {"a": 1, "b": 2}))
    backend.add("It is 3.")
    streamed, plain = gateway.open(), gateway.open()
    user: list[Any] = [{"role": "user", "content": "1 + 2?"}]
    deltas: list[tuple[int, str]] = []
    async with client(streamed).messages.stream(model="m", max_tokens=64, messages=user, tools=[ADD]) as stream:
        async for event in stream:
            if event.type == "content_block_delta":
                deltas.append((event.index, event.delta.type))
            elif event.type == "content_block_stop":
                deltas.append((event.index, "stop"))
        final = await stream.get_final_message()
    assert deltas[:3] == [(0, "thinking_delta"), (0, "signature_delta"), (0, "stop")]  # signed, then stopped
    thinking = final.content[0]
    assert thinking.type == "thinking" and thinking.thinking.strip() == "sum them"
    assert isinstance(thinking.signature, str) and thinking.signature  # the SDK accumulated the signature_delta
    answer = await client(plain).messages.create(model="m", max_tokens=64, messages=user, tools=[ADD])
    assert answer.content[0].type == "thinking" and answer.content[0].signature == thinking.signature
    use = final.content[1]
    assert use.type == "tool_use"
    history = [
        *user,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3"}]},
    ]
    assert history[1]["content"][0]["signature"] == thinking.signature  # sent back as the SDK keeps it
    last = await client(streamed).messages.create(model="m", max_tokens=64, messages=history, tools=[ADD])
    assert last.content[0].type == "text" and last.content[0].text == "It is 3."
    traj = gateway.registry.get(streamed.id).core.trajectory
    assert not traj.branches and len(traj.turns) == 2  # the block was matched with the reply: no fork


async def test_max_tokens_stop_sequences_and_top_k(gateway: Gateway, backend: Any) -> None:
    backend.add("one two three four five six")
    rollout = gateway.open()
    answer = await client(rollout).messages.create(
        model="m", max_tokens=2, stop_sequences=["zz"], messages=[{"role": "user", "content": "x"}],
        extra_body={"top_k": 5},
    )  # fmt: skip
    assert answer.stop_reason == "max_tokens"
    sampling = backend.requests[0].sampling
    assert (sampling.max_new_tokens, sampling.stop, sampling.top_k) == (2, ("zz",), 5)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
         "messages[0].content[0].type: content block 'document' is not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124", "name": "bash"}]},
         "tools[0].type: only custom tools"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]},
         "only base64 image sources"),
        ({"messages": [{"role": "user", "content": "x"}], "extra_body": {"container": "c"}},
         "container: this field is not supported"),
    ],
    ids=["document", "server-tool", "image-url", "unknown-field"],
)  # fmt: skip
async def test_what_cannot_be_honoured_is_a_400_in_anthropics_shape(
    gateway: Gateway, backend: Any, kwargs: dict[str, Any], text: str
) -> None:
    rollout = gateway.open()
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client(rollout).messages.create(model="m", max_tokens=8, **kwargs)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error" and text in body["error"]["message"], body
    assert not backend.requests


async def test_the_token_alone_finds_the_rollout_in_x_api_key(gateway: Gateway, backend: Any) -> None:
    backend.add("hi")
    rollout = gateway.open()
    root = rollout.base_url.split("/rollouts/")[0]
    sdk = AsyncAnthropic(base_url=root, api_key=rollout.token, max_retries=0)  # x-api-key: the token
    answer = await sdk.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert answer.content[0].type == "text" and len(backend.requests) == 1
    other = AsyncAnthropic(base_url=root, api_key="sk-ant-not-a-token", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await other.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert "sk-ant-not-a-token" not in str(caught.value.body)


async def test_claude_codes_system_message_and_output_config_are_taken(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    backend.add('{"sum": 5}')
    rollout = gateway.open()
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "2 + 3?"}]},
        {"role": "system", "content": [{"type": "text", "text": "Answer in JSON.", "cache_control": {"type": "x"}}]},
    ]
    answer = await client(rollout).messages.create(
        model="m", max_tokens=32, messages=messages,
        extra_body={"output_config": {"effort": "high", "format": {"type": "json_schema", "schema": schema}},
                    "context_management": {"edits": []}, "thinking": {"type": "adaptive"}},
    )  # fmt: skip
    assert answer.content[0].type == "text" and answer.content[0].text == '{"sum": 5}'
    (request,) = backend.requests
    assert request.grammar == answer_grammar(schema)
    prompt = qwen3_tokenizer.decode(request.input_ids)
    assert "<|im_start|>user\n2 + 3?<|im_end|>\n<|im_start|>system\nAnswer in JSON.<|im_end|>" in prompt


def _raise(exc: Exception) -> Any:
    def reply(request: Any) -> str:
        raise exc

    return reply


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (BackendThrottledError("busy", backend="scripted"), 429, "rate_limit_error"),
        (BackendError("the engine broke", backend="scripted"), 502, "api_error"),
        (BackendConnectionError("refused", backend="scripted"), 503, "overloaded_error"),
        (BackendTimeoutError("too slow", backend="scripted"), 504, "timeout_error"),
        (RuntimeError("a bug"), 500, "api_error"),
    ],
    ids=["429", "502", "503", "504", "500"],
)
async def test_engine_failures_are_anthropics_error_types(
    gateway: Gateway, backend: Any, exc: Exception, status: int, kind: str
) -> None:
    """Every 5xx was `server_error`, a type Anthropic does not have."""
    backend.add(_raise(exc))
    rollout = gateway.open()
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client(rollout).messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == status
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == kind, body


async def test_request_errors_are_anthropics_error_types(backend: Any, qwen3_tokenizer: Any, tmp_path: Any) -> None:
    """413 was `invalid_request_error` (Anthropic's is `request_too_large`); the others were right and stay so."""
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, max_body_bytes=4096)
    await gateway.start()
    try:
        rollout = gateway.open()
        sdk = client(rollout)
        user = [{"role": "user", "content": "x"}]
        cases: list[tuple[Any, type[anthropic.APIStatusError], str]] = [
            (sdk.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x" * 10_000}]),
             anthropic.ContentTooLargeError, "request_too_large"),
            (sdk.with_options(api_key="wrong").messages.create(model="m", max_tokens=8, messages=user),
             anthropic.AuthenticationError, "authentication_error"),
            (AsyncAnthropic(base_url=f"{gateway.base_url}/rollouts/nope", api_key=rollout.token, max_retries=0)
             .messages.create(model="m", max_tokens=8, messages=user), anthropic.NotFoundError, "not_found_error"),
            (sdk.with_options(default_headers={"Host": "evil.example"}).messages.create(
                model="m", max_tokens=8, messages=user), anthropic.PermissionDeniedError, "permission_error"),
        ]  # fmt: skip
        for call, error, kind in cases:
            with pytest.raises(error) as caught:
                await call
            body = caught.value.body
            assert isinstance(body, dict) and body["error"]["type"] == kind, (kind, body)
        finished = gateway.open()
        await gateway.finish(finished.id)
        with pytest.raises(anthropic.ConflictError) as conflict:
            await client(finished).messages.create(model="m", max_tokens=8, messages=user)
        assert isinstance(conflict.value.body, dict) and conflict.value.body["error"]["type"] == "conflict_error"
    finally:
        await gateway.close()
    assert not backend.requests


async def test_the_shutdown_503_is_an_overloaded_error(gateway: Gateway, backend: Any) -> None:
    """It was `server_error`. Anthropic's type for "temporarily unable to serve" is overloaded_error; the header
    x-should-retry: false still tells the SDK not to retry a gateway that is going away."""
    entered, release = asyncio.Event(), asyncio.Event()
    generate = backend.generate

    async def held(request: Any) -> Any:
        entered.set()
        await release.wait()
        return await generate(request)

    backend.generate = held
    backend.add("in flight")
    busy, other = gateway.open(), gateway.open()
    user = [{"role": "user", "content": "x"}]
    in_flight = asyncio.ensure_future(client(busy).messages.create(model="m", max_tokens=8, messages=user))
    await entered.wait()
    closing = asyncio.ensure_future(gateway.close(drain_s=600))  # a guard: the call ends when released
    while not gateway.closing:
        await asyncio.sleep(0)
    try:
        with pytest.raises(anthropic.APIStatusError) as caught:
            await client(other).messages.create(model="m", max_tokens=8, messages=user)
    finally:
        release.set()
        await in_flight
        await closing
    assert caught.value.status_code == 503 and caught.value.response.headers["x-should-retry"] == "false"
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "overloaded_error", body
    assert body["error"]["code"] == "shutting_down"


class StopStringBackend(GrammarBackend):
    """Ends a reply at the request's first stop string, as vLLM and SGLang do: the tokens before it, no stop token,
    and the string reported as ``matched_stop``."""

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await super().generate(request)
        text = self.tokenizer.decode(result.output_ids)
        hits = [(text.index(stop), stop) for stop in request.sampling.stop if stop in text]
        if not hits:
            return result
        at, stop = min(hits)
        ids = self.tokenizer.encode(text[:at], add_special_tokens=False)
        logprobs = None if result.output_logprobs is None else result.output_logprobs[: len(ids)]
        return msgspec.structs.replace(
            result, output_ids=ids, output_logprobs=logprobs, finish_reason="stop", matched_stop=stop
        )


async def test_a_stop_sequence_hit_is_the_stop_reason(qwen3_tokenizer: Any, tmp_path: Any) -> None:
    """stop_reason was never stop_sequence: a call the engine stopped on one of the request's stop_sequences said
    end_turn, with stop_sequence null."""
    backend = StopStringBackend(qwen3_tokenizer, ["one two END three", "one two END three", "no stop here"])
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend)
    await gateway.start()
    try:
        rollout = gateway.open()
        sdk = client(rollout)
        user = [{"role": "user", "content": "count"}]
        answer = await sdk.messages.create(model="m", max_tokens=32, stop_sequences=["zz", "END"], messages=user)
        assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", "END")
        assert answer.content[0].type == "text" and answer.content[0].text.strip() == "one two"
        turn = gateway.registry.get(rollout.id).core.trajectory.turns[0]
        assert turn.matched_stop == "END"  # what the engine said, recorded
        async with client(gateway.open()).messages.stream(
            model="m", max_tokens=32, stop_sequences=["END"], messages=user
        ) as stream:
            final = await stream.get_final_message()
        assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")  # from message_delta
        plain = await client(gateway.open()).messages.create(
            model="m", max_tokens=32, stop_sequences=["END"], messages=user
        )
        assert (plain.stop_reason, plain.stop_sequence) == ("end_turn", None)  # ended on its stop token
    finally:
        await gateway.close()

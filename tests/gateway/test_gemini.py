"""Google's Gemini API front, driven by the real ``google-genai`` SDK on the scripted backend: a tool loop on one
branch (the SDK's own automatic loop too), its stream, countTokens, structured output, function calls matched by id
or by name, the sampling fields, and every 400 naming the Gemini field in Google's error shape (raw HTTP where the
SDK would refuse the request itself)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types
from pydantic import BaseModel

from tests.gateway.conftest import config
from tests.helpers import hermes_call
from tito_core.errors import BackendConnectionError, BackendError, BackendThrottledError, BackendTimeoutError
from tito_core.gateway import Gateway
from tito_core.grammar import answer_grammar

THINK = "<think>\nadd them\n</think>\n\n"
NO_LOOP = types.AutomaticFunctionCallingConfig(disable=True)
SHOW_THOUGHTS = types.ThinkingConfig(include_thoughts=True)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def client(rollout: Any, *, root: bool = False) -> genai.Client:
    """The SDK on the rollout: it adds ``/v1beta/models/...`` to its base URL (the rollout's, without ``/v1``)."""
    base = rollout.base_url.split("/rollouts/")[0] if root else rollout.base_url.removesuffix("/v1")
    return genai.Client(api_key=rollout.token, http_options=types.HttpOptions(base_url=base, api_version="v1beta"))


def declared(sdk: genai.Client) -> list[types.Tool]:
    """``add`` declared as the SDK declares a Python function: ``parameters`` in Gemini's upper-case schema."""
    return [types.Tool(function_declarations=[types.FunctionDeclaration.from_callable(client=sdk, callable=add)])]


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def parts(answer: types.GenerateContentResponse) -> list[types.Part]:
    (candidate,) = answer.candidates or []
    assert candidate.content is not None
    return candidate.content.parts or []


async def post(rollout: Any, body: Any, method: str = "generateContent", key: str | None = None) -> httpx.Response:
    url = f"{rollout.base_url.removesuffix('/v1')}/v1beta/models/tito:{method}"
    async with httpx.AsyncClient() as http:
        return await http.post(url, json=body, headers={"x-goog-api-key": key or rollout.token})


async def test_a_tool_loop_records_two_turns_on_one_branch(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    backend.add(THINK + hermes_call("add", {"a": 2, "b": 3}))
    backend.add("The sum is 5.")
    rollout = gateway.open()
    sdk = client(rollout)
    setup = types.GenerateContentConfig(
        system_instruction="Use the tool.", tools=declared(sdk), automatic_function_calling=NO_LOOP,
        thinking_config=SHOW_THOUGHTS,
    )  # fmt: skip
    contents = [user("What is 2 + 3?")]
    first = await sdk.aio.models.generate_content(model="tito", contents=contents, config=setup)
    assert [(p.thought, p.text) for p in parts(first)][:1] == [(True, "add them")]
    (call,) = first.function_calls or []
    assert (call.name, call.args) == ("add", {"a": 2, "b": 3}) and first.candidates[0].finish_reason == "STOP"  # type: ignore[index]
    # the history as the SDK keeps it; the function response has no id: it answers the call of its name
    response = types.Part.from_function_response(name="add", response={"output": "5"})
    contents += [first.candidates[0].content, types.Content(role="user", parts=[response])]  # type: ignore[index, list-item]
    second = await sdk.aio.models.generate_content(model="tito", contents=contents, config=setup)
    assert second.text == "The sum is 5." and second.candidates[0].finish_reason == "STOP"  # type: ignore[index]
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
    assert '"a": {"type": "integer"' in prompt  # the SDK's upper-case INTEGER, as JSON schema
    usage = second.usage_metadata
    assert usage and usage.prompt_token_count == len(second_request.input_ids)
    assert usage.total_token_count == usage.prompt_token_count + (usage.candidates_token_count or 0)
    assert second.model_version == "tito"


async def test_the_sdks_automatic_function_calling_runs_on_one_branch(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    """The SDK runs ``add`` itself and sends its result back (``{"result": 42}``), as an agent on it would."""
    backend.add(hermes_call("add", {"a": 20, "b": 22}))
    backend.add("It is 42.")
    rollout = gateway.open()
    answer = await client(rollout).aio.models.generate_content(
        model="tito", contents="What is 20 + 22?", config=types.GenerateContentConfig(tools=[add])
    )
    assert answer.text == "It is 42."
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2
    assert '<tool_response>\n{"result":42}\n</tool_response>' in qwen3_tokenizer.decode(backend.requests[1].input_ids)


async def test_the_stream_is_one_chunk_per_part_and_the_last_ends_it(gateway: Gateway, backend: Any) -> None:
    reply = THINK + "Calling it.\n" + hermes_call("add", {"a": 1, "b": 1})
    backend.add(reply, reply)
    streamed, plain = gateway.open(), gateway.open()
    sdk = client(streamed)
    setup = types.GenerateContentConfig(tools=declared(sdk), automatic_function_calling=NO_LOOP,
                                        thinking_config=SHOW_THOUGHTS)  # fmt: skip
    stream = await sdk.aio.models.generate_content_stream(model="tito", contents="1 + 1?", config=setup)
    chunks = [chunk async for chunk in stream]
    kinds = [(p.thought, p.text, p.function_call is not None) for chunk in chunks for p in parts(chunk)]
    assert kinds == [(True, "add them", False), (None, "Calling it.", False), (None, None, True)]
    assert [c.candidates[0].finish_reason for c in chunks] == [None, None, "STOP"]  # type: ignore[index]
    assert [c.usage_metadata is not None for c in chunks] == [False, False, True]
    whole = await client(plain).aio.models.generate_content(model="tito", contents="1 + 1?", config=setup)
    assert chunks[-1].usage_metadata == whole.usage_metadata
    assert [c.args for c in chunks[-1].function_calls or []] == [{"a": 1, "b": 1}]


async def test_thoughts_are_answered_only_when_asked_for(gateway: Gateway, backend: Any) -> None:
    """As Gemini, thought parts only with ``thinkingConfig.includeThoughts``; the history without them matches."""
    backend.add(THINK + "Five.", "Six.")
    rollout = gateway.open()
    sdk = client(rollout)
    first = await sdk.aio.models.generate_content(model="tito", contents="2 + 3?")
    assert [(p.thought, p.text) for p in parts(first)] == [(None, "Five.")]
    contents: Any = [user("2 + 3?"), first.candidates[0].content, user("And 3 + 3?")]  # type: ignore[index]
    await sdk.aio.models.generate_content(model="tito", contents=contents)
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2


TWO_CALLS = hermes_call("add", {"a": 1, "b": 2}) + "\n" + hermes_call("add", {"a": 3, "b": 4})
ADD_JSON = {"name": "add", "parametersJsonSchema": {"type": "OBJECT", "properties": {"a": {"type": "INTEGER"}}}}


@pytest.mark.parametrize("ids", [False, True], ids=["by-name", "by-id-reversed"])
async def test_function_responses_answer_their_calls_by_id_or_by_name_in_order(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any, ids: bool
) -> None:
    """Two calls of one function. Without ids (Gemini's own wire) the responses answer them in order; with the ids
    the gateway gave, in any order. Either way the tool results reach the model in the calls' order, and the
    replayed turn is the rollout's reply (no fork)."""
    backend.add(TWO_CALLS, "3 and 7.")
    rollout = gateway.open()
    body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "Sums?"}]}],
                            "tools": [{"functionDeclarations": [ADD_JSON]}]}  # fmt: skip
    first = (await post(rollout, body)).json()
    calls = [p["functionCall"] for p in first["candidates"][0]["content"]["parts"]]
    assert [c["args"] for c in calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}] and calls[0]["id"] != calls[1]["id"]
    results = [{"name": "add", "response": {"output": out}} | ({"id": c["id"]} if ids else {})
               for c, out in zip(calls, ("3", "7"), strict=True)]  # fmt: skip
    model = [{"functionCall": c if ids else {"name": c["name"], "args": c["args"]}} for c in calls]
    answers = [{"functionResponse": r} for r in (results[::-1] if ids else results)]
    body["contents"] += [{"role": "model", "parts": model}, {"role": "user", "parts": answers}]
    second = await post(rollout, body)
    assert second.status_code == 200, second.text
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2
    prompt = qwen3_tokenizer.decode(backend.requests[1].input_ids)
    assert prompt.index("<tool_response>\n3\n") < prompt.index("<tool_response>\n7\n")
    assert second.json()["tito"]["output_ids"] == traj.token_ids[traj.turns[1].output_start :]


async def test_count_tokens_counts_the_prompt_and_calls_no_model(gateway: Gateway, backend: Any) -> None:
    backend.add("Hi.")
    rollout = gateway.open()
    sdk = client(rollout)
    contents = [user("Hello"), types.Content(role="model", parts=[types.Part(text="Hi.")]), user("Again")]
    await sdk.aio.models.generate_content(model="tito", contents=contents)
    counted = await sdk.aio.models.count_tokens(model="tito", contents=contents)
    assert counted.total_tokens == len(backend.requests[0].input_ids) and len(backend.requests) == 1


class City(BaseModel):
    name: str
    population: int


CITY = {"properties": {"name": {"title": "Name", "type": "string"}, "population": {"title": "Population",
        "type": "integer"}}, "required": ["name", "population"], "title": "City", "type": "object"}  # fmt: skip


async def test_structured_output_is_constrained_to_the_schema(gateway: Gateway, backend: Any) -> None:
    """``responseSchema`` (Gemini's schema, as the SDK makes it of a pydantic model) and ``responseJsonSchema`` with
    upper-case types (as Gemini CLI sends it) are the same JSON schema, and the answer is constrained to it."""
    backend.add('{"name": "Paris", "population": 2102650}', '{"name": "Lyon", "population": 520774}')
    sdk = client(gateway.open())
    setup = types.GenerateContentConfig(response_mime_type="application/json", response_schema=City)
    answer = await sdk.aio.models.generate_content(model="tito", contents="Largest French city?", config=setup)
    assert answer.parsed == City(name="Paris", population=2102650)
    properties = {"name": {"type": "STRING", "title": "Name"}, "population": {"type": "INTEGER", "title": "Population"}}
    upper = {"type": "OBJECT", "title": "City", "required": ["name", "population"], "properties": properties}
    body = {"contents": [{"parts": [{"text": "Second?"}]}],
            "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": upper}}  # fmt: skip
    assert (await post(gateway.open(), body)).status_code == 200
    first, second = backend.requests
    assert first.grammar == answer_grammar(CITY) and second.grammar == answer_grammar(CITY)


async def test_the_sampling_fields_and_max_tokens(gateway: Gateway, backend: Any) -> None:
    backend.add("one two three four five six")
    rollout = gateway.open()
    setup = types.GenerateContentConfig(
        max_output_tokens=2, stop_sequences=["zz"], temperature=0.5, top_p=0.9, top_k=64, seed=7,
        response_logprobs=True, candidate_count=1, thinking_config=types.ThinkingConfig(thinking_budget=0),
    )  # fmt: skip
    answer = await client(rollout).aio.models.generate_content(model="tito", contents="Count.", config=setup)
    (candidate,) = answer.candidates or []
    assert candidate.finish_reason == "MAX_TOKENS"
    sampling = backend.requests[0].sampling
    assert (sampling.max_new_tokens, sampling.stop, sampling.temperature, sampling.top_p, sampling.top_k,
            sampling.seed) == (2, ("zz",), 0.5, 0.9, 64, 7)  # fmt: skip
    traj = gateway.registry.get(rollout.id).core.trajectory
    output = traj.segments[-1]
    chosen = candidate.logprobs_result.chosen_candidates if candidate.logprobs_result else None
    assert [c.log_probability for c in chosen or ()] == traj.logprobs[output.start : output.end]
    assert [c.token_id for c in chosen or ()] == traj.tokens(output)
    assert candidate.avg_logprobs == pytest.approx(sum(traj.logprobs[output.start : output.end]) / output.length)


@pytest.mark.parametrize(
    ("tool_config", "named"),
    [({"mode": "ANY"}, None), ({"mode": "ANY", "allowedFunctionNames": ["add"]}, "add"),
     ({"mode": "ANY", "allowedFunctionNames": ["add", "mul"]}, None)],
    ids=["any", "one-name", "all-names"],
)  # fmt: skip
async def test_mode_any_constrains_the_call(
    gateway: Gateway, backend: Any, tool_config: dict[str, Any], named: str | None
) -> None:
    backend.add(hermes_call("add", {"a": 1}))
    mul = {**ADD_JSON, "name": "mul"}
    body = {"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [ADD_JSON, mul]}],
            "toolConfig": {"functionCallingConfig": tool_config}}  # fmt: skip
    answer = await post(gateway.open(), body)
    assert answer.status_code == 200, answer.text
    grammar = backend.requests[0].grammar
    assert grammar is not None and ("call_mul" in grammar) == (named is None)  # one function, or any of them


async def test_the_token_alone_finds_the_rollout_in_x_goog_api_key(gateway: Gateway, backend: Any) -> None:
    backend.add("hi")
    rollout = gateway.open()
    answer = await client(rollout, root=True).aio.models.generate_content(model="tito", contents="x")
    assert answer.text == "hi" and len(backend.requests) == 1
    other = genai.Client(api_key="not-a-token", http_options=types.HttpOptions(
        base_url=rollout.base_url.split("/rollouts/")[0], api_version="v1beta"))  # fmt: skip
    with pytest.raises(errors.ClientError) as caught:
        await other.aio.models.generate_content(model="tito", contents="x")
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"
    assert "not-a-token" not in str(caught.value.details)
    v1 = genai.Client(api_key=rollout.token, http_options=types.HttpOptions(base_url=rollout.base_url[:-3]))
    backend.add("v1 too")
    assert (await v1.aio.models.generate_content(model="tito", contents="y")).text == "v1 too"  # the SDK's default


USER = {"role": "user", "parts": [{"text": "x"}]}
CALLED = {"role": "model", "parts": [{"functionCall": {"name": "add", "args": {"a": 1}}}]}
ANSWERED = {"role": "user", "parts": [{"functionResponse": {"name": "add", "response": {"output": "1"}}}]}
TOOLS = [{"functionDeclarations": [ADD_JSON]}]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"contents": [USER, ANSWERED]}, "contents[1].parts[0].functionResponse"),
        ({"contents": [USER, CALLED, {"role": "user", "parts": [
            {"functionResponse": {"name": "mul", "response": {}}}]}]}, "contents[2].parts[0].functionResponse.name"),
        ({"contents": [USER, CALLED, USER]}, "contents"),
        ({"contents": [USER, {"role": "system", "parts": [{"text": "s"}]}]}, "contents[1].role"),
        ({"contents": [{"parts": [{"fileData": {"fileUri": "gs://b/a.png"}}]}]}, "contents[0].parts[0].fileData"),
        ({"contents": [{"parts": [{"text": "x", "thought": True}]}]}, "contents[0].parts[0].thought"),
        ({"contents": [{"parts": [{"text": "x", "inlineData": {}}]}]}, "contents[0].parts[0]"),
        ({"contents": [USER], "systemInstruction": {"parts": [{"functionCall": {"name": "f"}}]}},
         "systemInstruction.parts[0].functionCall"),
        ({"contents": [USER], "tools": [{"googleSearch": {}}]}, "tools[0].googleSearch"),
        ({"contents": [USER], "tools": [{"functionDeclarations": [{"name": "f", "parameters": {
            "type": "OBJECT", "properties": {"a": {"type": "DATE"}}}}]}]},
         "tools[0].functionDeclarations[0].parameters.properties.a.type"),
        ({"contents": [USER], "generationConfig": {"temperature": 3}}, "generationConfig.temperature"),
        ({"contents": [USER], "generation_config": {"top_k": 0}}, "generation_config.top_k"),
        ({"contents": [USER], "generationConfig": {"candidateCount": 2}}, "generationConfig.candidateCount"),
        ({"contents": [USER], "generationConfig": {"responseMimeType": "text/x.enum"}},
         "generationConfig.responseMimeType"),
        ({"contents": [USER], "tools": TOOLS, "toolConfig": {"functionCallingConfig": {"mode": "VALIDATED"}}},
         "toolConfig.functionCallingConfig.mode"),
        ({"contents": [USER], "tools": TOOLS, "toolConfig": {"functionCallingConfig": {"mode": "NONE"}}},
         "toolConfig.functionCallingConfig.mode"),
        ({"contents": [USER], "cachedContent": "cachedContents/x"}, "cachedContent"),
        ({"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}]},
         "contents[0].parts[0]"),
        ({"contents": [{"parts": [{"inlineData": {"mimeType": "application/pdf", "data": "AAAA"}}]}]},
         "contents[0].parts[0].inlineData.mimeType"),
        ({"contents": [USER, {"role": "model", "parts": [{"text": "x", "thought": "yes"}]}, USER]},
         "contents[1].parts[0].thought"),
        ({"contents": [USER], "tools": TOOLS, "toolConfig": {"functionCallingConfig": {
            "mode": "ANY", "allowedFunctionNames": [{"name": "add"}]}}},
         "toolConfig.functionCallingConfig.allowedFunctionNames"),
        ({"contents": [USER], "generationConfig": {"responseMimeType": "application/json", "responseSchema": {
            "type": "OBJECT", "properties": {"1": {"type": "STRING"}}, "propertyOrdering": [1]}}},
         "generationConfig.responseSchema.propertyOrdering"),
        ({"contents": [USER], "generationConfig": {"responseMimeType": "application/json", "responseSchema": {
            "type": "OBJECT", "properties": ["a"], "propertyOrdering": ["a"]}}},
         "generationConfig.responseSchema.propertyOrdering"),
    ],
    ids=["orphan-response", "uncalled-name", "unanswered", "role", "file-data", "user-thought", "two-data-fields",
         "system-call", "hosted-tool", "schema-type", "temperature", "snake-case", "candidates", "enum-mime",
         "validated", "none-with-tools", "cached", "image-for-a-text-model", "not-an-image",
         "thought-not-a-flag", "names-not-strings", "ordering-not-names", "properties-not-an-object"],
)  # fmt: skip
async def test_400s_name_the_gemini_field_in_googles_shape(
    gateway: Gateway, backend: Any, body: dict[str, Any], field: str
) -> None:
    answer = await post(gateway.open(), body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT") and error["message"].startswith(field + ":")
    (violation,) = next(d for d in error["details"] if d["@type"].endswith("BadRequest"))["fieldViolations"]
    assert violation["field"] == field
    assert not backend.requests


def _raise(exc: Exception) -> Any:
    def reply(request: Any) -> str:
        raise exc

    return reply


@pytest.mark.parametrize(
    ("exc", "code", "status"),
    [
        (BackendThrottledError("busy", backend="scripted"), 429, "RESOURCE_EXHAUSTED"),
        (BackendError("the engine broke", backend="scripted"), 502, "INTERNAL"),
        (BackendConnectionError("refused", backend="scripted"), 503, "UNAVAILABLE"),
        (BackendTimeoutError("too slow", backend="scripted"), 504, "DEADLINE_EXCEEDED"),
        (RuntimeError("a bug"), 500, "INTERNAL"),
    ],
    ids=["429", "502", "503", "504", "500"],
)
async def test_engine_failures_are_googles_statuses(
    gateway: Gateway, backend: Any, exc: Exception, code: int, status: str
) -> None:
    backend.add(_raise(exc))
    with pytest.raises(errors.APIError) as caught:
        await client(gateway.open()).aio.models.generate_content(model="tito", contents="x")
    assert (caught.value.code, caught.value.status) == (code, status)


async def test_request_errors_are_googles_statuses(backend: Any, qwen3_tokenizer: Any) -> None:
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, max_body_bytes=4096)
    await gateway.start()
    try:
        rollout, finished = gateway.open(), gateway.open()
        await gateway.finish(finished.id)
        cases = [
            (await post(rollout, {"contents": [{"parts": [{"text": "x" * 10_000}]}]}), 413, "INVALID_ARGUMENT"),
            (await post(rollout, {"contents": [USER]}, key="wrong"), 401, "UNAUTHENTICATED"),
            (await post(finished, {"contents": [USER]}), 409, "ABORTED"),
        ]
        for answer, code, status in cases:
            error = answer.json()["error"]
            assert (answer.status_code, error["code"], error["status"]) == (code, code, status), error
        async with httpx.AsyncClient() as http:
            unknown = await http.post(f"{gateway.base_url}/rollouts/nope/v1beta/models/m:generateContent", json={},
                                      headers={"x-goog-api-key": rollout.token})  # fmt: skip
        assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    finally:
        await gateway.close()
    assert backend.requests == []


async def test_a_body_nested_too_deep_or_from_a_web_page_is_refused_in_googles_shape(
    gateway: Gateway, backend: Any
) -> None:
    rollout = gateway.open()
    url = f"{rollout.base_url.removesuffix('/v1')}/v1beta/models/tito:streamGenerateContent?alt=sse"
    deep = b'{"contents": ' + b"[" * 200 + b"]" * 200 + b"}"
    headers = {"x-goog-api-key": rollout.token, "Content-Type": "application/json"}
    async with httpx.AsyncClient() as http:
        nested = await http.post(url, content=deep, headers=headers)
        page = await http.post(url, json={"contents": [USER]}, headers={**headers, "Origin": "https://evil.example"})
    error = nested.json()["error"]
    assert (nested.status_code, error["status"]) == (400, "INVALID_ARGUMENT") and error["message"].startswith("body:")
    assert (page.status_code, page.json()["error"]["status"]) == (403, "PERMISSION_DENIED")
    assert not backend.requests

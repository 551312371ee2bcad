"""SGLang sessions offline: what a session call sends, fallback, mismatch and failure handling, model lifecycle."""

from __future__ import annotations

import asyncio
import json
import logging
from array import array
from typing import Any

import httpx
import pytest

from tito_core import TitoModel
from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import BackendError, BackendResponseError, ConfigError
from tito_core.plugins import get_backend
from tito_sglang import SGLangBackend, SGLangSessionError

IM_END = 151645


class SessionServer:
    """An httpx MockTransport handler speaking SGLang 0.5.23's session protocol.

    A session holds each request's prompt and output by rid; ``session_params.rid`` continues from one of them,
    then the ids sent are appended. The output is ``[7, 8, ..., IM_END]`` (``n_out`` ids); ``prompt_tokens``
    counts the prompt the engine ran on. ``sessions=False`` answers 404 on the session routes.
    """

    def __init__(self, *, sessions: bool = True, n_out: int = 3) -> None:
        self.sessions_enabled = sessions
        self.n_out = n_out
        self.sessions: dict[str, dict[str, list[int]]] = {}
        self.closed: list[str] = []
        self.requests: list[tuple[str, Any]] = []
        self.fail_next: httpx.Response | None = None
        self.prompt_tokens_delta = 0
        self.forget_opened = False  # open sessions without keeping them (a router sending them elsewhere)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.requests.append((path, body))
        if path in ("/open_session", "/close_session") and not self.sessions_enabled:
            return httpx.Response(404, json={"detail": "Not Found"})
        if path == "/open_session":
            if not self.forget_opened:
                self.sessions[body["session_id"]] = {}
            return httpx.Response(200, json=body["session_id"])
        if path == "/close_session":
            if self.sessions.pop(body["session_id"], None) is not None:
                self.closed.append(body["session_id"])
            return httpx.Response(200)
        if path == "/server_info":
            return httpx.Response(200, json={"context_length": 4096})
        if path == "/abort_request":
            return httpx.Response(200, json={})
        assert path == "/generate", path
        prompt = list(body["input_ids"])
        params = body.get("session_params")
        nodes: dict[str, list[int]] | None = None
        if params is not None:
            nodes = self.sessions.get(params["id"])
            if nodes is None:
                return httpx.Response(400, json={"error": {"message": "session id does not exist"}})
            if "rid" in params:
                if params["rid"] not in nodes:
                    return httpx.Response(400, json={"error": {"message": "Invalid request session id"}})
                prompt = nodes[params["rid"]] + prompt
            nodes[body["rid"]] = prompt
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            return failure
        output = [*range(7, 7 + self.n_out - 1), IM_END]
        if nodes is not None:
            nodes[body["rid"]] = prompt + output
        meta = {
            "id": body["rid"],
            "finish_reason": {"type": "stop", "matched": IM_END},
            "prompt_tokens": len(prompt) + self.prompt_tokens_delta,
            "cached_tokens": 0,
            "output_token_logprobs": [[-0.25, t, None] for t in output],
        }
        return httpx.Response(200, json={"text": "", "output_ids": output, "meta_info": meta})

    def bodies(self, path: str) -> list[Any]:
        return [body for p, body in self.requests if p == path]


def make_backend(server: SessionServer, **kwargs: Any) -> SGLangBackend:
    return SGLangBackend("http://sglang.test", transport=httpx.MockTransport(server), **kwargs)


def request(ids: list[int], prefix_len: int, rid: str, sequence: str | None = "seq-1") -> GenerateRequest:
    return GenerateRequest(
        rid=rid,
        input_ids=array("i", ids),
        prefix_len=prefix_len,
        sampling=SamplingParams(max_new_tokens=8),
        sequence=sequence,
    )


async def two_calls(backend: SGLangBackend) -> tuple[list[int], list[int]]:
    """A first call of 5 ids, then one that adds 2 new ids after the 3 generated: the ids of both prompts."""
    first = [1, 2, 3, 4, 5]
    out = (await backend.generate(request(first, 0, "r1"))).output_ids
    second = [*first, *out, 20, 21]
    await backend.generate(request(second, len(first) + len(out), "r2"))
    return first, second


# -- what a session call sends ---------------------------------------------------------------------


async def test_a_session_call_sends_only_the_new_ids_and_names_its_parent() -> None:
    server = SessionServer()
    backend = make_backend(server)
    first, second = await two_calls(backend)
    (opened,) = server.bodies("/open_session")
    session_id = opened["session_id"]
    assert opened["capacity_of_str_len"] > 0
    one, two = server.bodies("/generate")
    assert one["input_ids"] == first and one["session_params"] == {"id": session_id}
    assert two["input_ids"] == [20, 21] and two["session_params"] == {"id": session_id, "rid": "r1"}
    assert server.sessions[session_id]["r2"][: len(second)] == second  # the engine ran on the whole trajectory
    await backend.aclose()
    assert server.closed == [session_id] and server.sessions == {}


async def test_a_request_without_a_sequence_is_stateless() -> None:
    server = SessionServer()
    backend = make_backend(server, session="on")
    await backend.generate(request([1, 2, 3], 0, "r1", sequence=None))
    assert server.bodies("/open_session") == []
    assert "session_params" not in server.bodies("/generate")[0]


async def test_off_never_opens_a_session() -> None:
    server = SessionServer()
    backend = make_backend(server, session="off")
    await two_calls(backend)
    assert server.bodies("/open_session") == []
    assert [len(b["input_ids"]) for b in server.bodies("/generate")] == [5, 10]


async def test_each_sequence_gets_its_own_session() -> None:
    server = SessionServer()
    backend = make_backend(server)
    await backend.generate(request([1, 2], 0, "a1", sequence="a"))
    await backend.generate(request([3, 4], 0, "b1", sequence="b"))
    ids = [b["session_params"]["id"] for b in server.bodies("/generate")]
    assert len(set(ids)) == 2 and backend.sessions.open_count == 2


# -- mismatches and failures -----------------------------------------------------------------------


async def test_prompt_tokens_mismatch_fails_the_call_and_drops_the_session() -> None:
    server = SessionServer()
    backend = make_backend(server)
    first = [1, 2, 3, 4, 5]
    out = (await backend.generate(request(first, 0, "r1"))).output_ids
    server.prompt_tokens_delta = -1
    second = [*first, *out, 20]
    with pytest.raises(BackendResponseError) as caught:
        await backend.generate(request(second, 8, "r2"))
    assert caught.value.field == "meta_info.prompt_tokens"
    assert not server.closed  # the adapter never ends a sequence itself: the core does, once, after a failed call
    backend.end_sequence("seq-1")
    await asyncio.sleep(0)  # the close runs in the background
    assert len(server.closed) == 1
    server.prompt_tokens_delta = 0
    await backend.generate(request(second, 8, "r3"))
    third = server.bodies("/generate")[-1]
    assert third["input_ids"] == second and "rid" not in third["session_params"]
    assert third["session_params"]["id"] != server.closed[0]


async def test_prompt_tokens_mismatch_fails_a_stateless_call_too() -> None:
    server = SessionServer()
    server.prompt_tokens_delta = 1
    with pytest.raises(BackendResponseError, match="counted 4 prompt tokens, tito expected 3"):
        await make_backend(server, session="off").generate(request([1, 2, 3], 0, "r1"))


@pytest.mark.parametrize(
    "failure",
    [httpx.Response(500, text="boom"), httpx.Response(200, text="not json")],
    ids=["http-500", "malformed"],
)
async def test_a_failed_call_is_never_a_parent(failure: httpx.Response) -> None:
    server = SessionServer()
    backend = make_backend(server)
    first = [1, 2, 3, 4, 5]
    out = (await backend.generate(request(first, 0, "r1"))).output_ids
    second = [*first, *out, 20]
    server.fail_next = failure
    with pytest.raises(BackendError):
        await backend.generate(request(second, 8, "r2"))
    backend.end_sequence("seq-1")  # what the core does after a failed call (the next call also names a new sequence)
    await backend.generate(request(second, 8, "r3"))
    bodies = server.bodies("/generate")
    assert [b["session_params"].get("rid") for b in bodies] == [None, "r1", None]
    assert bodies[2]["input_ids"] == second
    assert bodies[2]["session_params"]["id"] != bodies[1]["session_params"]["id"]


async def test_a_prefix_the_session_does_not_hold_starts_a_new_session() -> None:
    server = SessionServer()
    backend = make_backend(server)
    await backend.generate(request([1, 2, 3], 0, "r1"))
    await backend.generate(request([1, 2, 3, 9, 9], 3, "r2"))  # the engine holds 6 tokens, not 3
    second = server.bodies("/generate")[1]
    assert second["input_ids"] == [1, 2, 3, 9, 9] and "rid" not in second["session_params"]


async def test_ignore_eos_with_stop_token_ids_does_not_continue_the_session() -> None:
    server = SessionServer()
    backend = make_backend(server)
    sampling = SamplingParams(max_new_tokens=8, ignore_eos=True, stop_token_ids=(IM_END,))
    req = GenerateRequest(rid="r1", input_ids=array("i", [1, 2]), prefix_len=0, sampling=sampling, sequence="s")
    await backend.generate(req)
    await asyncio.sleep(0)
    assert backend.sessions.open_count == 0 and len(server.closed) == 1


async def test_a_session_the_server_lost_costs_one_stateless_call(caplog: pytest.LogCaptureFixture) -> None:
    server = SessionServer()
    backend = make_backend(server, session="on")
    first = [1, 2, 3, 4, 5]
    out = (await backend.generate(request(first, 0, "r1"))).output_ids
    server.sessions.clear()  # the server restarted
    second = [*first, *out, 20]
    with caplog.at_level(logging.WARNING):
        result = await backend.generate(request(second, 8, "r2"))
    assert result.prompt_tokens == len(second)
    refused, resent = server.bodies("/generate")[1:]
    assert refused["session_params"]["rid"] == "r1" and refused["input_ids"] == [20]
    assert "session_params" not in resent  # the same request, whole, once: the engine generated nothing
    assert resent["rid"] == "r2" and resent["input_ids"] == second
    assert len([r for r in caplog.records if "no longer knows session" in r.getMessage()]) == 1
    third = [*second, *result.output_ids, 30]
    await backend.generate(request(third, len(second) + len(result.output_ids), "r3"))
    last = server.bodies("/generate")[-1]
    assert last["input_ids"] == third and "rid" not in last["session_params"]  # a new session, whole ids
    assert backend.sessions.supported is True


async def test_a_session_refused_on_its_first_request_turns_auto_stateless(caplog: pytest.LogCaptureFixture) -> None:
    server = SessionServer()
    server.forget_opened = True
    backend = make_backend(server)
    with caplog.at_level(logging.WARNING):
        await two_calls(backend)
    bodies = server.bodies("/generate")
    assert [("session_params" in b, len(b["input_ids"])) for b in bodies] == [(True, 5), (False, 5), (False, 10)]
    assert len(server.bodies("/open_session")) == 1 and backend.sessions.supported is False
    assert len([r for r in caplog.records if "cannot keep sessions" in r.getMessage()]) == 1


async def test_a_session_refused_on_its_first_request_is_an_error_with_on() -> None:
    server = SessionServer()
    server.forget_opened = True
    with pytest.raises(SGLangSessionError, match="refused on its first request"):
        await make_backend(server, session="on").generate(request([1, 2], 0, "r1"))
    assert len(server.bodies("/generate")) == 1


# -- support detection -----------------------------------------------------------------------------


async def test_auto_falls_back_to_stateless_once_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    server = SessionServer(sessions=False)
    backend = make_backend(server)
    with caplog.at_level(logging.WARNING):
        await two_calls(backend)
        await backend.generate(request([1], 0, "other", sequence="seq-2"))
    assert len(server.bodies("/open_session")) == 1
    assert [len(b["input_ids"]) for b in server.bodies("/generate")] == [5, 10, 1]
    assert all("session_params" not in b for b in server.bodies("/generate"))
    assert len([r for r in caplog.records if "cannot keep sessions" in r.getMessage()]) == 1
    assert backend.sessions.supported is False


async def test_on_raises_a_typed_error_when_the_server_has_no_sessions() -> None:
    server = SessionServer(sessions=False)
    backend = make_backend(server, session="on")
    with pytest.raises(SGLangSessionError, match="has no session API") as caught:
        await backend.generate(request([1, 2], 0, "r1"))
    assert caught.value.status == 404
    assert server.bodies("/generate") == []


def test_session_option_is_checked_and_reaches_the_backend_from_config(tmp_path: Any) -> None:
    from tito_core.config import load_config

    path = tmp_path / "tito.toml"
    path.write_text('backend = "sglang"\nbackend_options = { base_url = "http://sglang.test", session = "on" }\n')
    assert load_config(path).create_backend().sessions.mode == "on"  # type: ignore[attr-defined]
    backend = get_backend("sglang", base_url="http://sglang.test", session="off")
    assert backend.sessions.mode == "off"  # type: ignore[attr-defined]
    assert SGLangBackend("http://sglang.test").sessions.mode == "auto"
    with pytest.raises(ConfigError, match="session must be 'auto', 'on' or 'off'"):
        get_backend("sglang", base_url="http://sglang.test", session="yes")


# -- the model's lifecycle: one session per branch -------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"text": text}]}


async def call(model: TitoModel, messages: list[dict[str, Any]]) -> None:
    """One model call; appends the assistant message Strands would append."""
    events = [e async for e in model.stream(messages)]  # type: ignore[arg-type]
    text = "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)
    messages.append({"role": "assistant", "content": [{"text": text}]})


async def test_model_keeps_one_session_per_branch_and_closes_it_on_reset(qwen3_tokenizer: Any) -> None:
    server = SessionServer()
    backend = make_backend(server)
    model = TitoModel(backend, qwen3_tokenizer, sampling={"max_new_tokens": 8})
    messages = [user("one")]
    await call(model, messages)
    messages.append(user("two"))
    await call(model, messages)
    one, two = server.bodies("/generate")
    assert two["session_params"] == {"id": one["session_params"]["id"], "rid": one["rid"]}
    traj = model.trajectory
    assert len(two["input_ids"]) == traj.turns[1].prompt_len < len(traj) // 2  # only the new prompt + boundary
    assert one["input_ids"] + [*range(7, 9), IM_END] + two["input_ids"] == traj.token_ids[: traj.turns[1].output_start]

    # a rewritten history forks: the new branch opens its own session, the old branch keeps its own (it may go on)
    await call(model, [user("something else")])
    await asyncio.sleep(0)
    three = server.bodies("/generate")[2]
    assert server.closed == [] and three["session_params"]["id"] != one["session_params"]["id"]
    assert model.trajectory.branch == 1 and "rid" not in three["session_params"]

    # the first history goes on: on its branch, in its session, sending only its new ids
    messages.append(user("three"))
    await call(model, messages)
    four = server.bodies("/generate")[3]
    assert four["session_params"] == {"id": one["session_params"]["id"], "rid": two["rid"]}
    assert model.trajectory.branch == 0 and len(four["input_ids"]) == model.trajectory.turns[2].prompt_len

    model.reset()
    await asyncio.sleep(0)
    assert sorted(server.closed) == sorted([one["session_params"]["id"], three["session_params"]["id"]])
    assert server.sessions == {}


def test_reset_outside_an_event_loop_closes_on_the_next_call(qwen3_tokenizer: Any) -> None:
    server = SessionServer()
    backend = make_backend(server)
    model = TitoModel(backend, qwen3_tokenizer, sampling={"max_new_tokens": 8})
    asyncio.run(call(model, [user("one")]))
    model.reset()  # no loop running: the close waits
    assert server.closed == [] and backend.sessions.open_count == 0

    async def later() -> None:
        await call(model, [user("two")])
        await backend.aclose()

    asyncio.run(later())
    assert len(server.closed) == 2 and server.sessions == {}


def test_sessions_still_held_at_exit_are_closed() -> None:
    import http.server
    import threading
    import weakref

    from tito_sglang._sessions import Session, _close_at_exit

    closed: list[Any] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            closed.append((self.path, json.loads(body), self.headers["authorization"]))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        backend = SGLangBackend(f"http://127.0.0.1:{server.server_port}", api_key="k")
        backend.sessions._open["seq"] = Session("tito-held")
        backend.sessions._to_close.append("tito-ended")
        _close_at_exit(weakref.ref(backend.sessions))  # what atexit runs
    finally:
        server.shutdown()
        thread.join()
    assert sorted(closed, key=lambda c: c[1]["session_id"]) == [
        ("/close_session", {"session_id": "tito-ended"}, "Bearer k"),
        ("/close_session", {"session_id": "tito-held"}, "Bearer k"),
    ]
    assert backend.sessions.open_count == 0


def test_a_close_cut_short_by_its_loop_ending_is_done_later(monkeypatch: pytest.MonkeyPatch) -> None:
    server = SessionServer()
    backend = make_backend(server)
    close = backend.sessions._close

    async def slow_close(session_id: str) -> None:
        await asyncio.sleep(30)  # still closing when asyncio.run ends the loop (and cancels it)

    async def call_then_end() -> None:
        await backend.generate(request([1, 2], 0, "r1"))
        backend.end_sequence("seq-1")
        await asyncio.sleep(0)

    monkeypatch.setattr(backend.sessions, "_close", slow_close)
    asyncio.run(call_then_end())
    assert server.closed == [] and len(backend.sessions._to_close) == 1
    monkeypatch.setattr(backend.sessions, "_close", close)
    asyncio.run(backend.aclose())
    assert len(server.closed) == 1 and server.sessions == {}

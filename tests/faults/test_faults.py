"""The fault suite: each fault a real server (or proxy) can produce, against each adapter, with its outcome.

Each test drives a real Strands agent with a TitoModel over real sockets against :class:`FaultServer`,
asserts the outcome the error contract promises (which error the agent call raises, or that it succeeds
after a retry; the trajectory's status and reason), then :meth:`Harness.check`: status set, every
recorded output exactly the server's answer for its rid, no rid generated twice, nothing recorded that
the engine did not produce. ``docs/reliability.md`` lists every scenario with its test.

Generation requests are numbered from 0 in arrival order (``gen``); with the default script a rollout
is two model calls: gen 0 answers a tool call, gen 1 the final answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from strands import tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.hooks import AfterModelCallEvent
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

from tito_core.errors import (
    BackendConnectionError,
    BackendError,
    BackendResponseError,
    BackendThrottledError,
    BackendTimeoutError,
    ContextLengthError,
    ResponseTooLargeError,
    TitoError,
)
from tito_core.http import RetryPolicy

from .conftest import RETRY, Harness, StallTimeout, all_branches, check_trajectory, slow_add
from .server import BAD_FIELDS, Fault, FaultServer, from_gen, on_path

GENERATE_PATH = {"sglang": "/generate", "vllm": "/inference/v1/generate"}


def recorded_rids(h: Harness, outcome) -> set[str]:
    return {turn.rid for branch in all_branches(outcome.traj) for turn in branch.turns}


def assert_failed(outcome, kind: type[BaseException]) -> BaseException:
    """The call raised ``kind``; the rollout is ``failed`` with the error named in the reason."""
    error = outcome.raised(kind)
    traj = outcome.traj
    assert traj.status == "failed", f"status {traj.status!r} ({traj.status_reason}) after {error!r}"
    assert type(error).__name__ in (traj.status_reason or ""), traj.status_reason
    return error


def gen_after(h: Harness, index: int) -> list:
    """Generation requests received after generation request ``index``."""
    return [r for r in h.server.gen_requests() if r.gen is not None and r.gen > index]


# ------------------------------------------------------------------------------------------ baseline


async def test_clean_rollout_completes(h: Harness) -> None:
    outcome = await h.rollout()
    assert outcome.error is None, outcome.error
    assert outcome.traj.status == "completed"
    assert [t.stop_reason for t in outcome.traj.turns] == ["tool_use", "end_turn"]
    assert len(h.server.gen_requests()) == 2
    h.check(outcome)


# ------------------------------------------------------------------------------------------ statuses


@pytest.mark.parametrize("status", [500, 502])
async def test_server_error_fails_without_retry(h: Harness, status: int) -> None:
    h.server.inject(Fault.http_status(status), when=1)
    outcome = await h.rollout()
    error = assert_failed(outcome, BackendError)
    assert isinstance(error, BackendError) and error.status == status
    assert not isinstance(error, BackendThrottledError | BackendResponseError)
    assert gen_after(h, 1) == [], "a 5xx other than 503 must not be retried"
    assert len(outcome.traj.turns) == 1
    h.check(outcome)


@pytest.mark.parametrize("status", [503, 429])
async def test_throttled_once_is_retried_with_the_same_rid(h: Harness, status: int) -> None:
    h.server.inject(Fault.http_status(status), when=1)
    outcome = await h.rollout()
    assert outcome.error is None, outcome.error
    assert outcome.traj.status == "completed"
    refused, retried = h.server.gen_requests()[1:3]
    assert refused.rid == retried.rid and refused.status == status and retried.generated
    assert outcome.traj.turns[1].rid == retried.rid
    h.check(outcome)


async def test_429_retry_after_is_honoured(h: Harness) -> None:
    h.server.inject(Fault.http_status(429, retry_after="0.3"), when=1)
    outcome = await h.rollout()
    assert outcome.error is None, outcome.error
    refused, retried = h.server.gen_requests()[1:3]
    assert refused.rid == retried.rid
    assert retried.time - refused.time >= 0.28, "Retry-After: 0.3 was not waited for"
    h.check(outcome)


@pytest.mark.parametrize("status", [503, 429])
async def test_persistent_throttling_raises_after_bounded_attempts(h: Harness, status: int) -> None:
    h.server.inject(Fault.http_status(status), when=from_gen(1), times=-1)
    outcome = await h.rollout()
    error = assert_failed(outcome, BackendThrottledError)
    assert isinstance(error, BackendThrottledError) and error.status == status
    attempts = h.server.gen_requests()[1:]
    # tito's bounded retries, not multiplied by Strands' ModelRetryStrategy
    assert len(attempts) == RETRY.max_attempts
    assert len({r.rid for r in attempts}) == 1 and not any(r.generated for r in attempts)
    h.check(outcome)


# ------------------------------------------------------------------------------------------ refusal


async def test_refused_from_the_start_fails(h: Harness) -> None:
    await h.server.stop()  # nothing listens on the port any more
    outcome = await h.rollout()
    assert_failed(outcome, BackendConnectionError)
    assert outcome.elapsed < 10
    h.check(outcome)


async def test_refused_briefly_is_retried(h: Harness) -> None:
    h.server.inject(Fault.refuse_after(0.15), when=0)
    patient = RetryPolicy(max_attempts=12, initial_delay=0.05, max_delay=0.1, max_total=5.0, jitter=0.0)
    outcome = await h.rollout(backend=h.backend(retry=patient))
    assert outcome.error is None, outcome.error
    assert outcome.traj.status == "completed"
    assert len(h.server.gen_requests()) == 2
    h.check(outcome)


async def test_refused_for_good_fails_after_retries(h: Harness) -> None:
    h.server.inject(Fault.refuse_after(None), when=0)
    outcome = await h.rollout()
    assert_failed(outcome, BackendConnectionError)
    assert len(outcome.traj.turns) == 1
    h.check(outcome)


# ------------------------------------------------------------------------------------------ resets


async def test_reset_before_the_request_is_read_is_not_resent(h: Harness) -> None:
    h.server.inject(Fault.reset(after_read=False), when=1)
    outcome = await h.rollout()
    assert_failed(outcome, BackendConnectionError)
    resets = [r for r in h.server.received if r.fault == "reset-before_read"]
    assert len(resets) == 1
    # the POST may have reached the engine: never sent again
    assert [r for r in h.server.gen_requests() if r.time > resets[0].time] == []
    h.check(outcome)


@pytest.mark.parametrize("delay", [0.0, 0.3], ids=["immediately", "after-delay"])
async def test_reset_after_the_request_was_read_is_not_resent(h: Harness, delay: float) -> None:
    h.server.inject(Fault.reset(after_read=True, delay=delay), when=1)
    outcome = await h.rollout()
    assert_failed(outcome, BackendConnectionError)
    lost = h.server.gen_requests()[1]
    assert gen_after(h, 1) == [], "a request that reached the engine was sent again"
    assert lost.rid not in recorded_rids(h, outcome)
    if h.adapter == "sglang":
        assert await h.wait_for(lambda: lost.rid in h.server.aborts), "the lost request was not aborted"
    h.check(outcome)


# ------------------------------------------------------------------------------------------ timeouts


async def test_read_timeout_aborts_the_request(h: Harness) -> None:
    backend = h.backend()
    stall = StallTimeout(backend, 0.2)  # the hung call's timeout; the first call and the abort keep the backend's
    h.server.inject(Fault.hang(), when=1, then=stall.restore)
    outcome = await h.rollout(backend=backend, callbacks=[(AfterModelCallEvent, stall.after_call)])
    assert_failed(outcome, BackendTimeoutError)
    hung = h.server.gen_requests()[1]
    assert gen_after(h, 1) == []
    if h.adapter == "sglang":
        assert await h.wait_for(lambda: hung.rid in h.server.aborts), "no /abort_request for the timed-out rid"
    else:
        assert await h.wait_for(lambda: hung.client_closed), "the client kept the timed-out request open"
    h.check(outcome)


async def test_cancellation_aborts_the_request(h: Harness) -> None:
    h.server.inject(Fault.hang(), when=1)
    model = h.model()
    task = asyncio.ensure_future(h.rollout(model=model))
    assert await h.wait_for(lambda: len(h.server.gen_requests()) == 2), "the second call never arrived"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    hung = h.server.gen_requests()[1]
    if h.adapter == "sglang":
        assert await h.wait_for(lambda: hung.rid in h.server.aborts), "no /abort_request after cancellation"
    else:
        assert await h.wait_for(lambda: hung.client_closed), "the connection stayed open after cancellation"
    assert model.trajectory.status == "aborted", model.trajectory.status
    assert model.trajectory.status_reason
    h.check(model)


# ------------------------------------------------------------------------------------------ framing


async def test_body_cut_short_is_a_connection_error(h: Harness) -> None:
    h.server.inject(Fault.cut(framing="length"), when=1)
    outcome = await h.rollout()
    assert_failed(outcome, BackendConnectionError)
    cut = h.server.gen_requests()[1]
    assert gen_after(h, 1) == []
    assert cut.rid not in recorded_rids(h, outcome)
    if h.adapter == "sglang":
        assert await h.wait_for(lambda: cut.rid in h.server.aborts)
    h.check(outcome)


async def test_close_delimited_body_cut_mid_json_is_refused(h: Harness) -> None:
    h.server.inject(Fault.cut(framing="eof"), when=1)
    outcome = await h.rollout()
    assert_failed(outcome, BackendResponseError)
    assert gen_after(h, 1) == []
    assert h.server.gen_requests()[1].rid not in recorded_rids(h, outcome)
    h.check(outcome)


async def test_extra_bytes_after_a_response_are_never_read_as_the_next_answer(h: Harness) -> None:
    h.server.inject(Fault.extra_bytes(), when=0)
    outcome = await h.rollout()
    assert outcome.error is None, outcome.error
    assert outcome.traj.status == "completed"
    assert len(h.server.gen_requests()) == 2, "the next request never reached the server"
    h.check(outcome)


async def test_extra_bytes_on_an_idle_keep_alive_connection_are_never_read(h: Harness) -> None:
    idle = asyncio.Event()

    @tool(name="add")
    async def add_while_forged(a: int, b: int) -> int:
        """Add two integers once the server has forged bytes onto the idle connection."""
        idle.set()  # the answer was read whole (the tool runs): the connection sits idle in the pool
        assert await h.wait_for(lambda: bool(h.server.late_forgeries)), "the forged bytes were never written"
        return a + b

    h.server.inject(Fault.extra_bytes(until=idle), when=0)
    outcome = await h.rollout(tools=(add_while_forged,))
    assert h.server.late_forgeries == [True], "the forged bytes did not land on an idle connection"
    assert outcome.error is None, outcome.error
    assert outcome.traj.status == "completed"
    assert len(h.server.gen_requests()) == 2, "the next request never reached the server"
    h.check(outcome)


@pytest.mark.parametrize("mode", ["conflict", "negative"])
async def test_bad_content_length_is_a_framing_error(h: Harness, mode: str) -> None:
    h.server.inject(Fault.content_length(mode), when=1)
    outcome = await h.rollout()
    error = assert_failed(outcome, BackendResponseError)
    assert isinstance(error, BackendResponseError) and error.field == "http", error.field
    assert gen_after(h, 1) == []
    h.check(outcome)


async def test_oversized_body_is_refused_without_reading_it_all(h: Harness) -> None:
    h.server.inject(Fault.oversize(16 << 20), when=1)
    outcome = await h.rollout()
    assert_failed(outcome, ResponseTooLargeError)
    assert gen_after(h, 1) == []
    h.check(outcome)


# ------------------------------------------------------------------------------------------ bad fields


@pytest.mark.parametrize("mode", sorted(set(BAD_FIELDS) - {"finish_abort"}))
async def test_bad_field_is_refused_and_not_recorded(h: Harness, mode: str) -> None:
    kwargs: dict[str, object] = {}
    if mode == "prompt_echo":
        # SGLang echoes the prompt in input_token_logprobs; vLLM's generate endpoint on request.
        if h.adapter == "sglang":
            kwargs["return_prompt_logprobs"] = True
        else:
            kwargs["backend"] = h.backend(return_prompt_ids=True)
    h.server.inject(Fault.bad(mode), when=1)
    outcome = await h.rollout(**kwargs)
    error = assert_failed(outcome, BackendResponseError)
    assert isinstance(error, BackendResponseError) and error.field, f"the error names no field: {error!r}"
    if mode == "wrong_id":
        assert error.field in ("meta_info.id", "request_id", "id"), error.field
    bad = h.server.gen_requests()[1]
    assert bad.rid not in recorded_rids(h, outcome), "a refused answer was recorded"
    assert len(outcome.traj.turns) == 1
    assert gen_after(h, 1) == []
    h.check(outcome)


async def test_engine_abort_finish_marks_aborted(h: Harness) -> None:
    h.server.inject(Fault.bad("finish_abort"), when=0)  # the answer holds a complete tool call
    outcome = await h.rollout()
    outcome.raised(BackendError)
    assert outcome.traj.status == "aborted", (outcome.traj.status, outcome.traj.status_reason)
    assert outcome.traj.status_reason
    assert len(h.server.gen_requests()) == 1, "the tool call of an aborted generation was run"
    h.check(outcome)


async def test_vllm_completions_prompt_echo_mismatch(server: FaultServer, qwen3_tokenizer: Any) -> None:
    h = Harness(server, qwen3_tokenizer, "vllm")  # /v1/completions is vLLM's
    backend = h.backend(endpoint="completions")
    h.server.inject(Fault.bad("prompt_echo"), when=1)
    outcome = await h.rollout(backend=backend)
    error = assert_failed(outcome, BackendResponseError)
    assert isinstance(error, BackendResponseError) and error.field
    assert [r.path for r in h.server.gen_requests()] == ["/v1/completions"] * 2
    assert len(outcome.traj.turns) == 1
    h.check(outcome)
    await backend.aclose()


# ------------------------------------------------------------------------------------------ limits


async def test_length_finish_truncates_and_keeps_the_tokens(h: Harness) -> None:
    outcome = await h.rollout(sampling={"max_new_tokens": 5})
    outcome.raised(MaxTokensReachedException)
    traj = outcome.traj
    assert traj.status == "truncated" and traj.status_reason
    assert [t.output_len for t in traj.turns] == [5] and traj.turns[0].finish_reason == "length"
    h.check(outcome)


async def test_context_length_error_truncates(h: Harness) -> None:
    h.server.inject(Fault.context_length(), when=1)
    outcome = await h.rollout()
    error = outcome.raised(ContextWindowOverflowException)
    assert isinstance(error, ContextLengthError)
    assert outcome.traj.status == "truncated" and outcome.traj.status_reason
    assert gen_after(h, 1) == []
    h.check(outcome)


async def test_context_length_lookup_is_retried_after_a_failure(h: Harness) -> None:
    info = "/server_info" if h.adapter == "sglang" else "/v1/models"
    h.server.inject(Fault.http_status(500), when=on_path(info))
    outcome = await h.rollout(sampling={})  # no max_new_tokens: the room left in the context is asked for
    assert outcome.error is None, outcome.error
    second = h.server.gen_requests()[1]
    room = h.server.context_length - len(second.input_ids or [])
    assert second.max_new_tokens == room, "the context length was not looked up again after one failure"
    h.check(outcome)


# ------------------------------------------------------------------------------------------ kill / restart


async def test_server_killed_mid_request_and_restarted(h: Harness) -> None:
    h.server.inject(Fault.kill(restart_after=0.2), when=1)
    backend = h.backend()
    outcome = await h.rollout(backend=backend)
    assert_failed(outcome, BackendConnectionError)
    killed = h.server.gen_requests()[1]
    assert killed.rid not in recorded_rids(h, outcome)
    h.check(outcome)
    assert await h.wait_for(lambda: h.server.listening), "the server did not come back"
    # the same backend (its pool) serves the next rollout on the restarted server
    again = await h.rollout(backend=backend)
    assert again.error is None, again.error
    assert again.traj.status == "completed"
    assert sum(1 for r in h.server.gen_requests() if r.rid == killed.rid) == 1, "the killed request was re-sent"
    h.check(again)


async def test_server_killed_between_turns_and_restarted(h: Harness) -> None:
    # killed 50 ms after answering gen 0, while the tool runs (0.3 s) and the connection sits idle in the
    # pool; back 0.5 s later: the next call finds the server down, is refused, retried, and goes through
    h.server.inject(Fault.kill_after_answer(restart_after=0.5), when=0)
    patient = RetryPolicy(max_attempts=20, initial_delay=0.05, max_delay=0.1, max_total=5.0, jitter=0.0)
    outcome = await h.rollout(backend=h.backend(retry=patient), tools=(slow_add,))
    assert outcome.error is None, outcome.error
    assert outcome.traj.status == "completed"
    assert len(h.server.gen_requests()) == 2
    h.check(outcome)


# ------------------------------------------------------------------------------------------ history rewrites


async def test_sliding_window_trim_mid_rollout_forks(h: Harness) -> None:
    h.server.tool_turns = 4
    manager = SlidingWindowConversationManager(window_size=4, should_truncate_results=False, per_turn=True)
    outcome = await h.rollout(manager=manager)
    assert outcome.error is None, outcome.error
    traj = outcome.traj
    assert traj.status == "completed"
    assert traj.branch >= 1, "the trimmed history did not fork the rollout"
    assert {b.rollout_id for b in all_branches(traj)} == {traj.rollout_id}
    assert not any(b.closed for b in traj.branches)  # a lineage the window left behind stays open
    h.check(outcome)
    assert outcome.model.reset() is traj and all(b.closed for b in all_branches(traj))
    check_trajectory(h.server, traj)


async def test_context_overflow_with_sliding_window_retries_on_a_new_branch(h: Harness) -> None:
    h.server.tool_turns = 3
    h.server.inject(Fault.context_length(), when=2)
    manager = SlidingWindowConversationManager(window_size=40, should_truncate_results=False)
    outcome = await h.rollout(manager=manager)
    assert outcome.error is None, outcome.error
    traj = outcome.traj
    assert traj.status == "completed"
    assert traj.branch >= 1
    assert traj.branches[-1].status == "truncated", traj.branches[-1].status
    h.check(outcome)


async def test_after_model_call_retry_aborts_the_old_branch(h: Harness) -> None:
    retried: list[str] = []

    def retry_once(event: AfterModelCallEvent) -> None:
        if not retried and event.stop_response is not None:
            retried.append("yes")
            event.retry = True

    outcome = await h.rollout(callbacks=[(AfterModelCallEvent, retry_once)])
    assert outcome.error is None, outcome.error
    traj = outcome.traj
    assert retried and traj.status == "completed"
    assert traj.branch == 1 and traj.branches[0].status == "aborted"
    assert traj.branches[0].status_reason
    discarded = traj.branches[0].turns[-1].rid
    assert discarded not in {t.rid for t in traj.turns}, "the discarded output is in the live branch"
    assert len(h.server.gen_requests()) == 3  # the discarded call, its retry (a new rid), the final answer
    h.check(outcome)


async def test_after_model_call_retry_after_a_server_error(h: Harness) -> None:
    retried: list[str] = []

    def retry_errors(event: AfterModelCallEvent) -> None:
        if not retried and isinstance(event.exception, TitoError):
            retried.append("yes")
            event.retry = True

    h.server.inject(Fault.http_status(500), when=1)
    outcome = await h.rollout(callbacks=[(AfterModelCallEvent, retry_errors)])
    assert outcome.error is None, outcome.error
    assert retried and outcome.traj.status == "completed"
    failed, retry = h.server.gen_requests()[1:3]
    assert failed.rid != retry.rid  # a new model call: a new request id
    assert failed.rid not in recorded_rids(h, outcome)
    assert retry.input_ids == failed.input_ids
    h.check(outcome)


# ------------------------------------------------------------------------------------------ outside the backend


@tool(name="add")
def add_surrogate(a: int, b: int) -> str:
    """Add two integers (returns text with a lone surrogate)."""
    return f"{a + b} \ud800"


async def test_unencodable_tool_result_fails_with_a_status(h: Harness) -> None:
    outcome = await h.rollout(tools=(add_surrogate,))
    assert outcome.error is not None, "a tool result that cannot be encoded was accepted"
    assert outcome.traj.status == "failed" and outcome.traj.status_reason
    assert len(h.server.gen_requests()) == 1, "a prompt that could not be encoded was sent"
    h.check(outcome)


# ------------------------------------------------------------------------------------------ SGLang sessions

SESSION_FAULTS = {
    "http-500": Fault.http_status(500),
    "reset-after-read": Fault.reset(after_read=True),
    "hang": Fault.hang(),
    "cut": Fault.cut(),
    "bad-logprob": Fault.bad("logprob_positive"),
    "bad-prompt-tokens": Fault.bad("prompt_tokens"),
}


@pytest.mark.parametrize("fault", sorted(SESSION_FAULTS))
async def test_session_never_continues_from_a_request_lost_to_a_fault(
    server: FaultServer, qwen3_tokenizer: Any, fault: str
) -> None:
    """gen 0 opens a session with every id; gen 1 continues it with the new ids only and fails; Strands retries
    the call: gen 2 must open a new session and send every id again, never naming gen 1 (or gen 0) as parent."""
    h = Harness(server, qwen3_tokenizer, "sglang")
    retried: list[str] = []

    def retry_errors(event: AfterModelCallEvent) -> None:
        if not retried and isinstance(event.exception, TitoError):
            retried.append("yes")
            event.retry = True

    backend = h.backend(session="on")
    stall = StallTimeout(backend, 0.2)  # ends a hang; the other calls (the retry, the closes) keep the backend's
    h.server.inject(SESSION_FAULTS[fault], when=1, then=stall.restore)
    try:
        callbacks = [(AfterModelCallEvent, stall.after_call), (AfterModelCallEvent, retry_errors)]
        outcome = await h.rollout(backend=backend, callbacks=callbacks)
        assert outcome.error is None, outcome.error
        assert retried and outcome.traj.status == "completed"
        first, failed, retry = h.server.gen_requests()[:3]
        assert first.session is not None and first.parent is None and first.sent_ids == len(first.input_ids or [])
        assert failed.session == first.session and failed.parent == first.rid
        assert failed.sent_ids is not None and failed.sent_ids < len(failed.input_ids or []) // 2, (
            "sent the whole prompt"
        )
        assert retry.session not in (None, first.session), "the retry continued the failed session"
        assert retry.parent is None and retry.sent_ids == len(retry.input_ids or []), "the retry sent only new ids"
        assert retry.input_ids == failed.input_ids
        assert first.session in h.server.sessions_closed, "the failed call's session was not closed"
        assert failed.rid not in recorded_rids(h, outcome)
        h.check(outcome)
    finally:
        await backend.aclose()
    assert h.server.sessions == {}, "aclose left sessions open"


async def test_session_auto_falls_back_when_the_server_has_no_sessions(
    qwen3_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    srv = await FaultServer(qwen3_tokenizer, sessions=False).start()
    h = Harness(srv, qwen3_tokenizer, "sglang")
    try:
        backend = h.backend()  # session="auto"
        for _ in range(2):
            outcome = await h.rollout(backend=backend)
            assert outcome.error is None, outcome.error
            h.check(outcome)
        opens = [r for r in srv.received if r.path == "/open_session"]
        assert len(opens) == 1, "session support was probed more than once"
        assert all(r.sent_ids == len(r.input_ids or []) for r in srv.gen_requests())
        warnings = [r for r in caplog.records if "cannot keep sessions" in r.getMessage()]
        assert len(warnings) == 1
        await backend.aclose()
    finally:
        await srv.aclose()


async def test_session_lost_by_the_server_costs_one_whole_call(server: FaultServer, qwen3_tokenizer: Any) -> None:
    """The server forgets every session between two calls (a restart): the second call is refused with a 400
    before anything is generated, sent once more whole without a session (same rid), and the rollout completes."""
    h = Harness(server, qwen3_tokenizer, "sglang")

    @tool(name="add")
    def add_and_forget(a: int, b: int) -> int:
        """Add two integers (the server forgets its sessions meanwhile)."""
        server.sessions.clear()
        return a + b

    backend = h.backend(session="on")
    try:
        outcome = await h.rollout(backend=backend, tools=(add_and_forget,))
        assert outcome.error is None, outcome.error
        assert outcome.traj.status == "completed"
        requests = [r for r in server.received if r.path == "/generate"]
        assert [(r.status, r.generated, r.parent is not None) for r in requests] == [
            (200, True, False),
            (400, False, True),
            (200, True, False),
        ]
        assert requests[1].rid == requests[2].rid and requests[2].session is None
        assert requests[2].sent_ids == len(requests[2].input_ids or [])
        h.check(outcome)
    finally:
        await backend.aclose()

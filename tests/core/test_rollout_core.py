"""The rollout core's parts, each driven alone: status, conversation sync, the ids JSON, the backend sequence,
and the call loop on tito's own conversation form (no Strands)."""

from __future__ import annotations

import asyncio
from array import array

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.conversation import Conversation, canonical, reply_message
from tito_core.errors import (
    BackendError,
    ContextLengthError,
    ContextWindowFullError,
    GenerationAbortedError,
    LoopLimitError,
    TrajectoryError,
)
from tito_core.http.ids_json import IdsJson
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.rollout_core.sequence import SequenceTracker
from tito_core.rollout_core.sync import ConversationSync
from tito_core.status import CallEnd, Closed, RewardFailed, RolloutTimedOut, status_of
from tito_core.trajectory import Trajectory
from tito_testing.scripted import ScriptedBackend

from .helpers import hermes_call

ADD_SPEC = {
    "name": "add",
    "description": "Add two integers.",
    "inputSchema": {"json": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}},
}


# ------------------------------------------------------------------------------------------------ status
@pytest.mark.parametrize(
    ("outcome", "status", "reason"),
    [
        (CallEnd("length", 0, 7), "truncated", "generation hit the token limit after 7 tokens"),
        (CallEnd("stop", 2, 7), "running", None),
        (CallEnd("stop", 0, 7), "completed", None),
        (Closed("running"), "aborted", "closed while the agent loop was still running"),
        (Closed("completed"), "completed", None),
        (RolloutTimedOut(0.5), "aborted", "timed out after 0.5 s"),
        (RewardFailed(ZeroDivisionError("boom")), "failed", "reward function raised ZeroDivisionError: boom"),
        (ContextWindowFullError("full"), "truncated", "ContextWindowFullError: full"),
        (ContextLengthError("long"), "truncated", "ContextLengthError: long"),
        (LoopLimitError("max_model_calls (3) reached"), "truncated", "max_model_calls (3) reached"),
        (asyncio.CancelledError(), "aborted", "the model call was cancelled"),
        (GenerationAbortedError("cut"), "aborted", "cut"),
        (BackendError("down"), "failed", "BackendError: down"),
        (KeyboardInterrupt(), "aborted", "the model call was interrupted (KeyboardInterrupt)"),
    ],
)
def test_status_of_decides_every_way_a_rollout_ends(outcome, status, reason) -> None:
    assert status_of(outcome) == (status, reason)


def test_close_and_amend_use_the_same_rules() -> None:
    traj = Trajectory("r")
    assert traj.close().status == "aborted" and traj.status_reason == status_of(Closed("running"))[1]
    traj.amend_status(*status_of(RewardFailed(ValueError("x"))))
    assert (traj.status, traj.status_reason) == ("failed", "reward function raised ValueError: x")
    with pytest.raises(TrajectoryError, match="closed trajectories"):
        Trajectory("s").amend_status("failed")


# ------------------------------------------------------------------------------------------ conversation sync
def _recorded(sync: ConversationSync, conversation: Conversation, prompt: list[int], output: list[int], reply):
    """Record one call the way the call loop does: plan, append prompt + output, consume, expect the reply."""
    plan = sync.plan(conversation, None)
    traj = sync.trajectory
    traj.append("prompt", prompt, None, turn=len(traj.turns))
    end = len(traj)
    traj.append("output", output, [-0.5] * len(output), turn=len(traj.turns))
    sync.consumed(plan, conversation, end)
    sync.expect(reply)
    return plan


def test_sync_extends_when_the_reply_comes_back_and_forks_once_when_it_does_not() -> None:
    sync = ConversationSync(Trajectory("r"))
    user = {"role": "user", "content": "2+2?"}
    reply = reply_message("", None, [("c1", "add", {"a": 2, "b": 2})])
    first = Conversation(messages=[user], system="be brief")
    plan = _recorded(sync, first, [1, 2, 3], [4, 5], reply)
    assert plan.initial and plan.chat[0] == {"role": "system", "content": "be brief"}

    tool = {"role": "tool", "tool_call_id": "c1", "content": "4"}
    # the reply came back (keys in another order are the same message): only the tool result is new
    back = {"tool_calls": reply["tool_calls"], "content": "", "role": "assistant"}
    plan = sync.plan(Conversation(messages=[user, back, tool], system="be brief"), None)
    assert not plan.initial and plan.count == 2 and plan.chat == [tool]
    assert sync.trajectory.branch == 0

    # a rewritten tool result forks once, keeping the tokens up to the output before it
    sync.consumed(plan, Conversation(messages=[user, back, tool], system="be brief"), len(sync.trajectory) + 2)
    sync.trajectory.append("prompt", [6, 7], None, turn=1)
    sync.trajectory.append("output", [8], [-0.1], turn=1)
    sync.expect(reply_message("4", None, []))
    edited = {**tool, "content": "5"}
    plan = sync.plan(Conversation(messages=[user, back, edited], system="be brief"), None)
    traj = sync.trajectory
    assert traj.branch == 1 and traj.fork_at == 5 and traj.token_ids == [1, 2, 3, 4, 5]
    assert not plan.initial and plan.count == 2 and plan.chat == [edited]
    assert "rewritten at message 2" in (traj.fork_reason or "")

    # an edited reply before any later output: no consistent prefix is left, the fork starts from scratch
    sync2 = ConversationSync(Trajectory("q"))
    _recorded(sync2, first, [1, 2, 3], [4, 5], reply)
    plan = sync2.plan(Conversation(messages=[user, {**back, "content": "let me add"}, tool], system="be brief"), None)
    assert sync2.trajectory.branch == 1 and len(sync2.trajectory) == 0 and plan.initial


def test_sync_forks_from_scratch_when_the_system_prompt_changes_and_marks_a_retry_aborted() -> None:
    sync = ConversationSync(Trajectory("r"))
    user = {"role": "user", "content": "hi"}
    _recorded(sync, Conversation(messages=[user], system="a"), [1, 2], [3], reply_message("hello", None, []))
    plan = sync.plan(Conversation(messages=[user], system="a"), None)  # the same messages again: a retry
    retried = sync.trajectory
    assert retried.branch == 1 and retried.branches[-1].status == "aborted"
    assert plan.count == 1 and plan.chat == []
    plan = sync.plan(Conversation(messages=[user], system="b"), None)
    assert plan.initial and sync.trajectory.branch == 2 and len(sync.trajectory) == 0


def test_canonical_keeps_what_msgspec_cannot_encode_as_the_message() -> None:
    odd = {"role": "user", "content": object()}
    assert canonical(odd) is odd
    assert canonical({"b": 1, "a": 2}) == msgspec.json.encode({"a": 2, "b": 1})


# ------------------------------------------------------------------------------------------------- ids JSON
def _request(ids: list[int], prefix_len: int, sequence: str | None = "s") -> GenerateRequest:
    return GenerateRequest(
        rid="r", input_ids=array("i", ids), prefix_len=prefix_len, sampling=SamplingParams(), sequence=sequence
    )


@given(st.lists(st.lists(st.integers(0, 200_000), max_size=30), min_size=1, max_size=8), st.data())
def test_ids_json_is_msgspecs_bytes_for_any_growth(chunks: list[list[int]], data: st.DataObject) -> None:
    cache = IdsJson()
    ids: list[int] = []
    for chunk in chunks:
        prefix = data.draw(st.integers(0, len(ids)))  # any cacheable prefix of what was sent so far
        ids = [*ids, *chunk]
        assert cache.encode(_request(ids, prefix)) == msgspec.json.encode(ids)


def test_ids_json_rebuilds_for_a_request_that_does_not_extend_it_and_forgets_ended_sequences() -> None:
    cache = IdsJson()
    assert cache.encode(_request([1, 2, 3], 3)) == b"[1,2,3]"
    assert cache.encode(_request([1, 2, 7, 4], 4)) == b"[1,2,7,4]"  # its last kept id differs: built afresh
    assert cache.encode(_request([1, 2], 2)) == b"[1,2]"  # shorter than what is kept: built afresh
    assert cache.encode(_request([5], 1, sequence=None)) == b"[5]" and len(cache) == 1
    cache.end("s")
    assert len(cache) == 0


def test_ids_json_drops_the_least_recently_used_past_its_budget() -> None:
    cache = IdsJson(max_bytes=20)
    cache.encode(_request(list(range(10)), 10, "a"))
    cache.encode(_request(list(range(10)), 10, "b"))
    assert len(cache) == 1 and cache.encode(_request([*range(10), 7], 10, "b")) == msgspec.json.encode([*range(10), 7])


# ------------------------------------------------------------------------------------------- backend sequence
class _Counting(ScriptedBackend):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ended: list[str] = []

    def end_sequence(self, sequence: str) -> None:
        self.ended.append(sequence)


def test_sequence_tracker_ends_the_old_branch_once_when_the_branch_changes(qwen25_tokenizer) -> None:
    backend = _Counting(qwen25_tokenizer, [])
    tracker = SequenceTracker(backend)
    first = Trajectory("r")
    name = tracker.name(first)
    assert tracker.name(first) == name and backend.ended == []
    other = tracker.name(first.fork(0, "test"))
    assert other != name and backend.ended == [name]
    tracker.end()
    tracker.end()
    assert backend.ended == [name, other]


# --------------------------------------------------------------------------------------- the call loop, alone
def test_rollout_runs_on_a_conversation_without_strands(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    backend = _Counting(tok, [hermes_call("add", {"a": 2, "b": 2}), "It is 4."])
    rollout = Rollout(backend, ChatRenderer(tok), get_tool_parser("hermes"))
    user = {"role": "user", "content": "2+2?"}

    async def run() -> None:
        first = await rollout.call(Conversation(messages=[user], tool_specs=[ADD_SPEC]), CallOptions())
        assert first.stop_reason == "tool_use" and rollout.trajectory.status == "running"
        call = first.parsed.calls[0]
        tool = {"role": "tool", "tool_call_id": call.id, "content": "4"}
        second = await rollout.call(
            Conversation(messages=[user, first.reply(), tool], tool_specs=[ADD_SPEC]), CallOptions()
        )
        assert second.parsed.content == "It is 4."

    asyncio.run(run())
    traj = rollout.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2 and traj.status == "completed"
    # token-in: the second request extends everything the first consumed and produced
    first_req, second_req = backend.requests
    assert list(second_req.input_ids[: second_req.prefix_len]) == traj.token_ids[: second_req.prefix_len]
    assert second_req.sequence == first_req.sequence and backend.ended == []


def test_a_call_result_carries_what_was_recorded_so_no_front_reads_the_trajectory(qwen25_tokenizer) -> None:
    backend = _Counting(qwen25_tokenizer, ["one", "two"])
    rollout = Rollout(backend, ChatRenderer(qwen25_tokenizer), get_tool_parser("hermes"))
    user = {"role": "user", "content": "hi"}

    async def run() -> list:
        first = await rollout.call(Conversation(messages=[user]), CallOptions())
        rewritten = {"role": "user", "content": "hello"}  # another first message: the second call forks
        return [first, await rollout.call(Conversation(messages=[rewritten]), CallOptions())]

    results = asyncio.run(run())
    traj = rollout.trajectory
    assert traj.branch == 1 and [r.branch for r in results] == [0, 1]
    last = results[1]
    turn = traj.turns[-1]
    end = turn.output_start + turn.output_len
    assert (last.turn, last.rid) == (turn.index, turn.rid) == (0, backend.requests[1].rid)
    assert list(last.output_ids) == traj.token_ids[turn.output_start : end]
    assert qwen25_tokenizer.decode(last.output_ids).startswith("two")
    assert list(last.output_logprobs) == traj.logprobs[turn.output_start : end]


def test_a_failed_call_ends_its_sequence_exactly_once(qwen25_tokenizer) -> None:
    backend = _Counting(qwen25_tokenizer, [None])  # None: the scripted engine raises a BackendError
    rollout = Rollout(backend, ChatRenderer(qwen25_tokenizer), get_tool_parser("hermes"))
    with pytest.raises(BackendError):
        asyncio.run(rollout.call(Conversation(messages=[{"role": "user", "content": "hi"}]), CallOptions()))
    assert len(backend.ended) == 1 and rollout.trajectory.status == "failed"

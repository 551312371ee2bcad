"""A rollout as a tree of lineages: each call goes on the deepest branch its conversation extends, on the rollout
core alone and through the Strands front (a parent agent and a sub-agent sharing one ``TitoModel``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from strands import tool

from tests.helpers import agent_for, hermes_call
from tests.helpers.lineages import (
    PARENT,
    REPLIES,
    SUB,
    TREE_REPLIES,
    assert_two_lineages,
    by_number,
    interleave,
    record_tree,
)
from tito_core import TitoModel, Trajectory
from tito_core.backend import GenerateRequest
from tito_core.conversation import ChatMessage, Conversation
from tito_core.errors import BackendError
from tito_core.export import to_verl, training_branches
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, CallResult, Rollout
from tito_core.rollout_core.lineages import Lineages
from tito_testing.scripted import ScriptedBackend


class _Sequences(ScriptedBackend):
    """The scripted backend, noting each sequence it was told to end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended: list[str] = []

    def end_sequence(self, sequence: str) -> None:
        self.ended.append(sequence)


def _rollout(tok: Any, replies: list[str]) -> tuple[Rollout, _Sequences]:
    backend = _Sequences(tok, replies)
    return Rollout(backend, ChatRenderer(tok), get_tool_parser("hermes")), backend


def _user(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


async def _turn(rollout: Rollout, system: str, history: list[ChatMessage]) -> CallResult:
    """One call on ``history``, whose reply is appended to it as the client replays it."""
    result = await rollout.call(Conversation(messages=list(history), system=system), CallOptions())
    history.append(result.reply())
    return result


async def _interleaved(rollout: Rollout) -> list[CallResult]:
    return await interleave(_user, lambda system, history: _turn(rollout, system, history))


def test_interleaved_parent_and_sub_agent_keep_one_branch_each(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    rollout, backend = _rollout(tok, REPLIES)
    results = asyncio.run(_interleaved(rollout))
    traj = rollout.trajectory
    assert_two_lineages(traj)
    assert [r.branch for r in results] == [0, 1, 0, 1, 0] and [r.turn for r in results] == [0, 0, 1, 1, 2]
    # token-in per lineage: each call sent its branch so far plus its new prompt, on the branch's one sequence
    requests = backend.requests
    branches = [traj, traj.branches[0]]
    for result, request in zip(results, requests, strict=True):
        branch = branches[result.branch]
        turn = branch.turns[result.turn]
        assert (
            request.prefix_len == turn.prompt_start and list(request.input_ids) == branch.token_ids[: turn.output_start]
        )
    sequences = [r.sequence for r in requests]
    assert sequences[0] == sequences[2] == sequences[4] != sequences[1] == sequences[3]
    assert backend.ended == []  # a lineage left for another keeps its sequence
    assert [b.closed for b in traj.all_branches] == [False, False]
    closed = rollout.reset()
    assert closed is traj and all(b.closed for b in closed.all_branches)
    assert sorted(backend.ended) == sorted({sequences[0], sequences[1]})
    assert [b.status for b in closed.all_branches] == ["completed", "completed"]


def test_lineages_export_each_generated_token_once_and_round_trip(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    rollout, _ = _rollout(tok, REPLIES)
    asyncio.run(_interleaved(rollout))
    traj = rollout.reset()
    generated = sum(len(tok.encode(r, add_special_tokens=False)) + 1 for r in REPLIES)  # each ends with <|im_end|>
    samples = training_branches(traj)
    trained = sum(sum(s.trajectory.loss_mask[s.prompt_length :]) for s in samples)
    assert len(samples) == 2 and trained == generated
    again = Trajectory.from_json(traj.to_json())
    assert again == traj
    assert_two_lineages(again)


def test_a_retry_supersedes_its_attempt_and_the_other_lineage_goes_on(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    rollout, backend = _rollout(tok, ["p1", "s1", "s1 again", "p2"])

    async def run() -> None:
        parent, sub = [_user("plan")], [_user("part one")]
        await _turn(rollout, PARENT, parent)
        await rollout.call(Conversation(messages=list(sub), system=SUB), CallOptions())  # its reply is dropped
        await _turn(rollout, SUB, sub)  # the same conversation again: a retry
        parent.append(_user("part one is done"))
        await _turn(rollout, PARENT, parent)

    asyncio.run(run())
    traj = rollout.trajectory
    _, attempt, retry = by_number(traj)
    assert traj.branch == 0 and len(traj.turns) == 2 and not traj.closed  # the parent went on from its branch
    assert attempt.closed and attempt.status == "aborted" and "discarded" in (attempt.status_reason or "")
    assert (retry.parent_branch, retry.fork_at) == (1, attempt.turns[0].output_start)
    assert retry.fork_reason == "a retry of the call at turn 0 (its output discarded)" and not retry.closed
    assert list(backend.requests[1].input_ids) == list(backend.requests[2].input_ids)
    assert backend.ended == [backend.requests[1].sequence]  # only the superseded attempt's sequence ended


def test_a_rewritten_history_forks_at_the_longest_common_prefix_and_the_old_branch_goes_on(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    rollout, backend = _rollout(tok, ["a1", "a2", "b2", "a3"])

    async def run() -> None:
        history = [_user("one")]
        await _turn(rollout, PARENT, history)
        history.append(_user("two"))
        await _turn(rollout, PARENT, history)
        edited = [*history[:2], _user("two, edited")]
        await _turn(rollout, PARENT, edited)
        history.append(_user("three"))  # the first history again: its branch goes on
        await _turn(rollout, PARENT, history)

    asyncio.run(run())
    traj = rollout.trajectory
    first, edited = by_number(traj)
    assert traj is first and len(first.turns) == 3 and not first.closed and not edited.closed
    assert (edited.parent_branch, edited.fork_reason) == (0, "the conversation history was rewritten at message 2")
    assert edited.fork_at == first.turns[0].output_start + first.turns[0].output_len  # after the first output
    assert edited.token_ids[: edited.fork_at] == first.token_ids[: edited.fork_at] and len(edited.turns) == 2
    assert backend.requests[3].sequence == backend.requests[0].sequence and backend.ended == []


def test_strands_parent_agent_and_sub_agent_through_one_model(qwen25_tokenizer) -> None:
    """A parent agent whose tool asks a sub-agent (another system prompt, its own history) on the same model."""
    tok = qwen25_tokenizer
    replies = [
        hermes_call("ask_helper", {"question": "part one?"}),
        "s1",
        hermes_call("ask_helper", {"question": "part two?"}),
        "s2",
        "p3",
    ]
    backend = _Sequences(tok, replies)
    model = TitoModel(backend, tok)
    helper = agent_for(model, system_prompt=SUB)

    @tool
    async def ask_helper(question: str) -> str:
        """Ask the sub-agent a question."""
        return str(await helper.invoke_async(question)).strip()

    parent = agent_for(model, [ask_helper], system_prompt=PARENT)
    assert str(parent("plan the work")).strip() == "p3"
    traj = model.trajectory
    assert_two_lineages(traj, "a new lineage (the system prompt and the tool list changed)")  # the helper has no tools
    assert model.reset() is traj and all(b.closed for b in traj.all_branches)


def test_only_the_most_recently_used_lineages_keep_their_backend_sequence(qwen25_tokenizer) -> None:
    """Past the bound, the least recently used lineage's sequence ends; its branch stays open and goes on later."""
    backend = _Sequences(qwen25_tokenizer, [])
    lineages = Lineages(backend, "r", live_sequences=2)
    names = {}

    def call(system: str, *later: ChatMessage) -> str:
        """One call as the call loop makes it: choose, name the sequence, record a prompt and an output, release."""
        conversation = Conversation(messages=[_user("hi"), *later], system=system)
        lineage, plan = lineages.choose(conversation, None)
        name = lineage.sequence.name(lineage.trajectory)
        traj = lineage.trajectory
        traj.append("prompt", [1, 2], turn=len(traj.turns))
        lineage.sync.consumed(plan, conversation, len(traj))
        traj.append("output", [3], [-0.5], turn=len(traj.turns))
        lineage.sync.expect({"role": "assistant", "content": "hello"})
        lineages.release(lineage)
        names.setdefault(system, []).append(name)
        return name

    for system in ("a", "b", "c"):
        call(system)
    assert backend.ended == [names["a"][0]]  # three lineages, two sequences: the oldest one's ended
    assert not any(b.closed for b in lineages.trajectory.all_branches)
    assert [b.branch for b in by_number(lineages.trajectory)] == [0, 1, 2]
    call("a", {"role": "assistant", "content": "hello"}, _user("more"))  # lineage "a" goes on, on a new sequence
    assert lineages.trajectory.branch == 0 and len(lineages.trajectory) == 6  # two calls of 3 tokens
    assert names["a"][1] != names["a"][0] and backend.ended == [names["a"][0], names["b"][0]]


def test_a_failed_call_sets_the_status_of_its_own_branch_and_ends_only_its_sequence(qwen25_tokenizer) -> None:
    def down(request: GenerateRequest) -> str:
        raise BackendError("the engine went away", backend="scripted")

    rollout, backend = _rollout(qwen25_tokenizer, ["p1", down, "s1", "p2"])

    async def run() -> None:
        parent, sub = [_user("plan")], [_user("part one")]
        await _turn(rollout, PARENT, parent)
        with pytest.raises(BackendError):
            await _turn(rollout, SUB, sub)
        first, failed = by_number(rollout.trajectory)
        assert (failed.status, failed.status_reason) == ("failed", "BackendError: the engine went away")
        assert first.status == "completed" and backend.ended == [backend.requests[1].sequence]
        await _turn(rollout, SUB, sub)  # the sub-agent tries again: on its empty branch, not a third one
        parent.append(_user("part one is done"))
        await _turn(rollout, PARENT, parent)

    asyncio.run(run())
    parent, sub = by_number(rollout.trajectory)
    assert (len(parent.turns), len(sub.turns)) == (2, 1) and [parent.status, sub.status] == ["completed"] * 2
    assert backend.requests[3].sequence == backend.requests[0].sequence != backend.requests[2].sequence


def test_rows_are_one_per_leaf_not_per_call_and_train_each_generated_token_once(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    traj = record_tree(tok)
    parent, attempt, retry, edited = by_number(traj)
    assert (attempt.parent_branch, retry.parent_branch, edited.parent_branch) == (None, 1, 0)
    samples = training_branches(traj)
    assert len(samples) == 4 < len(TREE_REPLIES)  # four leaves from six calls
    assert [(s.trajectory.branch, s.superseded) for s in samples] == [(0, False), (1, True), (2, False), (3, False)]
    assert [s.trajectory.token_ids for s in samples] == [b.token_ids for b in (parent, attempt, retry, edited)]
    trained: list[int] = []  # every loss-1 token of every row, as the verl rows carry them
    for sample in samples:
        fields = to_verl(sample)
        assert fields["prompt_ids"] + fields["response_ids"] == sample.trajectory.token_ids
        trained += [t for t, m in zip(fields["response_ids"], fields["response_mask"], strict=True) if m]
    made: list[int] = []  # what the engine generated, call by call
    for reply in TREE_REPLIES:
        made += [*tok.encode(reply, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
    assert sorted(trained) == sorted(made)
    assert [s.lineage()["superseded"] for s in samples] == [False, True, False, False]

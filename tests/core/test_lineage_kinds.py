"""What each branch of a rollout is (its ``fork_kind``, reason, label and compaction link), on the rollout core and
through the Strands front, and records written before these fields still load."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from strands import tool

from tests.helpers import agent_for, hermes_call
from tests.helpers.lineages import PARENT, SUB, by_number
from tito_core import TitoModel, Trajectory
from tito_core.conversation import ChatMessage, Conversation
from tito_core.errors import LineageLabelError
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, CallResult, Rollout
from tito_core.rollout_core.labels import Label, parse_label
from tito_core.trajectory.record import CallRef
from tito_testing.scripted import ScriptedBackend

SUMMARY = "The user asked for a plan; the parent agent wrote three steps and finished the first two of them."


def _rollout(tok: Any, replies: list[str]) -> tuple[Rollout, ScriptedBackend]:
    backend = ScriptedBackend(tok, replies)
    return Rollout(backend, ChatRenderer(tok), get_tool_parser("hermes")), backend


def _user(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


async def _turn(rollout: Rollout, system: str, history: list[ChatMessage], label: Label | None = None) -> CallResult:
    result = await rollout.call(Conversation(messages=list(history), system=system), CallOptions(), label=label)
    history.append(result.reply())
    return result


def test_a_sub_agent_with_the_parents_system_prompt_and_a_new_task_is_a_new_lineage(qwen25_tokenizer) -> None:
    """Same system prompt, no message in common: a new conversation, not a rewrite of the first one's history."""
    rollout, _ = _rollout(qwen25_tokenizer, ["a1", "b1", "a2"])

    async def run() -> None:
        first, second = [_user("task A")], [_user("task B")]
        await _turn(rollout, SUB, first)
        await _turn(rollout, SUB, second)
        first.append(_user("more A"))
        await _turn(rollout, SUB, first)

    asyncio.run(run())
    a, b = by_number(rollout.trajectory)
    assert (b.parent_branch, b.fork_at, b.fork_kind) == (None, 0, "new_lineage")
    assert b.fork_reason == "a new lineage (a new conversation)"
    assert len(a.turns) == 2 and a.fork_kind is None


def test_fork_kinds_of_a_rewrite_and_a_retry(qwen25_tokenizer) -> None:
    rollout, _ = _rollout(qwen25_tokenizer, ["a1", "a2", "b2", "b2 again"])

    async def run() -> None:
        history = [_user("one")]
        await _turn(rollout, PARENT, history)
        history.append(_user("two"))
        await _turn(rollout, PARENT, history)
        edited = [*history[:2], _user("two, edited")]
        await rollout.call(Conversation(messages=edited, system=PARENT), CallOptions())
        await rollout.call(Conversation(messages=edited, system=PARENT), CallOptions())  # a retry of that call

    asyncio.run(run())
    _, rewrite, retry = by_number(rollout.trajectory)
    assert (rewrite.fork_kind, retry.fork_kind) == ("rewrite", "retry")
    assert rewrite.status == "aborted" and "discarded" in (rewrite.status_reason or "")


def test_a_prompt_carrying_an_earlier_output_is_a_compaction_of_that_call(qwen25_tokenizer) -> None:
    """The summarizer's output, pasted into a new conversation of the parent, links the new branch to that call."""
    rollout, _ = _rollout(qwen25_tokenizer, ["p1", SUMMARY, "p2"])

    async def run() -> None:
        await _turn(rollout, PARENT, [_user("plan the work")])
        await _turn(rollout, SUB, [_user("summarize the work so far")])
        await _turn(rollout, PARENT, [_user(f"Summary of the work so far:\n{SUMMARY}"), _user("go on")])

    asyncio.run(run())
    parent, summarizer, going_on = by_number(rollout.trajectory)
    assert going_on.fork_kind == "compaction" and going_on.compacted_from == CallRef(summarizer.branch, 0)
    assert going_on.fork_reason == (
        "a compaction: continues from the summary of call 0 of branch 1 (its prompt carries that call's output)"
    )
    assert parent.compacted_from is None and summarizer.fork_kind == "new_lineage"
    again = Trajectory.from_json(rollout.reset().to_json())
    assert by_number(again)[2].compacted_from == CallRef(1, 0)


def test_an_assistant_turn_replayed_in_a_rewritten_history_is_no_compaction(qwen25_tokenizer) -> None:
    rollout, _ = _rollout(qwen25_tokenizer, [SUMMARY, "b2"])

    async def run() -> None:
        history = [_user("one")]
        await _turn(rollout, PARENT, history)
        await _turn(rollout, PARENT, [_user("one, edited"), history[1], _user("two")])  # its output replayed

    asyncio.run(run())
    _, rewritten = by_number(rollout.trajectory)
    assert rewritten.fork_kind == "rewrite" and rewritten.compacted_from is None


def test_a_branch_left_behind_closes_with_a_true_reason(qwen25_tokenizer) -> None:
    """Its last output called a tool, then the history was rewritten before that call: it was left behind."""
    rollout, _ = _rollout(qwen25_tokenizer, [hermes_call("add", {"a": 1, "b": 2}), "b1"])

    async def run() -> None:
        history = [_user("one")]
        await _turn(rollout, PARENT, history)
        await _turn(rollout, PARENT, [_user("one"), {"role": "assistant", "content": "edited"}, _user("two")])

    asyncio.run(run())
    left, went_on = by_number(rollout.reset())
    assert (left.status, left.status_reason) == (
        "aborted",
        "left behind: the rollout went on in branch 1, forked from it, and ended there",
    )
    assert went_on.status == "completed"


def test_labels_parse_and_refuse() -> None:
    assert parse_label(None) is None and parse_label("  ") is None
    assert parse_label("sub-agent/2") == Label("sub-agent/2")
    assert parse_label("main ; Compaction") == Label("main", compaction=True)
    for bad in ("a" * 65, "two words", "_x", "x;y", ";compaction"):
        with pytest.raises(LineageLabelError, match="X-Tito-Lineage"):
            parse_label(bad)


def test_the_strands_front_takes_a_label_in_the_invocation_state(qwen25_tokenizer) -> None:
    backend = ScriptedBackend(qwen25_tokenizer, ["one", "two"])
    model = TitoModel(backend, qwen25_tokenizer)
    first, second = agent_for(model, system_prompt=SUB), agent_for(model, system_prompt=SUB)
    first("do part one", tito_lineage="sub-1")
    second("do part one", tito_lineage="sub-2")
    one, two = by_number(model.trajectory)
    assert (one.label, two.label, two.fork_kind) == ("sub-1", "sub-2", "new_lineage")
    assert [t.label for t in two.turns] == ["sub-2"]
    with pytest.raises(LineageLabelError, match="tito_lineage"):
        agent_for(model, system_prompt=SUB)("hi", tito_lineage="not a label")


OLD_RECORD = {
    "rollout_id": "r",
    "branch": 1,
    "token_ids": [1, 2, 3],
    "logprobs": [None, None, -0.5],
    "segments": [
        {"kind": "prompt", "start": 0, "end": 2, "turn": 0},
        {"kind": "output", "start": 2, "end": 3, "turn": 0},
    ],
    "turns": [
        {
            "index": 0,
            "rid": "a",
            "prompt_start": 0,
            "prompt_len": 2,
            "output_len": 1,
            "finish_reason": "stop",
            "stop_reason": "end_turn",
            "usage": {"prompt_tokens": 2, "completion_tokens": 1},
        }
    ],
    "status": "completed",
    "fork_reason": "a new lineage (the system prompt changed)",
    "branches": [
        {
            "rollout_id": "r",
            "branch": 0,
            "token_ids": [],
            "logprobs": [],
            "segments": [],
            "turns": [],
            "status": "completed",
        },
        {
            "rollout_id": "r",
            "branch": 2,
            "parent_branch": 0,
            "token_ids": [],
            "logprobs": [],
            "segments": [],
            "turns": [],
            "status": "aborted",
            "fork_reason": "a retry of the call at turn 0 (its output discarded)",
        },
    ],
}


def test_a_record_written_before_fork_kinds_and_labels_loads_with_its_kinds() -> None:
    traj = Trajectory.from_json(json.dumps(OLD_RECORD))
    assert (traj.fork_kind, traj.label, traj.compacted_from, traj.turns[0].label) == ("new_lineage", None, None, None)
    assert [(b.branch, b.fork_kind) for b in traj.branches] == [(0, None), (2, "retry")]
    assert Trajectory.from_json(traj.to_json()) == traj


def test_strands_parallel_sub_agents_on_one_model_record_a_branch_each(qwen25_tokenizer) -> None:
    """Two tool calls run at once (Strands' concurrent executor), each asking its own sub-agent on the same model."""
    both = asyncio.Event()
    arrived: list[str] = []

    class Gated(ScriptedBackend):
        async def generate(self, request: Any) -> Any:
            text = qwen25_tokenizer.decode(list(request.input_ids))
            if SUB in text:
                arrived.append(text)
                if len(arrived) == 2:
                    both.set()
                await asyncio.wait_for(both.wait(), 60)  # each sub-agent's call waits until both are in flight
            return await super().generate(request)

    calls = [hermes_call("ask_helper", {"question": q}) for q in ("part A?", "part B?")]
    backend = Gated(qwen25_tokenizer, ["\n".join(calls), "answer", "answer", "merged"])
    model = TitoModel(backend, qwen25_tokenizer)

    @tool
    async def ask_helper(question: str) -> str:
        """Ask a new sub-agent a question."""
        return str(await agent_for(model, system_prompt=SUB).invoke_async(question)).strip()

    parent = agent_for(model, [ask_helper], system_prompt=PARENT)
    assert str(parent("plan the work")).strip() == "merged"
    main, first, second = by_number(model.trajectory)
    assert [len(b.turns) for b in (main, first, second)] == [2, 1, 1]
    assert (second.parent_branch, second.fork_kind) == (None, "new_lineage")
    assert second.fork_reason == "a new lineage (a new conversation)"
    assert {b.status for b in (main, first, second)} == {"completed"}

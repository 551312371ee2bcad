"""``X-Tito-Lineage`` on every front: a labelled call goes on no branch labelled otherwise, each turn and branch keeps
its label, and a label tito does not take is a 400 naming the header, with nothing recorded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from anthropic import AsyncAnthropic
from google import genai
from google.genai import types
from openai import AsyncOpenAI

from tests.helpers.lineages import PARENT, SUB, by_number
from tito_core import Trajectory
from tito_core.cli import main
from tito_core.gateway import Gateway

Ask = Callable[[str, str, str], Awaitable[str]]  # (label, system prompt, user text) -> the reply


def _openai(rollout: Any, label: str) -> AsyncOpenAI:
    headers = {"X-Tito-Lineage": label}
    return AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0, default_headers=headers)


def chat_completions(rollout: Any) -> Ask:
    async def ask(label: str, system: str, text: str) -> str:
        messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        answer = await _openai(rollout, label).chat.completions.create(model="m", messages=messages)
        return answer.choices[0].message.content or ""

    return ask


def responses(rollout: Any) -> Ask:
    async def ask(label: str, system: str, text: str) -> str:
        sdk = _openai(rollout, label)
        answer = await sdk.responses.create(model="m", instructions=system, input=text, store=False)
        return answer.output_text

    return ask


def messages(rollout: Any) -> Ask:
    async def ask(label: str, system: str, text: str) -> str:
        base = rollout.base_url.removesuffix("/v1")
        sdk = AsyncAnthropic(
            base_url=base, api_key=rollout.token, max_retries=0, default_headers={"X-Tito-Lineage": label}
        )
        answer = await sdk.messages.create(
            model="m", max_tokens=64, system=system, messages=[{"role": "user", "content": text}]
        )
        return "".join(getattr(block, "text", "") for block in answer.content)

    return ask


def gemini(rollout: Any) -> Ask:
    async def ask(label: str, system: str, text: str) -> str:
        options = types.HttpOptions(
            base_url=rollout.base_url.removesuffix("/v1"), api_version="v1beta", headers={"X-Tito-Lineage": label}
        )
        sdk = genai.Client(api_key=rollout.token, http_options=options)
        setup = types.GenerateContentConfig(system_instruction=system)
        answer = await sdk.aio.models.generate_content(model="tito", contents=text, config=setup)
        return answer.text or ""

    return ask


@pytest.mark.parametrize("front", [chat_completions, responses, messages, gemini])
async def test_labels_keep_two_identical_sub_agents_apart_on_every_front(
    gateway: Gateway, backend: Any, front: Callable[[Any], Ask]
) -> None:
    """Two sub-agents sent the same first request: unlabelled, the second would retry (and discard) the first."""
    backend.add("p1", "one", "two")
    rollout = gateway.open()
    ask = front(rollout)
    assert await ask("parent", PARENT, "plan the work") == "p1"
    assert await ask("sub-1", SUB, "do part one") == "one"
    assert await ask("sub-2", SUB, "do part one") == "two"
    record = await gateway.finish(rollout.id)
    parent, first, second = by_number(Trajectory.from_record(record.trajectory))
    assert [b.label for b in (parent, first, second)] == ["parent", "sub-1", "sub-2"]
    assert [[t.label for t in b.turns if t.output_start >= b.fork_at] for b in (parent, first, second)] == [
        ["parent"],
        ["sub-1"],
        ["sub-2"],
    ]
    assert (second.parent_branch, second.fork_kind) == (1, "new_lineage")
    assert second.fork_reason == "a new lineage (labelled 'sub-2', the branch 'sub-1')"
    assert second.fork_at == first.turns[0].output_start  # the shared prompt, kept once
    assert first.status == second.status == "completed"  # nothing superseded


@pytest.mark.parametrize(
    ("label", "says"),
    [
        ("x" * 65, "1 to 64 characters"),
        ("sub agent", "is not a lineage label"),
        ("-sub", "starting with a letter or a digit"),
        ("sub; summary", "unknown lineage label parameter"),
        ("sub\u00e9", "is not a lineage label"),
    ],
)
async def test_a_label_tito_does_not_take_is_a_400_naming_the_header(
    gateway: Gateway, backend: Any, label: str, says: str
) -> None:
    backend.add("never")
    rollout = gateway.open()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {rollout.token}", "X-Tito-Lineage": label}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rollout.base_url}/chat/completions", json=body, headers=headers) as response,
    ):
        status, answer = response.status, await response.json()
    assert status == 400 and answer["error"]["code"] == "invalid_lineage_label"
    assert answer["error"]["param"] == "X-Tito-Lineage" and says in answer["error"]["message"]
    assert backend.requests == [] and rollout.core.trajectory.status == "running"


async def test_the_answer_names_the_label_and_a_compaction_label_links_the_summary(
    gateway: Gateway, backend: Any
) -> None:
    """``name; compaction`` marks the branch the call starts a compaction continuation of the last recorded call."""
    backend.add("p1", "a short summary", "p2")
    rollout = gateway.open()
    ask = chat_completions(rollout)
    await ask("main", PARENT, "plan the work")
    await ask("summarizer", SUB, "summarize the work")
    sdk = _openai(rollout, "main; compaction")
    messages: Any = [{"role": "system", "content": PARENT}, {"role": "user", "content": "go on from the summary"}]
    answer = await sdk.chat.completions.create(model="m", messages=messages)
    assert answer.model_extra is not None and answer.model_extra["tito"]["lineage"] == "main"
    record = await gateway.finish(rollout.id)
    main, summary, going_on = by_number(Trajectory.from_record(record.trajectory))
    assert (going_on.fork_kind, going_on.label) == ("compaction", "main")
    assert going_on.compacted_from is not None
    assert (going_on.compacted_from.branch, going_on.compacted_from.turn) == (summary.branch, 0)


async def test_tito_inspect_prints_each_branch_with_its_kind_and_label(
    gateway: Gateway, backend: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.add("p1", "one", "two")
    rollout = gateway.open()
    ask = chat_completions(rollout)
    await ask("parent", PARENT, "plan the work")
    await ask("sub-1", SUB, "do part one")
    await ask("sub-2", SUB, "do part one")
    await gateway.finish(rollout.id)
    monkeypatch.setenv("COLUMNS", "400")
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "out.jsonl"), "--id", rollout.id]) == 0
    shown = capsys.readouterr().out
    assert "branch 0 lineage parent: completed, 1 calls" in shown
    assert (
        "branch 1 [new_lineage] lineage sub-1: completed, 1 calls: a new lineage (the system prompt changed)" in shown
    )
    assert "  branch 2 <- 1 at token " in shown and "[new_lineage] lineage sub-2: completed, 1 calls" in shown


async def test_a_summary_pasted_into_a_new_conversation_is_found_from_its_tokens(
    gateway: Gateway, backend: Any
) -> None:
    """No label: the continuation's prompt carries the summary call's output ids, so it links to that call."""
    summary = "The parent planned three steps and finished the first two; the third is to merge the results."
    backend.add("p1", summary, "p2")
    rollout = gateway.open()
    ask = chat_completions(rollout)
    await ask("", PARENT, "plan the work")
    await ask("", SUB, "summarize the work so far")
    await ask("", PARENT, f"Where we are:\n{summary}")
    main, summarizer, going_on = by_number(Trajectory.from_record((await gateway.finish(rollout.id)).trajectory))
    assert (going_on.fork_kind, going_on.parent_branch, going_on.label) == ("compaction", None, None)
    assert going_on.compacted_from is not None
    assert (going_on.compacted_from.branch, going_on.compacted_from.turn) == (summarizer.branch, 0)
    assert main.fork_kind is None and summarizer.fork_kind == "new_lineage"

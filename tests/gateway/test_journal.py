"""A gateway worker's write-ahead journal: an answer goes out only once it is journaled, and the journal gives back
the record of every rollout it opened and did not end, with what was answered (its exact trajectory, its rewards,
its finish), once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.gateway.conftest import GrammarBackend, config
from tito_core.gateway import Gateway
from tito_core.gateway.journal import Journal, lost_records, read_journal
from tito_testing.rollout_trees import PARENT, SUB
from tito_testing.scripted import ScriptedBackend

USER = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SAMPLING = {"top_p": 0.9, "top_k": 20, "max_new_tokens": 16}  # truncated sampling: a kept set per output token


async def _chat(url: str, token: str, body: Any = USER) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {token}"}
        async with session.post(f"{url}/chat/completions", json=body, headers=headers) as response:
            return response.status, await response.json()


async def _post(url: str, token: str, body: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as response:
        return response.status, await response.json()


def _system(text: str) -> Any:
    return {"role": "system", "content": text}


def _user(text: str) -> Any:
    return {"role": "user", "content": text}


async def test_an_answer_the_journal_cannot_hold_is_not_sent(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=GrammarBackend(qwen3_tokenizer, ["one", "two"]))
    await gateway.start()
    try:
        gateway.journal = Journal(tmp_path / "journal.jsonl")
        rollout = gateway.open(task_id="t")
        status, _ = await _chat(rollout.base_url, rollout.token)
        assert status == 200
        gateway.journal.close()  # the journal can take no more
        status, body = await _chat(rollout.base_url, rollout.token)
    finally:
        await gateway.close()
    assert status == 507 and body["error"]["code"] == "journal_not_written"
    assert "output_ids" not in str(body)


async def test_the_journal_gives_the_record_of_what_was_answered_once(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    """Two rollouts journaled, one ended; a torn last line (a kill mid-write) is skipped: one record comes back,
    ``failed`` for the reason given, with the output answered; none once its key is written."""
    path = tmp_path / "journal.jsonl"
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=GrammarBackend(qwen3_tokenizer, ["one", "two"]))
    await gateway.start()
    try:
        gateway.journal = Journal(path)
        kept, ended = gateway.open(task_id="a"), gateway.open(task_id="b")
        status, answer = await _chat(kept.base_url, kept.token)
        assert status == 200
        gateway.journal.ended(ended.id)
        gateway.journal.close()
    finally:
        await gateway.close()
    with path.open("ab") as fh:
        fh.write(b'{"op":"call","id":"')  # torn: never acknowledged
    (record,) = lost_records(path, set(), "gateway worker lost: test")
    assert record.task_id == "a" and record.status == "failed"
    assert record.status_reason == "gateway worker lost: test"
    traj = record.trajectory
    assert [traj.token_ids[s.start : s.end] for s in traj.segments if s.kind == "output"] == [
        answer["tito"]["output_ids"]
    ]
    assert lost_records(path, {("a", record.sample)}, "again") == []  # written already: not twice


async def test_the_journal_is_compacted_to_the_open_rollouts_lines(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    """A journal past its size keeps only each open rollout's lines (its open line and one delta per call): a worker
    serving for days does not fill the disk, and the record that comes back still holds every answered output."""
    path = tmp_path / "journal.jsonl"
    replies = [f"answer {i}" for i in range(8)]
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=GrammarBackend(qwen3_tokenizer, replies))
    await gateway.start()
    try:
        gateway.journal = Journal(path, rotate_bytes=1)  # compacted at every line
        done, kept = gateway.open(task_id="done"), gateway.open(task_id="kept")
        for _ in range(3):
            status, _ = await _chat(done.base_url, done.token)
            assert status == 200
        await gateway.finish(done.id)  # no output: the test's writer journals nothing; end it by hand
        gateway.journal.ended(done.id)
        body: Any = USER
        outputs = []
        for _ in range(3):
            status, answer = await _chat(kept.base_url, kept.token, body)
            assert status == 200
            outputs.append(answer["tito"]["output_ids"])
            reply = answer["choices"][0]["message"]
            body = {"model": "m", "messages": [*body["messages"], reply, {"role": "user", "content": "more"}]}
        gateway.journal.compact()
        gateway.journal.close()
    finally:
        await gateway.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 4 and b'"done"' not in b"".join(lines)  # kept's open line and its three calls
    (record,) = lost_records(path, set(), "gateway worker lost: test")
    traj = record.trajectory
    assert record.task_id == "kept"
    assert [traj.token_ids[s.start : s.end] for s in traj.segments if s.kind == "output"] == outputs


async def test_a_worker_s_journal_stays_the_size_of_its_open_rollouts(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    """Forty rollouts one after the other, each opened, called and ended: the file never holds more than a few
    times the size it is compacted at, though the call lines alone add up to over ten times that."""
    path = tmp_path / "journal.jsonl"
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=GrammarBackend(qwen3_tokenizer, ["ok"] * 40))
    await gateway.start()
    largest = line = 0
    try:
        gateway.journal = Journal(path, rotate_bytes=1024)
        for index in range(40):
            rollout = gateway.open(task_id=f"t{index}")
            before = path.stat().st_size
            status, _ = await _chat(rollout.base_url, rollout.token)
            assert status == 200
            line = max(line, path.stat().st_size - before)  # the call's line (when no compaction came first)
            await gateway.finish(rollout.id)
            gateway.journal.ended(rollout.id)
            largest = max(largest, path.stat().st_size)
        gateway.journal.close()
    finally:
        await gateway.close()
    assert largest < 4 * 1024 and 40 * line > 10 * largest


async def test_the_journal_gives_back_the_exact_trajectory_after_every_call(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    """A parent agent and a sub-agent (two lineages), the sub-agent's call retried (a fork that supersedes its
    branch), kept sets, routing and weight versions on every output, a call that failed between two answered ones:
    after each answered call, the trajectory rebuilt from the journal's lines is the worker's own record, field for
    field; each line carries only what its call added; it stays so once compacted, and with a torn line after."""
    replies = ["p1", "s1", "s1 again", "p2", lambda request: None, "p3"]  # the fifth: no text, a failed call
    backend = ScriptedBackend(qwen3_tokenizer, replies, routed_experts=(2, 2), weight_version="v1")
    gateway = Gateway(config(sampling=SAMPLING, return_routed_experts=True), tokenizer=qwen3_tokenizer, backend=backend)
    path = tmp_path / "journal.jsonl"
    parent, sub = [_system(PARENT), _user("plan the work")], [_system(SUB), _user("do part one")]
    await gateway.start()
    try:
        gateway.journal = Journal(path)
        rollout = gateway.open(task_id="t", metadata={"seed": 3})
        traj = lambda: rollout.core.trajectory  # noqa: E731 (the current branch moves with each call)
        for step, messages in enumerate([parent, sub, sub, parent, parent, parent]):
            if step == 3:
                parent.append(_user("part one is done"))
            if step == 4:
                parent.append(_user("part two is done"))
            size = len(traj())
            status, answer = await _chat(rollout.base_url, rollout.token, {"model": "m", "messages": messages})
            if step == 4:  # failed: nothing to journal, no answer
                assert status != 200 and traj().status == "failed"
                continue
            assert status == 200
            if messages is parent:
                parent.append(answer["choices"][0]["message"])
            (journaled,) = read_journal(path).values()
            assert journaled.trajectory.record() == traj().to_record()
        by_number = {b.branch: b for b in traj().all_branches}
        assert sorted(by_number) == [0, 1, 2] and traj().branch == 0
        assert by_number[1].closed and by_number[2].fork_kind == "retry"  # the retried call superseded branch 1
        assert all(t.sampling_mask is not None and t.routed_experts for b in traj().all_branches for t in b.turns)
        last = json.loads(path.read_bytes().splitlines()[-1])
        assert last["type"] == "delta"
        turn = traj().turns[-1]
        assert len(traj()) - size == turn.prompt_len + turn.output_len > 0
        assert sum(len(b.get("token_ids", [])) for b in last["delta"]["branches"]) == turn.prompt_len + turn.output_len
        gateway.journal.compact()
        (journaled,) = read_journal(path).values()
        assert journaled.trajectory.record() == traj().to_record()
        with path.open("ab") as fh:
            fh.write(b'{"type":"delta","id":"' + rollout.id.encode() + b'","tool_calls":0,"delta":{"current":0,')
        (journaled,) = read_journal(path).values()
        assert journaled.trajectory.record() == traj().to_record()
        (record,) = lost_records(path, set(), "gateway worker lost: test")
        live = traj().to_record()
        assert [
            (b.token_ids, b.logprobs, b.segments, b.turns) for b in [*record.trajectory.branches, record.trajectory]
        ] == [(b.token_ids, b.logprobs, b.segments, b.turns) for b in [*live.branches, live]]
        assert record.status == "failed" and record.trajectory.metadata["seed"] == 3
    finally:
        await gateway.close()


async def test_rewards_and_a_finish_are_journaled_and_recovered(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    """A reward per call and one per branch, then a finish with a total and metadata whose record never reached the
    output (its worker died before the supervisor wrote it): the journal's record carries all of them."""
    path = tmp_path / "journal.jsonl"
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=GrammarBackend(qwen3_tokenizer, ["one", "two"]))
    await gateway.start()
    try:
        gateway.journal = Journal(path)
        rollout = gateway.open(task_id="t")
        status, answer = await _chat(rollout.base_url, rollout.token)
        assert status == 200
        more = [*USER["messages"], answer["choices"][0]["message"], _user("more")]
        status, _ = await _chat(rollout.base_url, rollout.token, {"model": "m", "messages": more})
        assert status == 200
        url = rollout.base_url.removesuffix("/v1")
        assert await _post(f"{url}/reward", rollout.token, {"value": 0.5, "turn": 0}) == (
            200,
            {"turn": 0, "value": 0.5},
        )
        assert await _post(f"{url}/reward", rollout.token, {"value": 1, "branch": 0}) == (
            200,
            {"branch": 0, "value": 1},
        )
        (open_record,) = lost_records(path, set(), "gateway worker lost: test")
        body = {"reward": 2.0, "metadata": {"judge": "ok"}}
        status, _ = await _post(f"{url}/finish", rollout.token, body)
        assert status == 200  # no output here: nothing journals the rollout as ended, as a worker killed then
        gateway.journal.close()
    finally:
        await gateway.close()
    assert (open_record.reward, open_record.turn_rewards, open_record.branch_rewards) == (None, [0.5, None], [1.0])
    (record,) = lost_records(path, set(), "gateway worker lost: test")
    assert (record.reward, record.turn_rewards, record.branch_rewards) == (2.0, [0.5, None], [1.0])
    assert record.trajectory.metadata["judge"] == "ok" and record.status == "failed"
    assert record.status_reason == "gateway worker lost: test"


async def test_a_reward_the_journal_cannot_hold_is_not_given(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=GrammarBackend(qwen3_tokenizer, ["one"]))
    await gateway.start()
    try:
        gateway.journal = Journal(tmp_path / "journal.jsonl")
        rollout = gateway.open(task_id="t")
        status, _ = await _chat(rollout.base_url, rollout.token)
        assert status == 200
        gateway.journal.close()
        url = rollout.base_url.removesuffix("/v1")
        status, body = await _post(f"{url}/reward", rollout.token, {"value": 0.5})
        assert status == 507 and body["error"]["code"] == "journal_not_written"
        assert rollout.rewards.by_turn == {}  # not answered: not given (the client may give it again)
        status, body = await _post(f"{url}/finish", rollout.token, {"reward": 1.0})
        assert status == 507 and not rollout.finished  # not finished: it may be finished again
    finally:
        await gateway.close()

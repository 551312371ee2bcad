"""A gateway worker's write-ahead journal: an answer goes out only once it is journaled, and the journal gives back
the record of every rollout it opened and did not end, with what was answered, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from tests.gateway.conftest import GrammarBackend, config
from tito_core.gateway import Gateway
from tito_core.gateway.journal import Journal, lost_records

USER = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _chat(url: str, token: str, body: Any = USER) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {token}"}
        async with session.post(f"{url}/chat/completions", json=body, headers=headers) as response:
            return response.status, await response.json()


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


async def test_the_journal_is_compacted_to_the_open_rollouts_last_states(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    """A journal past its size keeps only each open rollout's open line and last call: a worker serving for days
    does not fill the disk, and the record that comes back still holds every answered output."""
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
        assert len(path.read_bytes().splitlines()) < 9  # 9 lines appended: compacted on the way
        gateway.journal.compact()
        gateway.journal.close()
    finally:
        await gateway.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 2 and b'"done"' not in b"".join(lines)  # kept's open line and its last call
    (record,) = lost_records(path, set(), "gateway worker lost: test")
    traj = record.trajectory
    assert record.task_id == "kept"
    assert [traj.token_ids[s.start : s.end] for s in traj.segments if s.kind == "output"] == outputs

"""The gateway's output as Parquet: finished and shut-down rollouts read back exactly, locked, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.gateway.conftest import GrammarBackend, config
from tito_core import Trajectory
from tito_core.gateway import Gateway
from tito_core.records import read_records
from tito_core.records.lock import OutputLockedError

pytest.importorskip("pyarrow")

USER = [{"role": "user", "content": "Capital of France?"}]


async def test_parquet_output_holds_finished_and_aborted_rollouts_and_resumes(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "rollouts.parquet"
    backend = GrammarBackend(qwen3_tokenizer, ["Paris.", "Lyon?", "Paris!"])
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=out)
    await gateway.start()
    try:
        with pytest.raises(OutputLockedError):  # a second writer on the same output is refused while this one lives
            await Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=out).prepare()
        done, left_open = gateway.open(task_id="t1"), gateway.open(task_id="t1")
        for rollout in (done, left_open):
            api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
            await api.chat.completions.create(model="m", messages=USER)
        recorded = Trajectory.from_json(gateway.trajectory_json(done.id))
        url = f"{gateway.base_url}/rollouts/{done.id}/finish"
        finish = {"reward": 1.0, "metadata": {"grader": "exact"}}
        auth = {"Authorization": f"Bearer {done.token}"}
        async with aiohttp.ClientSession() as session, session.post(url, json=finish, headers=auth) as response:
            assert response.status == 200, await response.text()
    finally:
        await gateway.close()  # writes `left_open` as aborted and closes the Parquet writer
    records = {r.key: r for r in read_records(out)}
    assert set(records) == {("t1", 0), ("t1", 1)}
    first, second = records["t1", 0], records["t1", 1]
    assert (first.status, first.reward, first.tokens.model_calls) == ("completed", 1.0, 1)
    back = Trajectory.from_record(first.trajectory)
    assert (back.token_ids, back.loss_mask, back.logprobs) == (
        recorded.token_ids,
        recorded.loss_mask,
        recorded.logprobs,
    )
    assert back.metadata["grader"] == "exact" and back.metadata["gateway_end"] == "finish"
    assert second.status == "aborted" and second.trajectory.metadata["gateway_end"] == "shutdown"

    # a new gateway on the same output numbers the task's next rollout after those already written
    again = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=out)
    await again.start()
    try:
        rollout = again.open(task_id="t1")
        api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
        await api.chat.completions.create(model="m", messages=USER)
        record = await again.finish(rollout.id, reward=0.5)
    finally:
        await again.close()
    assert record.sample == 2
    assert sorted(r.key for r in read_records(out)) == [("t1", 0), ("t1", 1), ("t1", 2)]


async def test_a_record_that_cannot_be_written_is_kept_said_and_written_later(
    qwen3_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write at ``finish`` (a full disk) lost the rollout: it was removed before its record was written."""
    out = tmp_path / "rollouts.jsonl"
    backend = GrammarBackend(qwen3_tokenizer, ["Paris.", "Lyon?"])
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=out)
    await gateway.start()
    try:
        first, second = gateway.open(task_id="t1"), gateway.open(task_id="t2")
        for rollout in (first, second):
            api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
            await api.chat.completions.create(model="m", messages=USER)
        writer = gateway.writer._writer
        assert writer is not None
        write = writer.write

        def full_disk(record: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(writer, "write", full_disk)
        async with aiohttp.ClientSession() as session:
            url = f"{gateway.base_url}/rollouts/{first.id}/finish"
            async with session.post(url, json={"reward": 1.0}, headers={"Authorization": f"Bearer {first.token}"}) as r:
                assert r.status == 507
                error = (await r.json())["error"]
            assert "No space left on device" in error["message"] and "kept" in error["message"]
            assert not out.read_bytes()
            monkeypatch.setattr(writer, "write", write)  # the disk has room again
            url = f"{gateway.base_url}/rollouts/{second.id}/finish"
            async with session.post(url, json={"reward": 0.0}, headers={"Authorization": f"Bearer {second.token}"}):
                pass
    finally:
        await gateway.close()
    assert [(r.task_id, r.reward) for r in read_records(out)] == [("t1", 1.0), ("t2", 0.0)]

"""Several inference servers: sticky least-loaded routing over real local sockets, and draining unhealthy ones."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from strands import tool

from tito_core import arollout
from tito_core.backend import Backend, GenerateRequest, GenerateResult
from tito_core.runner import read_records
from tito_core.runner.servers import ServerPool
from tito_core.tokenizers import load_tokenizer

from ..faults.server import FaultServer
from .helpers import tasks, tokenizer_dir

pytest.importorskip("tito_sglang")


def _config(urls: list[str], **rollout: Any) -> dict[str, Any]:
    return {
        "backend": "sglang",
        "tokenizer": tokenizer_dir(),
        "backend_options": {"base_url": urls, "retry": {"max_attempts": 1}},
        "rollout": {"tools": ["tests.runner.helpers:add"], **rollout},
    }


async def test_each_rollout_sticks_to_one_server_and_load_is_shared(tmp_path: Path) -> None:
    servers = [await FaultServer(load_tokenizer(tokenizer_dir())).start() for _ in range(2)]
    try:
        out = tmp_path / "out.jsonl"
        summary = await arollout(_config([s.url for s in servers], group_size=2, concurrency=4), tasks(8), out)
        assert summary.statuses == {"completed": 16}
        records = list(read_records(out))
        rids = {s.url: {r.rid for r in s.received if r.path == "/generate"} for s in servers}
        for record in records:
            turns = {t.rid for t in record.trajectory.turns}
            assert len(turns) == 2  # the tool call, then the answer
            assert record.server in rids
            assert turns <= rids[record.server]  # every call of the rollout went to its server...
            other = next(url for url in rids if url != record.server)
            assert not turns & rids[other]  # ...and none to the other
        share = summary.servers
        assert set(share) == set(rids) and min(share.values()) >= 4  # least-loaded: both take a fair part
    finally:
        for s in servers:
            await s.aclose()


async def test_an_unreachable_server_among_several_is_named_before_any_work(tmp_path: Path) -> None:
    server = await FaultServer(load_tokenizer(tokenizer_dir())).start()
    try:
        with pytest.raises(Exception, match=r"http://127\.0\.0\.1:9: ") as caught:
            await arollout(_config([server.url, "http://127.0.0.1:9"]), tasks(1), tmp_path / "out.jsonl")
        assert server.url not in str(caught.value)
        assert not [r for r in server.received if r.path == "/generate"]
    finally:
        await server.aclose()


class _Flaky(Backend):
    name = "flaky"

    def __init__(self) -> None:
        self.up = True

    async def health(self) -> bool:
        return self.up

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        raise NotImplementedError


async def test_a_failing_server_is_drained_then_taken_back_when_healthy() -> None:
    a, b = _Flaky(), _Flaky()
    pool = ServerPool([("a", a), ("b", b)], interval=0.02)
    pool.start()
    try:
        a.up = False
        await pool.check_all()
        async with pool.lease() as first, pool.lease() as second:
            assert (first.name, second.name) == ("b", "b")  # drained: no new rollouts on a
        a.up = True
        async with asyncio.timeout(60):  # a guard against a hang, not a speed check
            while not pool.server("a").healthy:  # until the periodic check passes, however late it runs
                await asyncio.sleep(0.01)
        async with pool.lease() as first, pool.lease() as second:
            assert {first.name, second.name} == {"a", "b"}  # least loaded: one each
    finally:
        await pool.aclose()


async def test_leases_wait_while_no_server_is_healthy() -> None:
    only = _Flaky()
    pool = ServerPool([("only", only)], interval=0.02)
    only.up = False
    await pool.check_all()

    async def take() -> str:
        async with pool.lease() as server:
            return server.name

    waiting = asyncio.create_task(take())
    await asyncio.sleep(0.1)
    assert not waiting.done()
    only.up = True
    assert await asyncio.wait_for(waiting, 60) == "only"  # a guard against a hang, not a speed check
    await pool.aclose()


_STOP: dict[str, Any] = {}


async def stop_b_on_the_sixth_call(a: int, b: int) -> int:
    """The ``add`` tool; its sixth call stops server B (resetting its connections)."""
    _STOP["calls"] = _STOP.get("calls", 0) + 1
    if _STOP["calls"] == 6:
        await _STOP["server"].stop(reset=True)
    return a + b


add_and_stop = tool(name="add")(stop_b_on_the_sixth_call)


async def test_a_server_that_dies_mid_run_is_drained(tmp_path: Path) -> None:
    a, b = [await FaultServer(load_tokenizer(tokenizer_dir())).start() for _ in range(2)]
    _STOP.clear()
    _STOP["server"] = b
    try:
        cfg = _config([a.url, b.url], concurrency=4, health_interval_s=0.05)
        cfg["rollout"]["tools"] = ["tests.runner.test_servers:add_and_stop"]
        summary = await arollout(cfg, tasks(24), tmp_path / "out.jsonl")
        records = list(read_records(tmp_path / "out.jsonl"))
        failed = [r for r in records if r.status == "failed"]
        assert len(records) == 24 and summary.statuses.get("completed", 0) == 24 - len(failed)
        assert len(failed) <= 4  # only rollouts in flight on B; later ones are routed to A
        assert all(r.server == b.url and "BackendConnectionError" in (r.status_reason or "") for r in failed)
        assert summary.servers[a.url] >= 24 - 6  # after the stop, every new rollout went to A
    finally:
        await a.aclose()
        await b.aclose()


async def test_forced_tool_calls_constrain_only_the_first_calls_of_each_rollout(tmp_path: Path) -> None:
    server = await FaultServer(load_tokenizer(tokenizer_dir()), tool_turns=2).start()
    try:
        out = tmp_path / "out.jsonl"
        cfg = _config([server.url], group_size=2, forced_tool_calls=1)
        summary = await arollout(cfg, tasks(2), out)
        assert summary.statuses == {"completed": 4}
        for record in read_records(out):
            assert [t.constrained for t in record.trajectory.turns] == [True, False, False]
    finally:
        await server.aclose()


def test_forced_tool_calls_need_tools() -> None:
    from tito_core.config import RolloutSettings
    from tito_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"forced_tool_calls` needs `rollout\.tools`"):
        RolloutSettings(forced_tool_calls=1)
    with pytest.raises(ConfigError, match="forced_tool_calls` must be >= 0"):
        RolloutSettings(forced_tool_calls=-1, tools=["m:t"])

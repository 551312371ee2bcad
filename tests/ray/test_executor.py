"""The Ray executor on a local Ray cluster against fake SGLang servers (real sockets in the test process)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tito_core import arollout
from tito_core.errors import ConfigError, TitoError
from tito_core.runner import LocalExecutor, read_records
from tito_core.runner.collector import TUNED_THRESHOLD
from tito_core.runner.ray_executor import RayExecutor
from tito_core.tokenizers import load_tokenizer

from ..faults.server import Fault, FaultServer, from_gen
from ..runner.helpers import tasks, tokenizer_dir
from .helpers import comparable, sglang_config

pytest.importorskip("tito_sglang")


@pytest.fixture(autouse=True)
def _defaults(executor: RayExecutor) -> None:
    executor.concurrency, executor.replacements = 3, 2


async def _servers(n: int) -> list[FaultServer]:
    return [await FaultServer(load_tokenizer(tokenizer_dir())).start() for _ in range(n)]


async def test_two_workers_write_every_rollout_once_sticky_to_one_server(tmp_path: Path, executor: RayExecutor) -> None:
    servers = await _servers(2)
    try:
        out = tmp_path / "out.jsonl"
        config = sglang_config([s.url for s in servers], group_size=2)
        summary = await arollout(config, tasks(10), out, executor=executor)
        assert summary.statuses == {"completed": 20} and summary.written == summary.planned == 20
        assert summary.reward_mean is not None and executor.lost == 0
        records = list(read_records(out))
        assert Counter(r.key for r in records) == Counter((f"t{i}", s) for i in range(10) for s in range(2))
        rids = {s.url: {r.rid for r in s.received if r.path == "/generate"} for s in servers}
        for record in records:
            turns = {t.rid for t in record.trajectory.turns}
            assert len(turns) == 2  # the tool call, then the answer: both calls on the rollout's server
            assert turns <= rids[record.server]
            other = next(url for url in rids if url != record.server)
            assert not turns & rids[other]
        # one routing state for the cluster: the driver's pool shares the load between the servers
        assert set(summary.servers) == set(rids) and min(summary.servers.values()) >= 6
    finally:
        for s in servers:
            await s.aclose()


async def test_ray_and_local_executors_write_the_same_records(tmp_path: Path, executor: RayExecutor) -> None:
    # The fault server tags each answer with its request id, so ids differ between runs: compare the rest.
    (server,) = await _servers(1)
    try:
        config = sglang_config([server.url], group_size=2, group_reward="tests.ray.helpers:rank")
        config["rollout"]["reward"] = "tests.ray.helpers:by_sample"
        local = await arollout(config, tasks(6), tmp_path / "local.jsonl", executor=LocalExecutor(4))
        remote = await arollout(config, tasks(6), tmp_path / "ray.jsonl", executor=executor)
        assert local.statuses == remote.statuses == {"completed": 12}
        assert local.reward_mean == remote.reward_mean == 0.5
        by_key = {r.key: comparable(r, ids=False) for r in read_records(tmp_path / "local.jsonl")}
        assert {r.key: comparable(r, ids=False) for r in read_records(tmp_path / "ray.jsonl")} == by_key
        assert [r.advantage for r in read_records(tmp_path / "ray.jsonl") if r.task_id == "t0"] in ([0, 1], [1, 0])
    finally:
        await server.aclose()


async def test_workers_roll_out_under_the_runs_gc_setting(tmp_path: Path, executor: RayExecutor) -> None:
    (server,) = await _servers(1)
    try:
        config = sglang_config([server.url], reward="tests.runner.helpers:gc_threshold")  # gc = "tuned": the default
        await arollout(config, tasks(3), tmp_path / "tuned.jsonl", executor=executor)
        assert [r.reward for r in read_records(tmp_path / "tuned.jsonl")] == [float(TUNED_THRESHOLD[0])] * 3
        config["rollout"]["gc"] = "default"  # the same actors, rebuilt for the new config: the tuning is undone
        await arollout(config, tasks(3), tmp_path / "default.jsonl", executor=executor)
        rewards = [r.reward for r in read_records(tmp_path / "default.jsonl")]
        assert len(rewards) == 3 and float(TUNED_THRESHOLD[0]) not in rewards
    finally:
        await server.aclose()


async def test_a_config_that_cannot_travel_to_workers_is_named(tmp_path: Path, executor: RayExecutor) -> None:
    import httpx

    (server,) = await _servers(1)
    try:
        config = sglang_config([server.url])
        config["backend_options"]["transport"] = httpx.AsyncHTTPTransport()  # holds an SSL context: no pickle
        with pytest.raises(ConfigError, match="cannot be sent to Ray workers"):
            await arollout(config, tasks(1), tmp_path / "out.jsonl", executor=executor)
    finally:
        await server.aclose()


async def _kill_when(
    executor: RayExecutor, server: FaultServer, run: asyncio.Future[Any], out: Path, lines: int, workers: int
) -> None:
    """Kill ``workers`` of the executor's actors once ``out`` holds ``lines`` records and every lane of every
    worker is mid-rollout, then let the rest run.

    The server holds every generation request from the one after the ``lines`` records' calls on, so nothing
    can finish meanwhile: the kill lands with each killed worker's rollouts in flight, however slow the machine.
    """
    import ray

    lanes = executor.workers * (executor.concurrency or 1)
    release = asyncio.Event()
    # each rollout makes two calls: with every lane held, ``lines`` rollouts are done, at least
    rule = server.inject(Fault.hold(release), from_gen(2 * lines + lanes), times=-1)
    try:
        async with asyncio.timeout(600):  # a guard against a hang (the workers' start included), not a speed check
            while server.holding < lanes or not out.exists() or out.read_text().count("\n") < lines:
                assert not run.done(), f"the run ended before the kill: {run.exception() or 'completed'}"
                await asyncio.sleep(0.02)
        for handle in list(executor.actors)[:workers]:
            ray.kill(handle, no_restart=True)
    finally:
        rule.times = 0
        release.set()


async def test_a_killed_worker_loses_only_its_rollouts_in_flight_which_run_elsewhere(
    tmp_path: Path, executor: RayExecutor
) -> None:
    (server,) = await _servers(1)
    try:
        out = tmp_path / "out.jsonl"
        executor.replacements = 0
        config = sglang_config([server.url], group_size=2)
        run = asyncio.ensure_future(arollout(config, tasks(12), out, executor=executor))
        await _kill_when(executor, server, run, out, 4, 1)
        summary = await run
        assert executor.lost == 1
        assert summary.statuses == {"completed": 24} and summary.written == 24
        keys = Counter(r.key for r in read_records(out))
        assert keys == Counter((f"t{i}", s) for i in range(12) for s in range(2))  # each exactly once
    finally:
        await server.aclose()


async def test_losing_every_worker_stops_the_run_and_a_rerun_completes_it(
    tmp_path: Path, executor: RayExecutor
) -> None:
    (server,) = await _servers(1)
    try:
        out = tmp_path / "out.jsonl"
        executor.concurrency, executor.replacements = 2, 0
        config = sglang_config([server.url], group_size=2)
        run = asyncio.ensure_future(arollout(config, tasks(12), out, executor=executor))
        await _kill_when(executor, server, run, out, 3, 2)
        with pytest.raises(TitoError, match="every Ray worker was lost"):
            await run
        before = [r.key for r in read_records(out)]
        assert 3 <= len(before) < 24 and len(set(before)) == len(before)  # whole records, none twice
        executor.replacements = 2
        summary = await arollout(config, tasks(12), out, executor=executor)  # two fresh workers
        assert summary.skipped == len(before) and summary.written == 24 - len(before)
        assert summary.file_records == 24 and summary.file_statuses == {"completed": 24}
        keys = Counter(r.key for r in read_records(out))
        assert keys == Counter((f"t{i}", s) for i in range(12) for s in range(2))
    finally:
        await server.aclose()

"""The gateway's workers as Ray actors on a local Ray cluster: the same door, one output, and a killed actor's
rollouts written ``failed`` from its journal with every call it answered."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tito_core.config import TitoConfig
from tito_core.gateway.ray_workers import RayWorkerPool
from tito_core.records import read_records
from tito_core.tokenizers import load_tokenizer
from tito_testing.gate import FileGate
from tito_testing.tokenizers import qwen_tokenizer_dir

from ..gateway.test_workers import _config, serve  # noqa: F401  (serve: the fixture, `tito serve` in a subprocess)

USER = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
GUARD_S = 300  # hang guards only


async def _post(session: aiohttp.ClientSession, url: str, body: Any, token: str = "") -> tuple[int, Any]:
    try:
        async with session.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
            return response.status, await response.json()
    except aiohttp.ClientError as exc:  # the actor died under the call
        return 0, repr(exc)


def _worker_of(opened: dict[str, Any]) -> str:
    return str(opened["base_url"]).split("/rollouts/")[0]


async def _until_held(gate: FileGate, count: int) -> None:
    async with asyncio.timeout(GUARD_S):
        while gate.arrived() < count:
            await asyncio.sleep(0.01)


async def test_a_killed_gateway_actor_loses_no_answered_call(ray_cluster: Any, tmp_path: Path) -> None:
    gate = FileGate(tmp_path / "gate")
    tok = str(qwen_tokenizer_dir("qwen3"))
    replies = [f"answer {i}" for i in range(20)]
    config = TitoConfig(
        backend="scripted",
        tokenizer=tok,
        backend_options={"tokenizer": tok, "gate": str(gate.path), "replies": replies},
    )
    out = tmp_path / "out.jsonl"
    pool = RayWorkerPool(config, 2, output=out, num_cpus=0.25)
    try:
        front = await asyncio.wait_for(pool.start(), GUARD_S)
        async with aiohttp.ClientSession() as session:
            opened = [(await _post(session, f"{front}/rollouts", {"task_id": f"t{i}"}))[1] for i in range(4)]
            assert len({_worker_of(o) for o in opened}) == 2  # both actors serve rollouts
            gate.open()
            first = [await _post(session, f"{o['base_url']}/chat/completions", USER, o["token"]) for o in opened]
            assert [status for status, _ in first] == [200] * 4
            (gate.path / "open").unlink()  # closed again: the second calls are held
            bodies = [
                {
                    "model": "m",
                    "messages": [*USER["messages"], a["choices"][0]["message"], {"role": "user", "content": "more"}],
                }
                for _, a in first
            ]
            second = [
                asyncio.ensure_future(_post(session, f"{o['base_url']}/chat/completions", b, o["token"]))
                for o, b in zip(opened, bodies, strict=True)
            ]
            await _until_held(gate, 8)
            victim = _worker_of(opened[0])
            actor = next(w.handle for w in pool.workers if w.base_url == victim)
            ray_cluster.kill(actor)
            await asyncio.wait_for(pool.lost_changed.wait(), GUARD_S)
            gate.open()
            answers = await asyncio.gather(*second)
    finally:
        await asyncio.wait_for(pool.close(), GUARD_S)
    (lost,) = pool.lost
    lost_ids = {o["id"] for o in opened if _worker_of(o) == victim}
    assert lost.recovered == len(lost_ids) == 2
    records = {r.trajectory.rollout_id: r for r in read_records(out)}
    assert set(records) == {o["id"] for o in opened} and len(list(read_records(out))) == 4  # one each
    for o, (_, answer), (status, later) in zip(opened, first, answers, strict=True):
        traj = records[o["id"]].trajectory
        outputs = [traj.token_ids[s.start : s.end] for s in traj.segments if s.kind == "output"]
        if o["id"] in lost_ids:
            assert status != 200
            assert records[o["id"]].status == "failed"
            assert (records[o["id"]].status_reason or "").startswith("gateway worker lost")
            assert outputs == [answer["tito"]["output_ids"]]
        else:
            assert status == 200
            assert outputs == [answer["tito"]["output_ids"], later["tito"]["output_ids"]]


async def test_a_run_puts_its_agents_gateway_workers_on_ray(ray_cluster: Any, tmp_path: Path) -> None:
    """`[rollout.gateway] ray`: the runner's gateway workers are two Ray actors; each rollout's calls all go to one
    of them, both serve, and the run writes one record per rollout."""
    from tests.runner.helpers import pid_of
    from tests.runner.test_gateway_pool import pool_config
    from tito_core import Trajectory, arollout

    config = pool_config(group_size=2)
    config["rollout"]["gateway"] = {"workers": 2, "ray": "auto", "num_cpus": 0.25}
    tasks = [{"id": f"t{i}", "prompt": f"What is 2 + {i}?"} for i in range(2)]
    out = tmp_path / "out.jsonl"
    summary = await asyncio.wait_for(arollout(config, tasks, out), GUARD_S)
    assert summary.written == 4 and summary.statuses == {"completed": 4}
    records = list(read_records(out))
    assert sorted(r.key for r in records) == [(f"t{i}", s) for i in range(2) for s in range(2)]
    pids: set[int] = set()
    for record in records:
        traj = Trajectory.from_record(record.trajectory)
        tokenizer = load_tokenizer(str(qwen_tokenizer_dir("qwen3")))
        texts = [tokenizer.decode(traj.token_ids[s.start : s.end]) for s in traj.segments if s.kind == "output"]
        (pid,) = {pid_of(text) for text in texts}  # one actor per rollout
        pids.add(pid)
    assert len(pids) == 2 and os.getpid() not in pids


def test_the_ray_executor_refuses_a_gateway_pool() -> None:
    from tests.runner.test_gateway_pool import pool_config
    from tito_core.config import load_config
    from tito_core.errors import ConfigError
    from tito_core.runner.ray_executor import RayExecutor

    settings = load_config(pool_config()).rollout
    with pytest.raises(ConfigError, match=r"`\[rollout.gateway\]` with Ray workers"):
        RayExecutor(1).prestart(settings)


async def test_tito_serve_on_ray_drains_on_sigterm(serve: Any, ray_cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    """`tito serve --workers 1 --ray ADDRESS` (the shipping command, joining this suite's cluster) drains on SIGTERM:
    the call held in the actor is answered 200 and recorded, the command exits 0 and no journal is left. (Ray's
    `ray.init` puts in its own SIGTERM handler, which ended the supervisor at once.) One actor: the suite's shared
    executor holds one of the cluster's two CPUs."""
    gate = FileGate(tmp_path / "gate")
    out = tmp_path / "out.jsonl"
    address = ray_cluster.get_runtime_context().gcs_address
    served = await serve(_config(tmp_path, gate, 4), out, 1, "--ray", address, "--drain-s", "600")
    async with aiohttp.ClientSession() as session:
        status, opened = await _post(session, f"{served.base}/rollouts", {"task_id": "t"})
        assert status == 201, opened
        call = asyncio.ensure_future(_post(session, f"{opened['base_url']}/chat/completions", USER, opened["token"]))
        await _until_held(gate, 1)
        served.proc.send_signal(signal.SIGTERM)
        await served.stderr_line("shutting down; ")
        gate.open()
        status, answer = await call
    assert await asyncio.wait_for(served.proc.wait(), GUARD_S) == 0
    assert status == 200, answer
    (record,) = read_records(out)
    traj = record.trajectory
    assert [traj.token_ids[s.start : s.end] for s in traj.segments if s.kind == "output"] == [
        answer["tito"]["output_ids"]
    ]
    assert not (tmp_path / "out.jsonl.journal").exists()

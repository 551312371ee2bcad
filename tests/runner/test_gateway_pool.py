"""`tito rollout` with `[rollout.gateway]`: the agents' gateway in worker processes, the run's output its one file.

Each run starts real gateway worker processes (the scripted backend in each; every reply names the pid that made
it) and a callable agent that calls them over local sockets; the runner writes the records. The lost-worker test
kills a worker with SIGKILL while each of its rollouts has an answered call and its agent waits.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tito_core import Trajectory, arollout
from tito_core.config import load_config
from tito_core.errors import ConfigError
from tito_core.records import read_records
from tito_core.tokenizers import load_tokenizer

from . import helpers
from .helpers import Hold, pid_of, tokenizer_dir

AGENT = "tests.runner.helpers:two_calls_agent"
GUARD_S = 300  # hang guard only: every wait ends on an event


def pool_config(workers: int = 2, **rollout: Any) -> dict[str, Any]:
    """A config on the scripted backend (built in each worker, from the pickled tokenizer: replies naming the pid)."""
    tok = tokenizer_dir()
    return {
        "backend": "scripted",
        "tokenizer": tok,
        "backend_options": {"tokenizer": load_tokenizer(tok), "replies": [helpers.served_by] * 100},
        "rollout": {"concurrency": 4, **rollout, "agent": {"callable": AGENT}, "gateway": {"workers": workers}},
    }


def _tasks(n: int, **metadata: Any) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "prompt": f"What is 2 + {i}?", "metadata": dict(metadata)} for i in range(n)]


def _outputs(traj: Trajectory) -> list[str]:
    tokenizer = load_tokenizer(tokenizer_dir())
    return [tokenizer.decode(traj.token_ids[s.start : s.end]) for s in traj.segments if s.kind == "output"]


def _pids(traj: Trajectory) -> set[int]:
    return {pid_of(text) for text in _outputs(traj)}


async def test_agents_run_on_two_gateway_workers_and_the_run_writes_one_record_each(tmp_path: Path) -> None:
    """Six rollouts on two workers: each one's calls all on one worker, both workers used, one record per rollout in
    the run's output (an agent that raised ends ``failed`` with its error, its answered call kept), resumable."""
    out = tmp_path / "out.jsonl"
    tasks = [*_tasks(2), {"id": "t2", "prompt": "What is 2 + 2?", "metadata": {"fail": True}}]
    summary = await arollout(pool_config(group_size=2), tasks, out)
    assert summary.written == 6 and summary.statuses == {"completed": 4, "failed": 2}
    records = list(read_records(out))
    assert Counter(r.key for r in records) == Counter({(f"t{i}", s): 1 for i in range(3) for s in range(2)})
    served: set[int] = set()
    for record in records:
        traj = Trajectory.from_record(record.trajectory)
        assert traj.rollout_id == f"{record.task_id}:{record.sample}" and traj.metadata["gateway_end"] == "finish"
        (pid,) = _pids(traj)  # a rollout lives on one worker for its whole life
        served.add(pid)
        if record.task_id == "t2":  # the agent raised after its first call: as an in-process gateway records it
            assert (record.status, record.status_reason) == ("failed", "LookupError: no such tool for t2")
            assert len(traj.turns) == 1
        else:
            assert record.status == "completed" and len(traj.turns) == 2
    assert len(served) == 2 and os.getpid() not in served  # two worker processes, neither of them this one
    assert not out.with_name("out.jsonl.journal").exists()  # the journals were read and removed
    again = await arollout(pool_config(group_size=2), tasks, out)  # resume: everything is there
    assert again.written == 0 and len(list(read_records(out))) == 6


async def test_a_killed_gateway_worker_fails_its_rollouts_with_their_answered_calls(tmp_path: Path) -> None:
    """SIGKILL of one worker while each of its rollouts has an answered call: their agents are stopped and each is
    written ``failed`` ("gateway worker lost") with that call; the other worker's rollouts complete; a rerun with
    ``retry_failed`` runs only the lost ones, on fresh workers."""
    out = tmp_path / "out.jsonl"
    helpers.HOLD = hold = Hold(4)
    run = asyncio.create_task(arollout(pool_config(), _tasks(4, hold=True), out))
    try:
        async with asyncio.timeout(GUARD_S):
            await asyncio.wait({run, asyncio.create_task(hold.all_in.wait())}, return_when=asyncio.FIRST_COMPLETED)
        assert not run.done(), run.result()
        by_pid = Counter(pid for _, pid in hold.arrived)
        assert len(by_pid) == 2  # both workers hold rollouts
        killed = hold.arrived[0][1]
        os.kill(killed, signal.SIGKILL)
        hold.release.set()  # the other worker's agents go on
        async with asyncio.timeout(GUARD_S):
            summary = await run
    finally:
        hold.release.set()
        if not run.done():
            run.cancel()
    lost = {task for task, pid in hold.arrived if pid == killed}
    assert summary.statuses == {"failed": len(lost), "completed": 4 - len(lost)}
    records = {r.task_id: r for r in read_records(out)}
    assert len(records) == 4 == len(list(read_records(out)))  # one record per rollout
    for task, record in records.items():
        traj = Trajectory.from_record(record.trajectory)
        if task in lost:
            assert record.status == "failed" and record.status_reason is not None
            assert record.status_reason.startswith("gateway worker lost: worker ")
            assert "killed by signal 9" in record.status_reason
            assert _outputs(traj) == [f"served by {killed}<|im_end|>"]  # its answered call, from the journal
            assert traj.rollout_id == f"{task}:0"
        else:
            assert record.status == "completed" and len(traj.turns) == 2 and killed not in _pids(traj)
    rerun = await arollout(pool_config(retry_failed=True), _tasks(4, hold=True), out)
    assert rerun.written == len(lost) and rerun.statuses == {"completed": len(lost)}
    final = list(read_records(out))
    assert Counter(r.key for r in final) == Counter({(f"t{i}", 0): 1 for i in range(4)})
    assert {r.status for r in final} == {"completed"}


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ({"workers": 0}, "`rollout.gateway.workers` must be an integer of at least 1, got 0"),
        ({"workers": True}, "rollout.gateway.workers"),
        ({"workers": "2"}, "rollout.gateway.workers"),
        ({}, "rollout.gateway"),
        ({"workers": 2, "ray": " "}, "`rollout.gateway.ray` must be a Ray address"),
        ({"workers": 2, "num_cpus": 0.5}, "`rollout.gateway.num_cpus` is the CPUs Ray reserves per worker actor"),
        ({"workers": 2, "ray": "auto", "num_cpus": 0}, "`rollout.gateway.num_cpus` must be positive"),
        ({"worker": 2}, "unknown key `rollout.gateway.worker`"),
    ],
)
def test_bad_gateway_tables_are_config_errors(gateway: dict[str, Any], message: str) -> None:
    config = pool_config()
    config["rollout"]["gateway"] = gateway
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("`", "`")):
        load_config(config)


def test_a_gateway_table_needs_an_agent() -> None:
    config = pool_config()
    del config["rollout"]["agent"]
    with pytest.raises(ConfigError, match=r"`rollout.gateway` runs the gateway of `\[rollout.agent\]` rollouts"):
        load_config(config)

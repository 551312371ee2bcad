"""Many rollouts through `tito serve --workers 2` at 10 % engine faults, one worker SIGKILLed mid-run.

The small version of issue 52's 10,000-rollout run (no Ray, no weight update): the fault server (in the test's
process, SGLang's dialect) misbehaves at random, an agent loop per rollout drives chat completions with the add
tool through the front address, and one worker is killed while one of its rollouts is known to be open. Then:
every opened rollout has exactly one record with a terminal status; every output the client got with a 200 is in
its rollout's record; every recorded output is exactly the server's answer to the very prompt recorded before it
(the suite's ``check_trajectory``); the rollout held open on the killed worker is ``failed``, "gateway worker lost".
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tito_core.records import read_records
from tito_core.trajectory import Trajectory
from tito_testing.tokenizers import qwen_tokenizer_dir

from .conftest import SYSTEM, TERMINAL, check_trajectory
from .server import Fault, FaultServer

ROLLOUTS = 24
GUARD_S = 240  # hang guards only
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
FAULTS = (Fault.http_status(500), Fault.http_status(503), Fault.reset(after_read=True), Fault.bad("id_vocab"))


async def _start(tmp_path: Path, engine: str, out: Path) -> tuple[asyncio.subprocess.Process, str, dict[str, int]]:
    tok = json.dumps(str(qwen_tokenizer_dir("qwen3")))
    cfg = tmp_path / "tito.toml"
    cfg.write_text(
        f'backend = "sglang"\ntokenizer = {tok}\ntool_parser = "hermes"\n[sampling]\nmax_new_tokens = 64\n'
        f"[backend_options]\nbase_url = {json.dumps(engine)}\ntimeout = 60.0\n"
    )
    code = "import sys; from tito_core.cli import main; sys.exit(main())"
    args = ["serve", "--config", str(cfg), "--port", "0", "-o", str(out), "--workers", "2"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    lines = [(await asyncio.wait_for(proc.stdout.readline(), GUARD_S)).decode() for _ in range(3)]
    assert lines[0].startswith("tito serve: serving on "), lines
    pids = {line.split(" on ")[1].split()[0]: int(line.rsplit("pid ", 1)[1].rstrip(")\n")) for line in lines[1:]}
    return proc, lines[0].rsplit(" ", 1)[1].strip(), pids


class Client:
    """The agent loop of each rollout, and what it saw."""

    def __init__(self, session: aiohttp.ClientSession, front: str) -> None:
        self.session = session
        self.front = front
        self.answered: dict[str, list[list[int]]] = {}  # rollout id -> the output ids of each 200
        self.opened: dict[str, str] = {}  # rollout id -> its worker
        self.calls = 0
        self.progress = asyncio.Event()  # set after each 200

    async def rollout(self, index: int, hold: asyncio.Event | None = None, ready: asyncio.Event | None = None) -> None:
        async with self.session.post(f"{self.front}/rollouts", json={"task_id": f"t{index}"}) as response:
            assert response.status == 201, await response.text()
            opened = await response.json()
        rid, base, token = opened["id"], opened["base_url"], opened["token"]
        self.opened[rid], self.answered[rid] = base.split("/rollouts/")[0], []
        headers = {"Authorization": f"Bearer {token}"}
        messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count with add."}]
        try:
            for _ in range(6):
                body = {"model": "m", "messages": messages, "tools": [ADD]}
                async with self.session.post(f"{base}/chat/completions", json=body, headers=headers) as response:
                    if response.status != 200:
                        break
                    answer = await response.json()
                self.answered[rid].append(answer["tito"]["output_ids"])
                self.calls += 1
                self.progress.set()
                message = answer["choices"][0]["message"]
                messages.append(message)
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    args = json.loads(call["function"]["arguments"])
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])})
            if hold is not None and ready is not None:
                ready.set()
                await hold.wait()  # open until its worker is killed
            async with self.session.post(f"{base.removesuffix('/v1')}/finish", json={}, headers=headers):
                pass
        except aiohttp.ClientError:
            return  # its worker is gone


async def test_many_rollouts_at_faults_with_a_worker_killed_lose_nothing_answered(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    server = await FaultServer(qwen3_tokenizer, tool_turns=3, sessions=True).start()
    out = tmp_path / "out.jsonl"
    proc, front, pids = await _start(tmp_path, server.url, out)
    killed = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(session, front)
            ready = asyncio.Event()  # the held rollout answered to its end, without faults, and stays open
            held = asyncio.ensure_future(client.rollout(0, hold=killed, ready=ready))
            await asyncio.wait_for(ready.wait(), GUARD_S)
            server.random_faults(0.1, 7, FAULTS)
            victim = next(iter(client.opened.values()))  # the worker to kill
            others = [asyncio.ensure_future(client.rollout(i)) for i in range(1, ROLLOUTS)]
            async with asyncio.timeout(GUARD_S):
                while client.calls < ROLLOUTS:  # about a quarter of the calls answered: mid-run
                    await client.progress.wait()
                    client.progress.clear()
            os.kill(pids[victim], signal.SIGKILL)
            assert proc.stderr is not None
            async with asyncio.timeout(GUARD_S):
                while "rollouts written as failed" not in (said := (await proc.stderr.readline()).decode()):
                    assert said, "tito serve exited without saying a worker was lost"
            killed.set()
            await asyncio.wait_for(asyncio.gather(held, *others), GUARD_S)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), GUARD_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.aclose()
    records = list(read_records(out))
    by_id = {r.trajectory.rollout_id: r for r in records}
    assert len(records) == len(by_id) == ROLLOUTS  # one record each, none twice
    assert set(by_id) == set(client.opened)
    assert sum(1 for r in server.received if r.fault) > 0  # the faults were there
    for rid, outputs in client.answered.items():
        record = by_id[rid]
        assert record.status in TERMINAL and (record.status == "completed" or record.status_reason)
        traj = Trajectory.from_record(record.trajectory)
        check_trajectory(server, traj)
        recorded = [b.token_ids[s.start : s.end] for b in traj.all_branches for s in b.segments if s.kind == "output"]
        assert all(ids in recorded for ids in outputs), f"{rid}: an output answered 200 is not in its record"
    held_id = next(iter(client.opened))
    assert by_id[held_id].status == "failed"
    assert (by_id[held_id].status_reason or "").startswith("gateway worker lost")
    assert len(client.answered[held_id]) == 4  # its calls, answered 200: all in its record (checked above)

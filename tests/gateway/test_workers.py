"""`tito serve --workers N`: N gateway processes, one merged output, and a lost worker loses nothing answered.

Each test runs the shipping command in a subprocess over real local sockets: the supervisor's door opens rollouts
on the workers, the client talks to each worker directly, the engine is the scripted backend held at a gate the
test opens (files, so it holds calls in the worker processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tito_core.records import open_writer, read_records
from tito_testing.gate import FileGate
from tito_testing.tokenizers import qwen_tokenizer_dir

USER = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
KEY = "tito-test-key-0123456789"
GUARD_S = 180  # hang guards only: every wait below ends on an event


class Served:
    """A running `tito serve --workers N`: its door, its workers' addresses and pids, its process."""

    def __init__(self, proc: asyncio.subprocess.Process, base: str, workers: dict[str, int]) -> None:
        self.proc = proc
        self.base = base
        self.workers = workers  # base URL -> pid

    async def stderr_line(self, needle: str) -> str:
        assert self.proc.stderr is not None
        async with asyncio.timeout(GUARD_S):
            while needle not in (said := (await self.proc.stderr.readline()).decode()):
                assert said, f"tito serve exited without saying {needle!r}"
        return said


def _config(tmp_path: Path, gate: FileGate, replies: int) -> Path:
    tok = json.dumps(str(qwen_tokenizer_dir("qwen3")))
    cfg = tmp_path / "tito.toml"
    answers = json.dumps([f"answer {i}" for i in range(replies)])
    options = f"tokenizer = {tok}\ngate = {json.dumps(str(gate.path))}\nreplies = {answers}\n"
    cfg.write_text(f'backend = "scripted"\ntokenizer = {tok}\n[backend_options]\n{options}')
    return cfg


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Any]:
    procs: list[asyncio.subprocess.Process] = []

    async def start(cfg: Path, out: Path, workers: int, *extra: str) -> Served:
        code = "import sys; from tito_core.cli import main; sys.exit(main())"
        args = ["serve", "--config", str(cfg), "--port", "0", "-o", str(out), "--workers", str(workers), *extra]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        procs.append(proc)
        assert proc.stdout is not None
        lines = [(await asyncio.wait_for(proc.stdout.readline(), GUARD_S)).decode() for _ in range(1 + workers)]
        assert lines[0].startswith("tito serve: serving on "), lines
        base = lines[0].rsplit(" ", 1)[1].strip()
        pids = {line.split(" on ")[1].split()[0]: int(line.rsplit("pid ", 1)[1].rstrip(")\n")) for line in lines[1:]}
        return Served(proc, base, pids)

    yield start
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _post(session: aiohttp.ClientSession, url: str, body: Any, token: str = "") -> tuple[int, Any]:
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
        return response.status, await response.json()


async def _call(session: aiohttp.ClientSession, opened: dict[str, Any], body: Any = USER) -> tuple[int, Any]:
    try:
        return await _post(session, f"{opened['base_url']}/chat/completions", body, opened["token"])
    except aiohttp.ClientError as exc:  # the worker died under the call
        return 0, repr(exc)


async def _until_held(gate: FileGate, count: int) -> None:
    async with asyncio.timeout(GUARD_S):
        while gate.arrived() < count:
            await asyncio.sleep(0.01)


def _next_turn(answer: Any) -> Any:
    """The conversation after ``answer``, with one more user turn."""
    reply = answer["choices"][0]["message"]
    return {"model": "m", "messages": [*USER["messages"], reply, {"role": "user", "content": "more"}]}


def _worker_of(opened: dict[str, Any]) -> str:
    return str(opened["base_url"]).split("/rollouts/")[0]


def _outputs(out: Path) -> dict[str, list[list[int]]]:
    recorded: dict[str, list[list[int]]] = {}
    for record in read_records(out):
        traj = record.trajectory
        recorded[traj.rollout_id] = [traj.token_ids[s.start : s.end] for s in traj.segments if s.kind == "output"]
    return recorded


async def test_workers_serve_rollouts_on_their_own_ports_and_drain_into_one_output(serve: Any, tmp_path: Path) -> None:
    """Two workers with an api key: the door checks it, spreads rollouts over both ports and routes nothing else;
    each worker port keeps the gateway's checks; SIGTERM with a call held on each worker answers both 200, each in
    the one merged output, where every opened rollout has exactly one record with a sample number of its own."""
    gate = FileGate(tmp_path / "gate")
    out = tmp_path / "out.jsonl"
    served = await serve(_config(tmp_path, gate, 40), out, 2, "--drain-s", "600", "--api-key", KEY)
    async with aiohttp.ClientSession() as session:
        status, body = await _post(session, f"{served.base}/rollouts", {"task_id": "t"}, "not-the-key")
        assert status == 401 and "not-the-key" not in json.dumps(body)  # the door checks the key
        opened = [(await _post(session, f"{served.base}/rollouts", {"task_id": "t"}, KEY))[1] for _ in range(6)]
        assert all(KEY not in json.dumps(o) for o in opened)  # never echoed
        assert {_worker_of(o) for o in opened} == set(served.workers)  # both workers got rollouts
        named = await _post(session, f"{served.base}/rollouts", {"task_id": "t", "id": "mine"}, KEY)
        again = await _post(session, f"{served.base}/rollouts", {"task_id": "t", "id": "mine"}, KEY)
        assert named[0] == 201 and again[0] == 409, again  # an id the client names goes to one worker, once
        assert again[1]["error"]["code"] == "rollout_exists"
        opened.append(named[1])
        status, body = await _post(session, f"{served.base}/rollouts/{opened[0]['id']}/v1/chat/completions", USER)
        assert status == 404 and "base_url" in body["error"]["message"]  # the door routes no call
        worker = _worker_of(opened[0])
        port = worker.rsplit(":", 1)[1]
        headers = {"Host": f"evil.example:{port}", "Authorization": f"Bearer {opened[0]['token']}"}
        async with session.post(f"{opened[0]['base_url']}/chat/completions", json=USER, headers=headers) as answer:
            assert answer.status == 403  # DNS rebinding refused on a worker port
        status, body = await _post(session, f"{opened[1]['base_url']}/chat/completions", USER, opened[0]["token"])
        assert status == 401 and opened[0]["token"] not in json.dumps(body)  # one rollout's token is not another's
        one_each = [next(o for o in opened if _worker_of(o) == w) for w in served.workers]
        calls = [asyncio.ensure_future(_call(session, o)) for o in one_each]
        await _until_held(gate, 2)
        served.proc.send_signal(signal.SIGTERM)
        await served.stderr_line("shutting down; ")
        status, body = await _post(session, f"{served.base}/rollouts", {}, KEY)
        assert status == 503  # the door takes no new rollout
        gate.open()
        answers = await asyncio.gather(*calls)
    assert await asyncio.wait_for(served.proc.wait(), GUARD_S) == 0
    assert [status for status, _ in answers] == [200, 200], answers
    recorded = _outputs(out)
    for _, answer in answers:
        assert recorded[answer["tito"]["rollout_id"]] == [answer["tito"]["output_ids"]]
    records = list(read_records(out))
    assert sorted(r.trajectory.rollout_id for r in records) == sorted(o["id"] for o in opened)
    assert sorted(r.sample for r in records) == list(range(7))  # numbered across the workers, none twice
    assert not (tmp_path / "out.jsonl.journal").exists()


async def test_a_killed_worker_loses_no_answered_call(serve: Any, tmp_path: Path) -> None:
    """SIGKILL one of two workers with a call held on each of its rollouts, after each had one call answered: its
    rollouts are written `failed` ("gateway worker lost") from its journal, each with the output it answered 200;
    the other worker goes on; every rollout has exactly one record, which a resumed run reads as done."""
    gate = FileGate(tmp_path / "gate")
    out = tmp_path / "out.jsonl"
    served = await serve(_config(tmp_path, gate, 40), out, 2)
    async with aiohttp.ClientSession() as session:
        opened = [(await _post(session, f"{served.base}/rollouts", {"task_id": f"t{i}"}))[1] for i in range(6)]
        gate.open()
        first = await asyncio.gather(*(_call(session, o) for o in opened))
        assert [status for status, _ in first] == [200] * 6
        (gate.path / "open").unlink()  # closed again: the second calls are held
        second = [
            asyncio.ensure_future(_call(session, o, _next_turn(a))) for o, (_, a) in zip(opened, first, strict=True)
        ]
        await _until_held(gate, 12)
        victim = _worker_of(opened[0])
        os.kill(served.workers[victim], signal.SIGKILL)
        said = await served.stderr_line("rollouts written as failed")
        gate.open()
        answers = await asyncio.gather(*second)
        survivors = [o for o in opened if _worker_of(o) != victim]
        for o in survivors:
            status, _ = await _post(session, f"{o['base_url'].removesuffix('/v1')}/finish", {"reward": 1.0}, o["token"])
            assert status == 200
        after = (await _post(session, f"{served.base}/rollouts", {"task_id": "late"}))[1]
        assert _worker_of(after) != victim  # the door opens on the live worker only
        served.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.proc.wait(), GUARD_S) == 0
    lost = [o for o in opened if _worker_of(o) == victim]
    assert f"; {len(lost)} rollouts written as failed" in said, said
    records = {r.trajectory.rollout_id: r for r in read_records(out)}
    assert Counter(r.trajectory.rollout_id for r in read_records(out)).most_common(1)[0][1] == 1  # none twice
    assert set(records) == {o["id"] for o in opened} | {after["id"]}
    recorded = _outputs(out)
    for o, (_, answer), (status, later) in zip(opened, first, answers, strict=True):
        if o in lost:
            assert status != 200  # its worker died under it
            assert records[o["id"]].status == "failed"
            assert (records[o["id"]].status_reason or "").startswith("gateway worker lost")
            assert recorded[o["id"]] == [answer["tito"]["output_ids"]]  # the call answered 200 is in the record
        else:
            assert status == 200
            assert recorded[o["id"]] == [answer["tito"]["output_ids"], later["tito"]["output_ids"]]
    with open_writer(out) as resumed:  # what a runner resuming on this output reads
        outcomes = resumed.outcomes()
    assert {outcomes[(f"t{opened.index(o)}", 0)][0] for o in lost} == {"failed"}
    assert len(outcomes) == 7


def _unread(port: int) -> bool:
    """Whether a connection to local ``port`` holds bytes its process has not read (/proc/net/tcp's rx_queue)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local, queues = fields[1], fields[4]
                if int(local.rsplit(":", 1)[1], 16) == port and int(queues.split(":")[1], 16) > 0:
                    return True
    return False


async def test_an_opening_whose_worker_dies_before_reading_it_opens_on_another(serve: Any, tmp_path: Path) -> None:
    """Two openings with one worker stopped (SIGSTOP): round robin sends one of them there, where it waits unread;
    then SIGKILL. The supervisor reads the worker's journal, which never opened that rollout, and the door opens it
    on the other worker: both clients get a 201 on the live worker, and each rollout has one record."""
    gate = FileGate(tmp_path / "gate")
    gate.open()
    out = tmp_path / "out.jsonl"
    served = await serve(_config(tmp_path, gate, 10), out, 2)
    victim, pid = next(iter(served.workers.items()))
    os.kill(pid, signal.SIGSTOP)
    try:
        async with aiohttp.ClientSession() as session:
            opening = [
                asyncio.ensure_future(_post(session, f"{served.base}/rollouts", {"task_id": f"t{i}"})) for i in range(2)
            ]
            async with asyncio.timeout(GUARD_S):
                while not _unread(int(victim.rsplit(":", 1)[1])):  # the door's request sits in the stopped worker
                    await asyncio.sleep(0.01)
            os.kill(pid, signal.SIGKILL)
            answers = await asyncio.gather(*opening)
            assert [status for status, _ in answers] == [201, 201], answers
            assert {_worker_of(opened) for _, opened in answers} == set(served.workers) - {victim}
            for _, opened in answers:
                assert (await _call(session, opened))[0] == 200
                finish = f"{opened['base_url'].removesuffix('/v1')}/finish"
                assert (await _post(session, finish, {}, opened["token"]))[0] == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    served.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.proc.wait(), GUARD_S) == 0
    records = list(read_records(out))
    assert sorted((r.task_id, r.status) for r in records) == [("t0", "completed"), ("t1", "completed")]
    assert sorted(r.trajectory.rollout_id for r in records) == sorted(opened["id"] for _, opened in answers)


def _accept_queue(port: int) -> int:
    """How many connections wait in the accept queue of the socket listening on local ``port`` (/proc/net/tcp)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN: rx_queue is its queue
                    return int(fields[4].split(":")[1], 16)
    return 0


async def test_the_door_and_a_worker_queue_a_burst_of_connections(serve: Any, tmp_path: Path) -> None:
    """300 connections at once to the door and to a worker, both processes stopped (SIGSTOP) so that nothing is
    accepted: the kernel queues every one until they accept. aiohttp's default backlog, 128, dropped the rest: with
    512 rollouts in flight on Ray actors, clients saw connections reset under their calls."""
    gate = FileGate(tmp_path / "gate")
    served = await serve(_config(tmp_path, gate, 2), tmp_path / "out.jsonl", 1)
    ((worker, pid),) = served.workers.items()
    ports = [int(served.base.rsplit(":", 1)[1]), int(worker.rsplit(":", 1)[1])]
    stopped = [served.proc.pid, pid]
    for each in stopped:
        os.kill(each, signal.SIGSTOP)
    sockets: list[socket.socket] = []
    try:
        for port in ports:
            for _ in range(300):
                sockets.append(socket.socket())
                sockets[-1].setblocking(False)
                sockets[-1].connect_ex(("127.0.0.1", port))
        async with asyncio.timeout(GUARD_S):
            while min(_accept_queue(port) for port in ports) < 300:
                await asyncio.sleep(0.05)
    finally:
        for each in stopped:
            os.kill(each, signal.SIGCONT)
        for sock in sockets:
            sock.close()
    served.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.proc.wait(), GUARD_S) == 0


def _ended(pid: int) -> bool:
    """Whether process ``pid`` (not a child of the test) has ended: gone, or a zombie nobody reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


async def test_journals_of_a_killed_supervisor_are_written_by_the_next(serve: Any, tmp_path: Path) -> None:
    """SIGKILL the supervisor after two calls were answered: its worker ends (its records have nowhere to go), its
    journal stays; the next `tito serve --workers` on the output writes both rollouts, `failed`, with what they
    answered, before it serves."""
    gate = FileGate(tmp_path / "gate")
    gate.open()
    out = tmp_path / "out.jsonl"
    cfg = _config(tmp_path, gate, 10)
    served = await serve(cfg, out, 1)
    async with aiohttp.ClientSession() as session:
        opened = [(await _post(session, f"{served.base}/rollouts", {"task_id": f"t{i}"}))[1] for i in range(2)]
        answers = await asyncio.gather(*(_call(session, o) for o in opened))
    assert [status for status, _ in answers] == [200, 200]
    served.proc.kill()
    await served.proc.wait()
    (pid,) = served.workers.values()
    async with asyncio.timeout(GUARD_S):
        while not _ended(pid):
            await asyncio.sleep(0.01)
    assert not out.exists() or not list(read_records(out))
    again = await serve(cfg, out, 1)
    again.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(again.proc.wait(), GUARD_S) == 0
    records = {r.trajectory.rollout_id: r for r in read_records(out)}
    assert set(records) == {o["id"] for o in opened}
    recorded = _outputs(out)
    for o, (_, answer) in zip(opened, answers, strict=True):
        assert records[o["id"]].status == "failed"
        assert (records[o["id"]].status_reason or "").startswith("gateway worker lost")
        assert recorded[o["id"]] == [answer["tito"]["output_ids"]]


async def test_rewards_answered_before_a_worker_is_killed_are_in_its_record(serve: Any, tmp_path: Path) -> None:
    """With --journal-fsync: a call answered, then a reward for it and one for its branch answered, then its worker
    SIGKILLed: the supervisor's record of the rollout is `failed` ("gateway worker lost") and holds the output and
    both rewards."""
    gate = FileGate(tmp_path / "gate")
    gate.open()
    out = tmp_path / "out.jsonl"
    served = await serve(_config(tmp_path, gate, 4), out, 1, "--journal-fsync")
    async with aiohttp.ClientSession() as session:
        opened = (await _post(session, f"{served.base}/rollouts", {"task_id": "t"}))[1]
        status, answer = await _call(session, opened)
        assert status == 200
        url, token = opened["base_url"].removesuffix("/v1"), opened["token"]
        assert await _post(session, f"{url}/reward", {"value": 0.75}, token) == (200, {"turn": 0, "value": 0.75})
        assert await _post(session, f"{url}/reward", {"value": 1, "branch": 0}, token) == (
            200,
            {"branch": 0, "value": 1},
        )
    (pid,) = served.workers.values()
    os.kill(pid, signal.SIGKILL)
    said = await served.stderr_line("rollouts written as failed")
    served.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.proc.wait(), GUARD_S) == 0
    assert "; 1 rollouts written as failed" in said, said
    (record,) = read_records(out)
    assert record.status == "failed" and (record.status_reason or "").startswith("gateway worker lost")
    assert (record.turn_rewards, record.branch_rewards) == ([0.75], [1.0])
    assert _outputs(out) == {opened["id"]: [answer["tito"]["output_ids"]]}


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--ray", "auto"], "--ray runs the gateway's workers on Ray"),
        (["--workers", "0"], "--workers must be 1"),
        (["--journal-fsync"], "--journal-fsync syncs the journals of --workers N"),
    ],
)
def test_bad_worker_flags_are_an_error_before_any_work(tmp_path: Path, flags: list[str], said: str) -> None:
    import subprocess

    tok = json.dumps(str(qwen_tokenizer_dir("qwen3")))
    cfg = tmp_path / "tito.toml"
    cfg.write_text(f'backend = "scripted"\ntokenizer = {tok}\n[backend_options]\ntokenizer = {tok}\n')
    code = "import sys; from tito_core.cli import main; sys.exit(main())"
    args = [sys.executable, "-c", code, "serve", "--config", str(cfg), "--port", "0", *flags]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)  # a hang guard only
    assert done.returncode == 2 and done.stderr.startswith(f"tito serve: error: {said}"), done.stderr


def test_a_rollout_opened_again_after_its_worker_died_keeps_its_sample_number(tmp_path: Path) -> None:
    """The door opens a rollout on another worker when the first died before opening it, and that worker may have
    asked the supervisor for the rollout's sample number already. Asked again for the same rollout id (the pipe's
    request, as a worker sends it), the supervisor gives the same number, so no sample is skipped; another rollout of
    the task gets the next one, and once the rollout's record is written its id is forgotten."""
    from tito_core.config import TitoConfig
    from tito_core.gateway.channel import SampleOf, WriteRecord, encode
    from tito_core.gateway.workers import WorkerPool
    from tito_core.records import rollout_record
    from tito_core.trajectory import Trajectory

    config = TitoConfig(backend="scripted", tokenizer=str(qwen_tokenizer_dir("qwen3")))
    pool = WorkerPool(config, 2, output=tmp_path / "out.jsonl")
    pool._writer = open_writer(tmp_path / "out.jsonl")

    def ask(task: str, rollout_id: str) -> int:
        reply = pool._answer(None, encode(SampleOf(task, rollout_id)))  # type: ignore[arg-type]
        assert reply.error is None
        return reply.sample

    assert ask("t", "first") == 0
    assert ask("t", "first") == 0  # the same rollout, opened again on another worker
    assert ask("t", "second") == 1
    assert ask("u", "first") == 0  # another task's numbering (and a rollout id reused for it)
    traj = Trajectory("second").close("completed")
    record = rollout_record(traj, task_id="t", sample=1, group=0, reward=None, server="", started=0.0, wall_s=0.0,
                            agent_s=0.0, tool_calls=0)  # fmt: skip
    assert pool._answer(None, encode(WriteRecord(record))).error is None  # type: ignore[arg-type]
    assert ask("t", "second") == 2  # written: the id is a new rollout now
    pool._writer.close()

"""The gateway's shutdown loses no answer: every 200 it sends has its output ids in a written record.

Calls in flight when the gateway closes finish within the drain, recorded before they are answered; calls past
the drain are cancelled and answered with an error, never a 200; new rollouts and calls are refused meanwhile.
Before this, SIGTERM with 30 calls in flight answered all 30 with 200 and wrote none of them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.conftest import GrammarBackend, config
from tito_core.backend import GenerateRequest, GenerateResult
from tito_core.gateway import Gateway
from tito_core.records import read_records

USER = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class HeldBackend(GrammarBackend):
    """Every generation waits until the test lets it go (``release``); ``entered`` counts the ones waiting."""

    def __init__(self, tokenizer: Any, replies: list[Any]) -> None:
        super().__init__(tokenizer, replies)
        self.release = asyncio.Semaphore(0)
        self.entered = 0
        self.arrived = asyncio.Event()  # set whenever a generation starts waiting
        self.cancelled = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.entered += 1
        self.arrived.set()
        try:
            await self.release.acquire()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await super().generate(request)


async def _post(
    session: aiohttp.ClientSession, url: str, body: Any, token: str = ""
) -> tuple[int, dict[str, str], Any]:
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
        return response.status, dict(response.headers), await response.json()


async def _until_waiting(backend: HeldBackend, count: int) -> None:
    while backend.entered < count:
        backend.arrived.clear()
        await backend.arrived.wait()


def _recorded_outputs(out: Path) -> dict[str, list[list[int]]]:
    """Each written rollout's output segments (ids), by rollout id."""
    recorded: dict[str, list[list[int]]] = {}
    for record in read_records(out):
        traj = record.trajectory
        segments = [traj.token_ids[s.start : s.end] for s in traj.segments if s.kind == "output"]
        recorded[traj.rollout_id] = segments
    return recorded


async def _start(qwen3_tokenizer: Any, out: Path, calls: int) -> tuple[Gateway, HeldBackend]:
    backend = HeldBackend(qwen3_tokenizer, [f"answer {i}" for i in range(calls)])
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=out)
    await gateway.start()
    return gateway, backend


async def _calls_in_flight(
    session: aiohttp.ClientSession, gateway: Gateway, backend: HeldBackend, count: int
) -> tuple[list[Any], list[asyncio.Future[tuple[int, dict[str, str], Any]]]]:
    """``count`` rollouts, each with a chat call held in the engine (the backend has them all)."""
    rollouts = [gateway.open(task_id=f"t{i}") for i in range(count)]
    calls = [asyncio.ensure_future(_post(session, f"{r.base_url}/chat/completions", USER, r.token)) for r in rollouts]
    await _until_waiting(backend, count)
    return rollouts, calls


async def test_calls_in_flight_at_shutdown_are_recorded_then_answered(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    gateway, backend = await _start(qwen3_tokenizer, out, 8)
    async with aiohttp.ClientSession() as session:
        rollouts, calls = await _calls_in_flight(session, gateway, backend, 8)
        closing = asyncio.ensure_future(gateway.close(drain_s=600))  # a guard: the calls end when released
        while not gateway.closing:
            await asyncio.sleep(0)
        status, headers, body = await _post(
            session, f"{rollouts[0].base_url}/chat/completions", USER, rollouts[0].token
        )
        assert status == 503 and body["error"]["code"] == "shutting_down" and headers["x-should-retry"] == "false"
        status, headers, body = await _post(session, f"{gateway.base_url}/rollouts", {})
        assert status == 503 and headers["x-should-retry"] == "false"
        assert not closing.done()  # still draining: nothing written yet
        for _ in range(8):
            backend.release.release()
        answers = await asyncio.gather(*calls)
        await closing
    assert [status for status, _, _ in answers] == [200] * 8
    recorded = _recorded_outputs(out)
    for rollout, (_, _, answer) in zip(rollouts, answers, strict=True):
        assert recorded[rollout.id] == [answer["tito"]["output_ids"]]  # what was answered is what was written
    assert {r.status for r in read_records(out)} == {"aborted"}  # not finished by the client: ended by shutdown


async def test_calls_past_the_drain_are_cancelled_and_never_answered_200(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    gateway, backend = await _start(qwen3_tokenizer, out, 4)
    async with aiohttp.ClientSession() as session:
        _, calls = await _calls_in_flight(session, gateway, backend, 3)
        await gateway.close(drain_s=0.05)  # nothing is released: all three outlive the drain
        answers = await asyncio.gather(*calls)
    assert backend.cancelled == 3
    for status, headers, body in answers:
        assert status == 503 and body["error"]["code"] == "shutting_down" and headers["x-should-retry"] == "false"
    records = list(read_records(out))
    assert len(records) == 3 and all(r.status == "aborted" for r in records)
    assert all(r.tokens.output == 0 for r in records)  # nothing was generated, nothing recorded as output


async def test_a_second_signal_stops_the_drain(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    gateway, backend = await _start(qwen3_tokenizer, out, 2)
    async with aiohttp.ClientSession() as session:
        _, (call,) = await _calls_in_flight(session, gateway, backend, 1)
        closing = asyncio.ensure_future(gateway.close(drain_s=600))
        while not gateway.closing:
            await asyncio.sleep(0)
        gateway.stop_draining()
        await closing  # returns without the 600 s: the call was cancelled
        status, _, _ = await call
    assert status == 503 and backend.cancelled == 1
    (record,) = read_records(out)
    assert record.status == "aborted"


async def test_sigterm_to_tito_serve_with_calls_in_flight_writes_every_answer(tmp_path: Path) -> None:
    """The shipping path: `tito serve` in a subprocess, SIGTERM while 10 calls are held in the engine (a gate the
    test opens). The gateway counts the 10 in flight; a call after the signal is a 503; each held call is then
    answered 200 and found in a record, and every opened rollout is written."""
    import json
    import signal
    import sys

    from tito_testing.gate import FileGate
    from tito_testing.tokenizers import qwen_tokenizer_dir

    gate = FileGate(tmp_path / "gate")
    tok = json.dumps(str(qwen_tokenizer_dir("qwen3")))
    cfg = tmp_path / "tito.toml"
    replies = json.dumps([f"answer {i}" for i in range(20)])
    options = f"tokenizer = {tok}\ngate = {json.dumps(str(gate.path))}\nreplies = {replies}\n"
    cfg.write_text(f'backend = "scripted"\ntokenizer = {tok}\n[backend_options]\n{options}')
    out = tmp_path / "served.jsonl"
    code = "import sys; from tito_core.cli import main; sys.exit(main())"
    args = ["serve", "--config", str(cfg), "--port", "0", "--output", str(out), "--drain-s", "600"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()  # hang guard only
        base = line.rsplit(" ", 1)[1].strip()
        async with aiohttp.ClientSession() as session:
            opened = [(await _post(session, f"{base}/rollouts", {"task_id": f"t{i}"}))[2] for i in range(11)]
            late = opened.pop()
            calls = [
                asyncio.ensure_future(_post(session, f"{o['base_url']}/chat/completions", USER, o["token"]))
                for o in opened
            ]
            async with asyncio.timeout(120):  # hang guard only
                while gate.arrived() < 10:
                    await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(120):  # hang guard only: the line comes once the gateway refuses new calls
                while "shutting down; " not in (said := (await proc.stderr.readline()).decode()):
                    assert said, "tito serve exited without saying it was shutting down"
            in_flight = int(said.split("shutting down; ", 1)[1].split(" ", 1)[0])
            refused = await _post(session, f"{late['base_url']}/chat/completions", USER, late["token"])
            gate.open()
            answers = await asyncio.gather(*calls)
        assert await asyncio.wait_for(proc.wait(), 300) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert in_flight == 10
    status, headers, body = refused
    assert status == 503 and body["error"]["code"] == "shutting_down" and headers["x-should-retry"] == "false"
    assert [status for status, _, _ in answers] == [200] * 10, answers
    recorded = _recorded_outputs(out)
    for _, _, body in answers:
        assert [body["tito"]["output_ids"]] == recorded[body["tito"]["rollout_id"]]
    assert len(recorded) == 11 and recorded[late["id"]] == []  # every opened rollout written, the late one


async def _slow_upload(base: str, token: str, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that sends a request's headers and part of its body, then stalls (the connection stays open).

    ``Expect: 100-continue`` makes the gateway say when its handler has the request: the ``100 Continue`` line is
    the event this waits on, so the handler is reading the body before the test goes on.
    """
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 60)  # hang guard only
    assert line.startswith(b"HTTP/1.1 100"), line
    await reader.readline()  # the blank line after the interim response
    writer.write(b'{"model": "m", "messages": [{"role": "user", "content": "')
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
async def test_a_client_still_uploading_does_not_hold_the_shutdown(tmp_path: Path, suffix: str) -> None:
    """`tito serve --drain-s 2`, SIGTERM while a client is mid-body: the process writes every answered call and
    exits while that client is still connected. Before, aiohttp's runner waited its default 60 s for the handler
    reading the body (64 s to exit), and a Parquet output's last part was written only after that."""
    import json
    import signal
    import sys

    from tito_testing.tokenizers import qwen_tokenizer_dir

    tok = json.dumps(str(qwen_tokenizer_dir("qwen3")))
    cfg = tmp_path / "tito.toml"
    replies = json.dumps([f"answer {i}" for i in range(3)])
    cfg.write_text(
        f'backend = "scripted"\ntokenizer = {tok}\n[backend_options]\ntokenizer = {tok}\nreplies = {replies}\n'
    )
    out = tmp_path / f"served{suffix}"
    code = "import sys; from tito_core.cli import main; sys.exit(main())"
    args = ["serve", "--config", str(cfg), "--port", "0", "--output", str(out), "--drain-s", "2"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    writer = None
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()  # hang guard only
        base = line.rsplit(" ", 1)[1].strip()
        async with aiohttp.ClientSession() as session:
            opened = [(await _post(session, f"{base}/rollouts", {"task_id": f"t{i}"}))[2] for i in range(4)]
            answers = [await _post(session, f"{o['base_url']}/chat/completions", USER, o["token"]) for o in opened[:3]]
        assert [status for status, _, _ in answers] == [200] * 3
        slow = opened[3]
        _, writer = await _slow_upload(base, slow["token"], f"/rollouts/{slow['id']}/v1/chat/completions")
        proc.send_signal(signal.SIGTERM)
        # a guard far below aiohttp's 60 s default: the exit does not wait for the stalled upload
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert not writer.is_closing()  # the slow client never gave up: the gateway did not wait for it
    finally:
        if writer is not None:
            writer.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    recorded = _recorded_outputs(out)
    for _, _, body in answers:
        assert recorded[body["tito"]["rollout_id"]] == [body["tito"]["output_ids"]]
    assert recorded[slow["id"]] == []  # the stalled call was never taken: its rollout is written, with no output

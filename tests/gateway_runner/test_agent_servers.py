"""An agent rollout and its server: the pool alone closes the backend, the record's group is the task's, and an
engine connection lost under the gateway has the server checked at once, as a Strands rollout does."""

from __future__ import annotations

from typing import Any

from tito_core.backend import GenerateRequest
from tito_core.config import load_config
from tito_core.errors import BackendConnectionError
from tito_core.runner.agent_process import AgentRunner
from tito_core.runner.dataset import Task
from tito_core.runner.servers import ServerPool
from tito_core.runner.worker import RolloutWorker
from tito_core.tokenizers import load_tokenizer
from tito_testing.scripted import ScriptedBackend

from ..runner.helpers import tokenizer_dir
from .helpers import adds_then_answers, agent_config, aiohttp_agent

TASK = Task(id="dir/t #1?", prompt="What is 2 + 5?", answer="7", index=3)


class Engine(ScriptedBackend):
    """A scripted engine that can go away: its health check says so, and it counts checks and closes."""

    up = True
    checks = 0
    closes = 0

    async def health(self) -> bool:
        self.checks += 1
        return self.up

    async def aclose(self) -> None:
        self.closes += 1


def _engine() -> Engine:
    return Engine(load_tokenizer(tokenizer_dir()), [])


async def _run(engine: Engine) -> tuple[Any, ServerPool]:
    config = load_config(agent_config({"callable": "tests.gateway_runner.helpers:aiohttp_agent"}))
    pool = ServerPool([("engine", engine)])
    tokenizer = engine.tokenizer
    worker = RolloutWorker(config, tokenizer, pool, agents=AgentRunner(config, tokenizer, fn=aiohttp_agent))
    try:
        record = await worker.run(TASK, 0)
    finally:
        await worker.aclose()
    return record, pool


async def test_the_pool_closes_the_backend_once_and_the_record_has_the_tasks_group() -> None:
    engine = _engine()
    engine.add(adds_then_answers, adds_then_answers)
    record, pool = await _run(engine)
    assert (record.status, record.group, record.trajectory.rollout_id) == ("completed", 3, "dir/t #1?:0")
    assert engine.closes == 1  # the pool's close; the gateway leaves a backend it was given to its owner
    assert engine.checks == 0 and pool.servers[0].healthy  # nothing lost, nothing checked


async def test_an_engine_connection_lost_under_the_gateway_has_the_server_checked() -> None:
    engine = _engine()

    def lost(request: GenerateRequest) -> str:
        engine.up = False  # the engine went away: its health check fails from now on
        raise BackendConnectionError("connection refused")

    engine.add(lost)
    record, pool = await _run(engine)
    assert record.status == "failed" and "BackendConnectionError: connection refused" in (record.status_reason or "")
    (server,) = pool.servers
    assert engine.checks == 1 and not server.healthy  # checked at once: drained until it passes again

"""`finish` with `ended`: the client says how its agent ended (a time limit, a failure), and the gateway closes the
rollout as the runner closes a rollout of its own gateway (`Gateway.take(id, ended)`), after the calls the agent left
in flight. Over real local sockets (aiohttp), on the scripted backend."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.gateway.test_chat_surface import client
from tests.gateway.test_lineages_in_flight import PARENT, Gates, ask, user
from tito_core import Trajectory
from tito_core.gateway import Gateway
from tito_core.status import AgentFailed

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


async def _finish(gateway: Gateway, rollout_id: str, token: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        url = f"{gateway.base_url}/rollouts/{rollout_id}/finish"
        async with session.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
            return response.status, await response.json()


async def _one_call(gateway: Gateway, backend: Any, reply: str, **extra: Any) -> Any:
    backend.add(reply)
    rollout = gateway.open(task_id="t")
    await client(rollout).chat.completions.create(model="m", messages=[user("hi")], **extra)  # type: ignore[arg-type]
    return rollout


async def test_an_agent_that_ran_out_of_time_ends_aborted_with_its_limit(gateway: Gateway, backend: Any) -> None:
    rollout = await _one_call(gateway, backend, "done")  # the call completed; the agent then ran out of time
    status, record = await _finish(gateway, rollout.id, rollout.token, {"ended": {"timed_out_s": 5}})
    assert status == 200
    assert (record["status"], record["status_reason"]) == ("aborted", "timed out after 5 s")
    assert record["tokens"]["model_calls"] == 1  # the answered call is kept


async def test_an_agent_that_failed_ends_its_open_branch_failed_with_its_error(gateway: Gateway, backend: Any) -> None:
    """The agent crashed while its tool ran: ``failed`` with the agent's error, where a plain finish says
    ``aborted`` (the tool calls unanswered)."""
    failed = await _one_call(gateway, backend, TOOL_CALL, tools=[ADD])
    plain = await _one_call(gateway, backend, TOOL_CALL, tools=[ADD])
    why = "AgentExited: the agent exited with code 3; stderr tail: boom"
    status, record = await _finish(gateway, failed.id, failed.token, {"ended": {"error": why}})
    assert status == 200 and (record["status"], record["status_reason"]) == ("failed", why)
    status, record = await _finish(gateway, plain.id, plain.token, {})
    assert status == 200 and record["status"] == "aborted"


async def test_a_finish_that_says_how_the_agent_ended_waits_for_the_call_it_left_in_flight(
    gateway: Gateway, backend: Any, qwen3_tokenizer: Any
) -> None:
    gates = Gates(backend, qwen3_tokenizer, {"hi": "late answer"}, held={"hi"})
    rollout = gateway.open()
    call = asyncio.create_task(ask(client(rollout), PARENT, [user("hi")]))
    await gates.entered["hi"].wait()
    finish = asyncio.create_task(gateway.finish(rollout.id, ended=AgentFailed("the agent was killed")))
    await asyncio.sleep(0)  # one turn of the loop: the finish runs up to its wait (a 409 would have ended it)
    assert not finish.done()
    gates.gates["hi"].set()
    record = await finish
    traj = Trajectory.from_record(record.trajectory)
    assert len(traj.turns) == 1 and record.status == "failed" and record.status_reason == "the agent was killed"
    assert await call == "late answer"  # recorded, then answered


@pytest.mark.parametrize(
    ("ended", "param"),
    [
        (5, "ended"),
        ({}, "ended"),
        ({"timed_out_s": 1, "error": "x"}, "ended"),
        ({"seconds": 1}, "ended"),
        ({"timed_out_s": 0}, "ended.timed_out_s"),
        ({"timed_out_s": -1}, "ended.timed_out_s"),
        ({"timed_out_s": True}, "ended.timed_out_s"),
        ({"timed_out_s": "5"}, "ended.timed_out_s"),
        ({"error": ""}, "ended.error"),
        ({"error": 3}, "ended.error"),
        ({"error": "x" * (16 * 1024 + 1)}, "ended.error"),
    ],
)
async def test_a_bad_ended_is_a_400_and_ends_nothing(gateway: Gateway, backend: Any, ended: Any, param: str) -> None:
    rollout = await _one_call(gateway, backend, "done")
    status, body = await _finish(gateway, rollout.id, rollout.token, {"ended": ended})
    assert status == 400 and body["error"]["param"] == param
    status, record = await _finish(gateway, rollout.id, rollout.token, {})  # still open: finished as usual
    assert status == 200 and record["status"] == "completed"

"""Per-turn rewards at the gateway: ``POST /rollouts/<id>/reward`` after each call, ``turn_rewards`` at finish.

Through real HTTP on the gateway's own server (aiohttp client), scripted backend. Every refusal names its field and
leaves the rollout as it was; a rollout ended without ``finish`` (shutdown) keeps the rewards it was given.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from tito_core.gateway import Gateway
from tito_core.records import read_records

USER = [{"role": "user", "content": "hi"}]


async def _post(session: aiohttp.ClientSession, url: str, token: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
        return response.status, await response.json()


async def _chat(session: aiohttp.ClientSession, rollout: Any, messages: list[Any]) -> Any:
    status, answer = await _post(session, f"{rollout.base_url}/chat/completions", rollout.token,
                                 {"model": "m", "messages": messages})  # fmt: skip
    assert status == 200, answer
    return answer["choices"][0]["message"]


async def test_rewards_per_call_and_at_finish_make_the_records_turn_rewards(gateway: Gateway, backend: Any) -> None:
    backend.add("First.")
    backend.add("Second.")
    backend.add("Third.")
    rollout = gateway.open(task_id="t")
    url = f"{gateway.base_url}/rollouts/{rollout.id}"
    async with aiohttp.ClientSession() as session:
        status, body = await _post(session, f"{url}/reward", rollout.token, {"value": 0.5})
        assert status == 400 and body["error"]["param"] == "turn"  # no call yet
        history = [*USER, await _chat(session, rollout, USER)]
        assert await _post(session, f"{url}/reward", rollout.token, {"value": 0.5}) == (200, {"turn": 0, "value": 0.5})
        history += [{"role": "user", "content": "more"}]
        history += [await _chat(session, rollout, history)]
        history += [{"role": "user", "content": "and more"}]
        await _chat(session, rollout, history)
        status, body = await _post(session, f"{url}/reward", rollout.token, {"value": 1, "turn": 0})
        assert status == 409 and "turn 0 has a reward already" in body["error"]["message"]
        status, body = await _post(session, f"{url}/reward", rollout.token, {"value": 1, "turn": 3})
        assert status == 400 and "from 0 to 2" in body["error"]["message"]
        status, body = await _post(session, f"{url}/reward", rollout.token, {"value": "high"})
        assert status == 400 and body["error"]["param"] == "value"
        status, body = await _post(session, f"{url}/finish", rollout.token, {"turn_rewards": [1.0, None]})
        assert status == 400 and "2 per-turn rewards for a rollout of 3 model calls" in body["error"]["message"]
        status, body = await _post(session, f"{url}/finish", rollout.token, {"turn_rewards": [1.0, None, None]})
        assert status == 400 and "turn 0 was rewarded per call already" in body["error"]["message"]
        status, record = await _post(session, f"{url}/finish", rollout.token, {"turn_rewards": [None, None, 2.0]})
        assert status == 200  # the refusals above left the rollout open
    assert record["turn_rewards"] == [0.5, None, 2.0] and record["reward"] == 2.5
    (written,) = read_records(gateway.output_path)
    assert written.turn_rewards == [0.5, None, 2.0] and written.reward == 2.5
    assert len(written.trajectory.turns) == 3


async def test_a_given_total_stands_and_a_rollout_ended_by_shutdown_keeps_its_rewards(
    gateway: Gateway, backend: Any
) -> None:
    backend.add("One.")
    backend.add("Two.")
    kept, given = gateway.open(task_id="kept"), gateway.open(task_id="given")
    async with aiohttp.ClientSession() as session:
        await _chat(session, kept, USER)
        await _chat(session, given, USER)
        assert gateway.reward(kept.id, 0.25) == 0
        status, record = await _post(session, f"{gateway.base_url}/rollouts/{given.id}/finish", given.token,
                                     {"reward": 7.0, "turn_rewards": [1.0]})  # fmt: skip
    assert status == 200 and (record["reward"], record["turn_rewards"]) == (7.0, [1.0])
    await gateway.close()  # shutdown ends "kept" without a finish
    records = {r.task_id: r for r in read_records(gateway.output_path)}
    assert records["kept"].status == "aborted" and records["kept"].turn_rewards == [0.25]
    assert records["kept"].reward is None  # no finish: no total was given


async def test_rewards_per_branch_reach_each_lineage_s_row_and_a_superseded_attempt_gets_none(
    gateway: Gateway, backend: Any
) -> None:
    """A parent and a sub-agent whose first call the client retried: three branches. The sub-agent's retry is rewarded
    on its own; the parent's row takes the rollout's reward; the abandoned attempt none, unless asked."""
    from tests.helpers.lineages import PARENT, SUB
    from tito_core.runner.samples import training_rows

    for reply in ("p1", "s1", "s1 again", "p2"):
        backend.add(reply)
    rollout = gateway.open(task_id="t")
    url = f"{gateway.base_url}/rollouts/{rollout.id}"
    parent = [{"role": "system", "content": PARENT}, {"role": "user", "content": "plan"}]
    sub = [{"role": "system", "content": SUB}, {"role": "user", "content": "part one"}]
    async with aiohttp.ClientSession() as session:
        parent.append(await _chat(session, rollout, parent))
        await _chat(session, rollout, sub)  # its reply is dropped: the client retries the call
        sub.append(await _chat(session, rollout, sub))
        await _chat(session, rollout, [*parent, {"role": "user", "content": "part one is done"}])
        reward = f"{url}/reward"
        assert await _post(session, reward, rollout.token, {"value": 1, "branch": 2}) == (
            200,
            {"branch": 2, "value": 1.0},
        )
        status, body = await _post(session, reward, rollout.token, {"value": 1, "branch": 2})
        assert status == 409 and "branch 2 has a reward already" in body["error"]["message"]
        status, body = await _post(session, reward, rollout.token, {"value": 1, "branch": 3})
        assert status == 400 and body["error"]["param"] == "branch" and "from 0 to 2" in body["error"]["message"]
        status, body = await _post(session, reward, rollout.token, {"value": 1, "branch": 0, "turn": 0})
        assert status == 400 and body["error"]["param"] == "branch"
        status, body = await _post(session, reward, rollout.token, {"value": "high", "branch": 0})
        assert status == 400 and body["error"]["param"] == "value"
        status, record = await _post(session, f"{url}/finish", rollout.token, {"reward": 0.5})
    assert status == 200 and (record["reward"], record["branch_rewards"]) == (0.5, [None, None, 1.0])
    (written,) = read_records(gateway.output_path)
    assert written.branch_rewards == [None, None, 1.0]
    rows = list(training_rows([written], "trl"))
    assert [(r["branch"], r["superseded"], r["reward"]) for r in rows] == [
        (0, False, 0.5),
        (1, True, None),
        (2, False, 1.0),
    ]
    asked = list(training_rows([written], "trl", reward_superseded=True))
    assert [r["reward"] for r in asked] == [0.5, 0.5, 1.0]

"""A rollout's life at the gateway's edges: who closes the backend, ids that need quoting in URLs, the group a
record carries, a rollout finished without any model call, and refusals the OpenAI SDK must not retry."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
import httpx
import openai
import pytest
from openai import AsyncOpenAI

from tests.gateway.conftest import GrammarBackend, config
from tito_core.gateway import Gateway, GatewayError
from tito_core.records import read_records
from tito_testing.tokenizers import qwen_tokenizer_dir

USER = [{"role": "user", "content": "hi"}]


class ClosingBackend(GrammarBackend):
    """Counts its closes."""

    closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_given_backend_stays_open_and_a_built_one_is_closed(qwen3_tokenizer: Any) -> None:
    given = ClosingBackend(qwen3_tokenizer, [])
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=given)
    await gateway.start()
    await gateway.close()
    assert given.closed == 0  # the caller's: it may be shared (the runner's server pool closes its own)

    options = {"tokenizer": str(qwen_tokenizer_dir("qwen3"))}
    own = Gateway(config(backend_options=options), tokenizer=qwen3_tokenizer)
    closes: list[bool] = []
    original = own.backend.aclose

    async def counted() -> None:
        closes.append(True)
        await original()

    own.backend.aclose = counted  # type: ignore[method-assign]
    await own.start()
    await own.close()
    assert closes == [True]


@pytest.mark.parametrize("rid", ["gsm8k/train #3?x=1&y=%2F", "a b:0", "ünïcode/τ"])
async def test_ids_with_url_characters_are_quoted_and_matched_back(gateway: Gateway, backend: Any, rid: str) -> None:
    """The Python API takes any id (the runner names rollouts after dataset task ids) and quotes it in URLs;
    ``POST /rollouts`` takes only the documented characters (a 400 otherwise, before anything is opened)."""
    backend.add("Fine.")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway.base_url}/rollouts", json={"id": rid, "task_id": rid}) as response:
            assert response.status == 400 and (await response.json())["error"]["param"] == "id"
        rollout = gateway.open(rollout_id=rid, task_id=rid)
        assert rollout.base_url == f"{gateway.base_url}/rollouts/{quote(rid, safe=':@')}/v1"
        api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
        answer = await api.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
        assert answer.choices[0].message.content == "Fine."
        assert (answer.model_extra or {})["tito"]["rollout_id"] == rid
        assert (await api.models.list()).data[0].id == gateway.model_name
        url = f"{gateway.base_url}/rollouts/{quote(rid, safe='')}"
        auth = {"Authorization": f"Bearer {rollout.token}"}
        async with session.get(url, headers=auth) as response:
            assert response.status == 200 and (await response.json())["rollout_id"] == rid
        async with session.post(f"{url}/finish", json={"reward": 1.0}, headers=auth) as response:
            assert response.status == 200
    (record,) = read_records(gateway.output_path)
    assert record.key == (rid, 0) and record.trajectory.rollout_id == rid and record.status == "completed"


async def test_dot_segments_cannot_be_ids(gateway: Gateway) -> None:
    for rid in (".", ".."):
        with pytest.raises(GatewayError, match="cannot be a rollout id") as caught:
            gateway.open(rollout_id=rid)
        assert caught.value.status == 400 and caught.value.param == "id"


async def test_post_rollouts_takes_the_records_group(gateway: Gateway, backend: Any) -> None:
    async with aiohttp.ClientSession() as session:
        for bad in (-1, 1.5, True, "3"):
            async with session.post(f"{gateway.base_url}/rollouts", json={"group": bad}) as response:
                body = await response.json()
                assert response.status == 400 and body["error"]["param"] == "group", bad
        for group in (7, None):
            payload = {"task_id": f"g{group}"} | ({} if group is None else {"group": group})
            async with session.post(f"{gateway.base_url}/rollouts", json=payload) as response:
                opened = await response.json()
            backend.add("ok")
            await AsyncOpenAI(
                base_url=opened["base_url"], api_key=opened["token"], max_retries=0
            ).chat.completions.create(
                model="m",
                messages=USER,  # type: ignore[arg-type]
            )
            record = await gateway.finish(opened["id"])
            assert record.group == (group or 0)
    assert [r.group for r in read_records(gateway.output_path)] == [7, 0]


async def test_a_rollout_finished_without_a_model_call_failed_with_that_reason(gateway: Gateway) -> None:
    rollout = gateway.open(task_id="idle-agent")
    record = await gateway.finish(rollout.id, reward=1.0)
    assert record.status == "failed" and record.tokens.model_calls == 0
    assert record.status_reason == "the rollout ended without any model call: it holds no output"


async def test_the_sdk_does_not_retry_a_finished_or_unknown_rollout(gateway: Gateway, backend: Any) -> None:
    sent: list[str] = []

    async def note(request: httpx.Request) -> None:
        sent.append(request.url.path)

    def api(base_url: str) -> AsyncOpenAI:  # the SDK's default retries (2): the header must stop them
        return AsyncOpenAI(
            base_url=base_url, api_key=rollout.token, http_client=httpx.AsyncClient(event_hooks={"request": [note]})
        )

    backend.add("done")
    rollout = gateway.open()
    await api(rollout.base_url).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    await gateway.finish(rollout.id)
    with pytest.raises(openai.ConflictError) as conflict:
        await api(rollout.base_url).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert conflict.value.response.headers["x-should-retry"] == "false"
    assert conflict.value.code == "rollout_finished"
    with pytest.raises(openai.NotFoundError) as missing:
        await api(f"{gateway.base_url}/rollouts/nope/v1").chat.completions.create(
            model="m",
            messages=USER,  # type: ignore[arg-type]
        )
    assert missing.value.response.headers["x-should-retry"] == "false"
    chat = "/chat/completions"
    assert sent == [f"/rollouts/{rollout.id}/v1{chat}"] * 2 + [f"/rollouts/nope/v1{chat}"]  # one try each


async def test_finishing_twice_is_a_409_and_writes_nothing_more(gateway: Gateway, backend: Any) -> None:
    backend.add("done")
    rollout = gateway.open(task_id="t")
    api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    await api.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    await gateway.finish(rollout.id, reward=1.0)
    with pytest.raises(GatewayError) as again:
        await gateway.finish(rollout.id, reward=0.0)
    assert again.value.status == 409 and again.value.code == "rollout_finished"
    with pytest.raises(GatewayError) as unknown:
        await gateway.finish("never-opened")
    assert unknown.value.status == 404
    assert [r.reward for r in read_records(gateway.output_path)] == [1.0]


async def test_the_served_model_is_named_without_a_local_path(gateway: Gateway, backend: Any) -> None:
    backend.add("hi")
    rollout = gateway.open()
    api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    answer = await api.chat.completions.create(model="", messages=USER)  # type: ignore[arg-type]
    assert answer.model == gateway.model_name == "qwen3-v1"  # the tokenizer directory's name, not its path
    assert "/" not in (await api.models.list()).data[0].id


async def test_a_route_that_is_not_there_says_how_to_open_a_rollout(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{gateway.base_url}/v1") as response:
        body = await response.json()
    assert response.status == 404 and body["error"]["code"] == "no_such_route"
    assert "POST /rollouts" in body["error"]["message"] and "token" in body["error"]["message"]

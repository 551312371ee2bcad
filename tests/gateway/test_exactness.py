"""The behaviour distribution through every front: a rollout that truncates sampling records a kept set per output
token, and one configured for routing replay records the routed experts, through chat completions, the Responses
API, the Anthropic Messages API and Gemini's API alike; an engine that answers without routing leaves a reason in
the record, and one that cannot return kept sets is refused with a typed 400 in exact mode."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from anthropic import AsyncAnthropic
from google import genai
from google.genai import types
from openai import AsyncOpenAI

from tests.gateway.conftest import config
from tito_core.gateway import Gateway
from tito_core.trajectory import Trajectory
from tito_testing.scripted import ScriptedBackend, scripted_kept_set, scripted_routing

SAMPLING = {"top_p": 0.9, "top_k": 20, "max_new_tokens": 16}


async def chat(rollout: Any) -> None:
    api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


async def responses(rollout: Any) -> None:
    api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    await api.responses.create(model="m", input="hi")


async def messages(rollout: Any) -> None:
    api = AsyncAnthropic(base_url=rollout.base_url.removesuffix("/v1"), api_key=rollout.token, max_retries=0)
    await api.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])


async def gemini(rollout: Any) -> None:
    http = types.HttpOptions(base_url=rollout.base_url.removesuffix("/v1"), api_version="v1beta")
    api = genai.Client(api_key=rollout.token, http_options=http)
    await api.aio.models.generate_content(model="m", contents="hi")


FRONTS = [chat, responses, messages, gemini]


async def _record(
    backend: ScriptedBackend, tokenizer: Any, tmp_path: Any, front: Callable[[Any], Awaitable[None]], **options: Any
) -> Trajectory:
    gateway = Gateway(config(**options), tokenizer=tokenizer, backend=backend, output=tmp_path / "out.jsonl")
    await gateway.start()
    try:
        rollout = gateway.open()
        await front(rollout)
        return await gateway.take(rollout.id)
    finally:
        await gateway.close()


@pytest.mark.parametrize("front", FRONTS, ids=lambda f: f.__name__)
async def test_every_front_records_kept_sets_and_routing(front: Any, qwen3_tokenizer: Any, tmp_path: Any) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["It is four."], routed_experts=(2, 2))
    traj = await _record(backend, qwen3_tokenizer, tmp_path, front, sampling=SAMPLING, return_routed_experts=True)
    (turn,) = traj.turns
    out = traj.token_ids[turn.output_start : turn.output_start + turn.output_len]
    assert turn.sampling_mask is not None
    assert turn.sampling_mask.to_lists() == [scripted_kept_set(t, len(qwen3_tokenizer)) for t in out]
    routed = traj.routed_experts()
    assert routed is not None and turn.routed_experts_missing is None
    last = len(traj) - 2
    assert list(memoryview(routed[0]).cast("i")[last * 4 :]) == scripted_routing(last, (2, 2))


@pytest.mark.parametrize("front", FRONTS, ids=lambda f: f.__name__)
async def test_routing_lost_on_the_way_is_recorded_with_its_reason(
    front: Any, qwen3_tokenizer: Any, tmp_path: Any
) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["It is four."])  # answers without routing
    traj = await _record(backend, qwen3_tokenizer, tmp_path, front, return_routed_experts=True)
    (turn,) = traj.turns
    assert traj.routed_experts() is None
    assert turn.routed_experts_missing is not None and "has none" in turn.routed_experts_missing


async def test_exact_mode_refuses_a_truncating_call_with_a_typed_400(qwen3_tokenizer: Any, tmp_path: Any) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["It is four."], sampling_masks=False)
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=tmp_path / "out.jsonl")
    await gateway.start()
    try:
        rollout = gateway.open()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 0.9}
        headers = {"authorization": f"Bearer {rollout.token}"}
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"{rollout.base_url}/chat/completions", json=body, headers=headers)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "sampling_mask_unavailable" and "allow_missing" in error["message"]
        assert backend.requests == []
    finally:
        await gateway.close()

"""Sampling values out of their documented range are a 400 naming the caller's own field, on each front, through
its real SDK: OpenAI's ranges on chat completions and Responses, Anthropic's on Messages. Before,
``temperature: 1e308`` and ``max_tokens: 10**26`` were answered 200, and the Responses and Messages fronts named
the chat field (``max_completion_tokens``) for their own limit."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from tito_core.gateway import Gateway
from tito_core.gateway.ranges import MAX_TOKENS

USER: Any = [{"role": "user", "content": "hi"}]


def chat_client(rollout: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)


def messages_client(rollout: Any) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=rollout.base_url.removesuffix("/v1"), api_key=rollout.token, max_retries=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 1e308), ("temperature", 2.5), ("temperature", -0.1), ("max_tokens", 10**26),
        ("max_completion_tokens", 10**26), ("max_tokens", 0), ("top_p", 1.5), ("top_p", 0),
        ("seed", 2**70), ("top_k", 10**30), ("top_k", 0),
    ],
)  # fmt: skip
async def test_chat_completions_refuses_values_out_of_range(
    gateway: Gateway, backend: Any, field: str, value: Any
) -> None:
    rollout = gateway.open()
    with pytest.raises(openai.BadRequestError) as caught:
        await chat_client(rollout).chat.completions.create(model="m", messages=USER, extra_body={field: value})
    body: Any = caught.value.body
    assert body["param"] == field and body["message"].startswith(f"{field}: must be"), body
    assert backend.requests == []


async def test_chat_completions_takes_the_bounds(gateway: Gateway, backend: Any) -> None:
    backend.add("ok")
    rollout = gateway.open()
    answer = await chat_client(rollout).chat.completions.create(
        model="m", messages=USER, temperature=2, top_p=1, max_tokens=MAX_TOKENS, seed=-(2**63)
    )
    assert answer.choices[0].message.content == "ok"
    sampling = backend.requests[0].sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (2, 1, MAX_TOKENS)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_output_tokens", 10**26), ("max_output_tokens", 0), ("temperature", 1e308), ("temperature", 2.5),
     ("top_p", 1.5)],
)  # fmt: skip
async def test_responses_refuses_values_out_of_range_naming_its_field(
    gateway: Gateway, backend: Any, field: str, value: Any
) -> None:
    rollout = gateway.open()
    with pytest.raises(openai.BadRequestError) as caught:
        await chat_client(rollout).responses.create(model="m", input="hi", extra_body={field: value})
    body: Any = caught.value.body
    assert body["param"] == field and body["message"].startswith(f"{field}: must be"), body
    assert backend.requests == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 10**26), ("max_tokens", 0), ("max_tokens", 2.5), ("temperature", 1e308),
     ("temperature", 1.5), ("top_p", 0), ("top_k", 10**30)],
)  # fmt: skip
async def test_messages_refuses_values_out_of_anthropics_range_naming_its_field(
    gateway: Gateway, backend: Any, field: str, value: Any
) -> None:
    """Anthropic's temperature is in [0, 1]: 1.5 was taken (the chat front's range is OpenAI's [0, 2])."""
    rollout = gateway.open()
    sdk = messages_client(rollout)  # this SDK takes no temperature, and no large max_tokens unstreamed: extra_body
    with pytest.raises(anthropic.BadRequestError) as caught:
        await sdk.messages.create(model="m", messages=USER, max_tokens=8, extra_body={field: value})
    body: Any = caught.value.body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == field, body
    assert body["error"]["message"].startswith(f"{field}: must be"), body
    assert backend.requests == []


async def test_messages_takes_anthropics_bounds(gateway: Gateway, backend: Any) -> None:
    backend.add("ok")
    rollout = gateway.open()
    answer = await messages_client(rollout).messages.create(
        model="m", messages=USER, max_tokens=8, extra_body={"max_tokens": MAX_TOKENS, "temperature": 1, "top_p": 1}
    )
    assert answer.content[0].type == "text" and answer.content[0].text == "ok"
    sampling = backend.requests[0].sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (1, 1, MAX_TOKENS)

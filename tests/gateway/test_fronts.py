"""One core under three fronts: the same scripted conversation through chat completions, the Responses API and the
Anthropic Messages API, each with its real SDK, records the same trajectory: ids, loss mask, logprobs and images
(an image in the user's message, another in the tool's result, as a screenshot agent sends them). Gemini's API, the
fourth front, records what chat completions records for a tool result in its order (the text, then the image)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from google import genai
from google.genai import types
from openai import AsyncOpenAI

pytest.importorskip("PIL")

from tests.gateway.test_images import CALL, SHOT, data_url, png, vl  # noqa: F401  (vl: the fixture)
from tito_core.gateway import Gateway
from tito_core.trajectory import Trajectory

PHOTO, SCREEN = png(100, 80, 1), png(64, 64, 2)
QUESTION = "What is on screen?"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def chat(rollout: Any) -> None:
    api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    user = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_url(PHOTO)}}]
    messages: list[Any] = [{"role": "user", "content": user}]
    first = await api.chat.completions.create(model="m", messages=messages, tools=[SHOT])
    call = (first.choices[0].message.tool_calls or [])[0]
    result = [{"type": "image_url", "image_url": {"url": data_url(SCREEN)}}, {"type": "text", "text": "now"}]
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": result}]
    await api.chat.completions.create(model="m", messages=messages, tools=[SHOT])


async def responses(rollout: Any) -> None:
    api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    tools: Any = [{"type": "function", **SHOT["function"]}]
    user = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": data_url(PHOTO)}]
    first = await api.responses.create(model="m", input=[{"role": "user", "content": user}], tools=tools)
    call = first.output[-1]
    assert call.type == "function_call"
    result = [{"type": "input_image", "image_url": data_url(SCREEN)}, {"type": "input_text", "text": "now"}]
    answer: Any = {"type": "function_call_output", "call_id": call.call_id, "output": result}
    await api.responses.create(model="m", previous_response_id=first.id, input=[answer], tools=tools)


async def messages(rollout: Any) -> None:
    api = AsyncAnthropic(base_url=rollout.base_url.removesuffix("/v1"), api_key=rollout.token, max_retries=0)
    tools: Any = [{"name": "shot", "description": "screenshot", "input_schema": {"type": "object"}}]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PHOTO)}}
    history: list[Any] = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image]}]
    first = await api.messages.create(model="m", max_tokens=64, messages=history, tools=tools)
    use = first.content[-1]
    assert use.type == "tool_use"
    screen = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(SCREEN)}}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": [screen, {"type": "text", "text": "now"}]}
    history += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [result]},
    ]
    await api.messages.create(model="m", max_tokens=64, messages=history, tools=tools)


async def recorded(vl: Any, front: Callable[[Any], Awaitable[None]]) -> Trajectory:  # noqa: F811
    gateway, backend = vl
    backend.add(CALL, "A red square.")
    rollout = gateway.open()
    await front(rollout)
    return await gateway.take(rollout.id)


async def test_the_three_fronts_record_the_same_trajectory(vl: tuple[Gateway, Any]) -> None:  # noqa: F811
    trajectories = [await recorded(vl, front) for front in (chat, responses, messages)]
    for traj in trajectories:
        assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2 and len(traj.media) == 2

    def what(traj: Trajectory) -> Any:
        spans = [(s.sha256, s.grid_thw, s.start, s.end) for s in traj.media]
        return traj.token_ids, traj.loss_mask, traj.logprobs, spans, [t.tool_calls for t in traj.turns]

    reference = what(trajectories[0])
    assert what(trajectories[1]) == reference  # Responses = chat completions
    assert what(trajectories[2]) == reference  # Messages = chat completions


async def gemini(rollout: Any) -> None:
    """Gemini's API (the google-genai SDK): a function response is its ``response`` text, then its ``parts``."""
    http = types.HttpOptions(base_url=rollout.base_url.removesuffix("/v1"), api_version="v1beta")
    api = genai.Client(api_key=rollout.token, http_options=http)
    shot = types.FunctionDeclaration(name="shot", description="screenshot", parameters_json_schema={"type": "object"})
    setup = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[shot])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    photo = types.Part.from_bytes(data=PHOTO, mime_type="image/png")
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text=QUESTION), photo])]
    first = await api.aio.models.generate_content(model="m", contents=contents, config=setup)
    screen = types.FunctionResponsePart.from_bytes(data=SCREEN, mime_type="image/png")
    result = types.Part.from_function_response(name="shot", response={"output": "now"}, parts=[screen])
    contents += [first.candidates[0].content, types.Content(role="user", parts=[result])]  # type: ignore[index]
    await api.aio.models.generate_content(model="m", contents=contents, config=setup)


async def chat_text_first(rollout: Any) -> None:
    """Chat completions with the tool result in Gemini's order: its text, then its image."""
    api = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    user = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_url(PHOTO)}}]
    messages: list[Any] = [{"role": "user", "content": user}]
    first = await api.chat.completions.create(model="m", messages=messages, tools=[SHOT])
    call = (first.choices[0].message.tool_calls or [])[0]
    result = [{"type": "text", "text": "now"}, {"type": "image_url", "image_url": {"url": data_url(SCREEN)}}]
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": result}]
    await api.chat.completions.create(model="m", messages=messages, tools=[SHOT])


async def test_the_gemini_front_records_what_chat_completions_records(vl: tuple[Gateway, Any]) -> None:  # noqa: F811
    """The fourth front, with its inline images (the SDK's URL-safe base64) in the user's content and the function
    response's ``parts``: the same trajectory as chat completions."""
    reference, traj = [await recorded(vl, front) for front in (chat_text_first, gemini)]
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2 and len(traj.media) == 2

    def what(traj: Trajectory) -> Any:
        spans = [(s.sha256, s.grid_thw, s.start, s.end) for s in traj.media]
        return traj.token_ids, traj.loss_mask, traj.logprobs, spans, [t.tool_calls for t in traj.turns]

    assert what(traj) == what(reference)

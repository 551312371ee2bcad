"""Images through the gateway on the embedded backend and the tiny random Qwen2.5-VL: a real model, over HTTP.

A client posts OpenAI chat requests (aiohttp, the JSON any OpenAI client sends): a user message with a photo
as a ``data:`` URL and a forced call of the ``look`` tool, then the tool's result holding a second picture. The
gateway finds the image processor in the model's directory (its ``preprocessor_config.json``), the model reads
both pictures, and the record holds both spans with the image processor's grids, the second prompt extending the
first call's tokens, and no sampled vision token.
"""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tito_core.config import TitoConfig
from tito_core.gateway import Gateway

IMAGE_PAD, VISION_IDS = 151655, {151652, 151653, 151655, 151656}
LOOK = {
    "type": "function",
    "function": {"name": "look", "description": "See the screen.", "parameters": {"type": "object"}},
}


def png(width: int, height: int, colour: tuple[int, int, int]) -> bytes:
    from PIL import Image, ImageDraw

    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    ImageDraw.Draw(canvas).rectangle((width // 4, height // 4, width // 2, height // 2), fill=colour)
    out = io.BytesIO()
    canvas.save(out, format="PNG")
    return out.getvalue()


def image_url(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


@pytest.fixture
async def gateway(tiny_vl_dir: Path) -> AsyncIterator[Gateway]:
    from tito_transformers import TransformersBackend

    config = TitoConfig(
        backend="transformers",
        tokenizer=str(tiny_vl_dir),  # the tokenizer, its Qwen3.5 template and the image processor's config
        tool_parser="qwen_xml",
        chat_template_kwargs={"enable_thinking": False},
        sampling={"temperature": 1.0, "max_new_tokens": 48, "seed": 3},
    )
    gw = Gateway(config, backend=TransformersBackend(tiny_vl_dir, dtype="bfloat16", num_threads=1))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()  # closes the backend


async def test_pictures_in_a_user_message_and_a_tool_result_reach_the_model(
    gateway: Gateway, tiny_vl_dir: Path
) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor

    photo, shot = png(100, 80, (220, 40, 40)), png(224, 224, (40, 80, 220))
    rollout = gateway.open(task_id="look")
    url = f"{rollout.base_url}/chat/completions"
    messages: list[Any] = [{"role": "user", "content": [image_url(photo), {"type": "text", "text": "Look again."}]}]
    forced = {"type": "function", "function": {"name": "look"}}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {rollout.token}"}) as session:
        async with session.post(url, json={"messages": messages, "tools": [LOOK], "tool_choice": forced}) as response:
            assert response.status == 200, await response.text()
            first = (await response.json())["choices"][0]["message"]
        assert "tool_calls" in first, first
        (call,) = first["tool_calls"]
        tool = {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": [image_url(shot), {"type": "text", "text": "ok"}],
        }
        messages += [first, tool]
        async with session.post(url, json={"messages": messages, "tools": [LOOK], "max_tokens": 8}) as response:
            assert response.status == 200, await response.text()
            second = await response.json()
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2 and traj.turns[0].constrained
    assert second["tito"]["output_ids"] == traj.tokens(traj.segments[-1])
    processor = AutoImageProcessor.from_pretrained(str(tiny_vl_dir))
    pictures = [Image.open(io.BytesIO(d)).convert("RGB") for d in (photo, shot)]
    grids = [tuple(int(x) for x in g) for g in processor(images=pictures, return_tensors="np")["image_grid_thw"]]
    assert [s.grid_thw for s in traj.media] == grids == [(1, 6, 8), (1, 16, 16)]
    ids = traj.token_ids
    assert [ids[s.start : s.end] for s in traj.media] == [[IMAGE_PAD] * 12, [IMAGE_PAD] * 64]
    first_call, answer = traj.turns
    assert traj.media[0].end <= first_call.prompt_start + first_call.prompt_len  # the photo: in the first prompt
    assert answer.prompt_start <= traj.media[1].start < answer.prompt_start + answer.prompt_len  # the tool's picture
    generated = [t for t, m in zip(ids, traj.loss_mask, strict=True) if m]
    assert len(generated) == first_call.output_len + answer.output_len and not set(generated) & VISION_IDS

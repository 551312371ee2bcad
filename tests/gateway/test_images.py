"""Images through the gateway: OpenAI ``image_url`` data URLs in user and tool messages, with the real OpenAI SDK.

The scripted backend (it takes images and records the requests) behind a gateway with the tiny Qwen-VL image
processor and the Qwen3.5 template (tests/core/test_images_rollout.py's set-up): each image becomes a span of
expanded placeholders with the grid Hugging Face's image processor gives it; a replayed history with the same
images extends the same tokens, a changed image forks; every bad image is a 400 naming its field, before any
request. No torch: Pillow and the offline Qwen3 tokenizer.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tests.gateway.conftest import config
from tito_core.gateway import Gateway
from tito_core.gateway.images import ImageReader
from tito_core.records import read_records
from tito_testing.scripted import ScriptedBackend
from tito_testing.vision import tiny_image_processor, vl_chat_template

PAD, VSTART, VEND = 151655, 151652, 151653
CALL = "<tool_call>\n<function=shot>\n</function>\n</tool_call>"
SHOT = {"type": "function", "function": {"name": "shot", "description": "screenshot", "parameters": {"type": "object"}}}


def png(width: int, height: int, seed: int = 0, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), ((seed * 37) % 256, (seed * 91) % 256, 128)).save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def grid(data: bytes) -> tuple[int, ...]:
    """The grid Hugging Face's image processor gives ``data`` (the reference for the span's ``grid_thw``)."""
    out = tiny_image_processor()(images=[PILImage.open(io.BytesIO(data)).convert("RGB")])
    return tuple(int(x) for x in out["image_grid_thw"][0])


def client(rollout: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)


def vl_config(**options: Any) -> Any:
    template = {"chat_template": vl_chat_template(), "chat_template_kwargs": {"enable_thinking": False}}
    return config(tool_parser="qwen_xml", **template, **options)


@pytest.fixture
async def vl(qwen3_tokenizer: Any, tmp_path: Path) -> AsyncIterator[tuple[Gateway, ScriptedBackend]]:
    backend = ScriptedBackend(qwen3_tokenizer, [])
    gateway = Gateway(
        vl_config(),
        tokenizer=qwen3_tokenizer,
        backend=backend,
        output=tmp_path / "out.jsonl",
        processor=tiny_image_processor(),
    )
    await gateway.start()
    try:
        yield gateway, backend
    finally:
        await gateway.close()


async def test_an_image_in_a_user_message_and_one_in_a_tool_result_are_recorded(vl: Any) -> None:
    gateway, backend = vl
    backend.add(CALL, "A red square.", "Still red.")
    rollout = gateway.open(task_id="look")
    api = client(rollout)
    photo, shot = png(100, 80, 1), png(224, 224, 2, "JPEG")
    user_parts = [
        {"type": "text", "text": "What is on screen?"},
        {"type": "image_url", "image_url": {"url": data_url(photo), "detail": "high"}},
    ]
    messages: list[Any] = [{"role": "user", "content": user_parts}]
    first = await api.chat.completions.create(model="m", messages=messages, tools=[SHOT])
    call = first.choices[0].message.tool_calls[0]
    tool_parts = [{"type": "image_url", "image_url": data_url(shot, "image/jpeg")}, {"type": "text", "text": "now"}]
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": tool_parts}]
    second = await api.chat.completions.create(model="m", messages=messages, tools=[SHOT])
    assert second.choices[0].message.content == "A red square."
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2  # the replayed image matched: no fork
    first_ids, second_ids = backend.requests[0].input_ids, backend.requests[1].input_ids
    assert second_ids[: len(first_ids)] == first_ids
    spans = traj.media
    assert [s.sha256 for s in spans] == [hashlib.sha256(photo).hexdigest(), hashlib.sha256(shot).hexdigest()]
    assert [s.grid_thw for s in spans] == [grid(photo), grid(shot)] == [(1, 6, 8), (1, 16, 16)]
    assert [(s.format, s.size) for s in spans] == [("png", (100, 80)), ("jpeg", (224, 224))]
    ids = traj.token_ids
    for span in spans:
        assert span.length == span.grid_thw[1] * span.grid_thw[2] // 4
        assert ids[span.start - 1] == VSTART and ids[span.end] == VEND and set(ids[span.start : span.end]) == {PAD}
        assert not any(traj.loss_mask[span.start : span.end])
    assert [p.span for p in backend.requests[1].media] == list(spans)
    assert [p.span for p in backend.requests[0].media] == [spans[0]]
    # a third call replaying both images unchanged still extends the same branch
    messages += [second.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
    await api.chat.completions.create(model="m", messages=messages, tools=[SHOT])
    assert traj.branch == 0 and len(traj.turns) == 3 and len(traj.media) == 2
    record = await gateway.finish(rollout.id, reward=1.0)
    assert record.status == "completed"
    (written,) = read_records(gateway.output_path)
    assert written.trajectory.media == list(spans)
    assert written.trajectory.image_data == {s.sha256: d for s, d in zip(spans, (photo, shot), strict=True)}
    assert sorted(p.name for p in Path(f"{gateway.output_path}.images").iterdir()) == sorted(
        f"{s.sha256}.{s.format}" for s in spans
    )  # the bytes once per image, next to the rollout file


async def test_a_changed_image_forks(vl: Any) -> None:
    gateway, backend = vl
    backend.add("A square.", "Another square.")
    rollout = gateway.open()
    api = client(rollout)
    a, b = png(60, 60, 1), png(60, 60, 2)  # the same size: the same ids, another picture

    def user(image: bytes) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}}]}

    first = await api.chat.completions.create(model="m", messages=[user(a)])
    reply = first.choices[0].message.model_dump(exclude_none=True)
    await api.chat.completions.create(model="m", messages=[user(b), reply, {"role": "user", "content": "more"}])
    traj = gateway.registry.get(rollout.id).core.trajectory
    assert traj.branch == 1
    assert [s.sha256 for s in traj.media] == [hashlib.sha256(b).hexdigest()]
    assert [s.sha256 for s in traj.branches[0].media] == [hashlib.sha256(a).hexdigest()]


def test_a_replayed_image_is_not_decoded_again() -> None:
    reader = ImageReader()
    url = data_url(png(30, 30))
    reader.begin()
    first = reader.read_url(url, "messages[0].content[0].image_url.url")
    reader.begin()
    assert reader.read_url(url, "messages[0].content[0].image_url.url") is first  # kept from the last request
    reader.begin()
    reader.begin()  # a request without it: forgotten (the reader holds one request's images)
    assert reader.read_url(url, "messages[0].content[0].image_url.url") is not first


BAD = data_url(b"\x89PNG\r\n\x1a\nnot really")
IMAGE_CASES: list[tuple[str, Any, str]] = [
    ("http", {"url": "https://example.com/cat.png"}, "an https URL: the tito gateway fetches nothing"),
    ("file", {"url": "file:///tmp/cat.png"}, "not a data: URL"),
    ("not base64", {"url": "data:image/png,rawbytes"}, "must be base64 encoded"),
    ("bad base64", {"url": "data:image/png;base64,@@@"}, "not valid base64"),
    ("undecodable", {"url": BAD}, "do not decode"),
    ("unsupported format", {"url": data_url(png(20, 20, fmt="BMP"), "image/bmp")}, "'bmp' is not supported"),
    ("declared otherwise", {"url": data_url(png(20, 20), "image/jpeg")}, "declared 'jpeg' but its bytes are 'png'"),
    ("not an image", {"url": data_url(png(20, 20), "text/plain")}, "is not an image"),
    ("detail", {"url": data_url(png(20, 20)), "detail": "max"}, "must be 'auto', 'low' or 'high'"),
]


async def test_a_bad_image_is_a_400_naming_its_field_before_any_request(vl: Any) -> None:
    gateway, backend = vl
    for name, value, words in IMAGE_CASES:
        rollout = gateway.open()
        parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": value}]
        with pytest.raises(openai.BadRequestError) as caught:
            await client(rollout).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}, {"role": "user", "content": parts}]
            )
        field = "messages[1].content[1].image_url." + ("detail" if "detail" in value else "url")
        error = caught.value.body
        assert isinstance(error, dict) and error["param"] == field and error["type"] == "invalid_request_error", name
        assert error["message"].startswith(f"{field}: ") and words in error["message"], (name, error)
        traj = gateway.registry.get(rollout.id).core.trajectory
        assert len(traj) == 0 and traj.status == "failed", name
    assert backend.requests == []


async def test_images_outside_user_and_tool_messages_and_for_text_only_models_are_400s(
    vl: Any, qwen3_tokenizer: Any
) -> None:
    gateway, backend = vl
    image = {"type": "image_url", "image_url": {"url": data_url(png(20, 20))}}
    cases = [
        ([{"role": "system", "content": [image]}, {"role": "user", "content": "hi"}], "messages[0].content[0].type"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [image]}], "messages[1].content[0].type"),
    ]
    for messages, field in cases:
        words = re.escape(f"{field}: images are taken in user and tool messages")
        with pytest.raises(openai.BadRequestError, match=words):
            await client(gateway.open()).chat.completions.create(model="m", messages=messages)
    plain = ScriptedBackend(qwen3_tokenizer, [])
    text_only = Gateway(vl_config(), tokenizer=qwen3_tokenizer, backend=plain, processor=False)
    await text_only.start()
    try:
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[0\]: this model takes no images"):
            await client(text_only.open()).chat.completions.create(
                model="m", messages=[{"role": "user", "content": [image]}]
            )
    finally:
        await text_only.close()
    assert backend.requests == [] and plain.requests == []

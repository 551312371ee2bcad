"""The embedded backend on the tiny random Qwen2.5-VL: images in the prompt, checked, fed to the model, re-scored.

Requests are built here the way the core builds them: the chat template's one ``<|image_pad|>`` per image is
expanded to the image processor's token count, and each image comes with its span (``PromptMedia``). The
reference is a plain forward pass of the same model over the ids with the processor's pixel inputs, where
transformers computes the 3-D positions itself (``mm_token_type_ids``). Exact comparisons run in float32.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import BackendRequestError
from tito_core.media import Image, MediaSpan, PromptMedia
from tito_transformers import TransformersBackend

IMAGE_PAD = 151655
VISION_IDS = (151652, 151653, 151655, 151656)


@pytest.fixture(scope="module")
def vl(tiny_vl_dir: Path) -> Iterator[TransformersBackend]:
    backend = TransformersBackend(tiny_vl_dir, dtype="float32")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def processor(tiny_vl_dir: Path) -> Any:
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(tiny_vl_dir))


@pytest.fixture(scope="module")
def vl_tokenizer(tiny_vl_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_vl_dir))


def picture(width: int, height: int, colour: tuple[int, int, int]) -> Image:
    from PIL import Image as PILImage
    from PIL import ImageDraw

    canvas = PILImage.new("RGB", (width, height), (255, 255, 255))
    ImageDraw.Draw(canvas).ellipse((width // 4, height // 4, 3 * width // 4, 3 * height // 4), fill=colour)
    buffer = io.BytesIO()
    canvas.save(buffer, "PNG")
    return Image(buffer.getvalue())


def grid_of(processor: Any, image: Image) -> tuple[int, int, int]:
    grid = processor(images=[image.to_pil()], return_tensors="pt")["image_grid_thw"][0].tolist()
    return (int(grid[0]), int(grid[1]), int(grid[2]))


def expanded(
    tokenizer: Any, processor: Any, text: str, images: Sequence[Image]
) -> tuple[list[int], tuple[PromptMedia, ...]]:
    """A user turn with ``images`` after ``text``, templated, each placeholder expanded, with the images' spans."""
    content = [{"type": "text", "text": text}, *({"type": "image"} for _ in images)]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    ids: list[int] = []
    spans: list[PromptMedia] = []
    pending = iter(images)
    for token in tokenizer.encode(rendered, add_special_tokens=False):
        if token != IMAGE_PAD:
            ids.append(token)
            continue
        image = next(pending)
        grid = grid_of(processor, image)
        length = grid[0] * grid[1] * grid[2] // 4
        span = MediaSpan(
            start=len(ids),
            length=length,
            sha256=image.sha256,
            format=image.format,
            size=image.size,
            grid_thw=grid,
            placeholder_id=IMAGE_PAD,
        )
        spans.append(PromptMedia(span=span, item=image))
        ids.extend([IMAGE_PAD] * length)
    return ids, tuple(spans)


def request(
    ids: list[int], images: tuple[PromptMedia, ...], prompt_logprobs: bool = False, **sampling: Any
) -> GenerateRequest:
    return GenerateRequest(
        rid=uuid.uuid4().hex,
        input_ids=ids,
        prefix_len=0,
        sampling=SamplingParams(**sampling),
        return_prompt_logprobs=prompt_logprobs,
        media=images,
        never_sample=VISION_IDS,
    )


def rescored(model: Any, processor: Any, ids: list[int], images: Sequence[Image]) -> list[float]:
    """``log p(ids[i] | ids[:i])`` for i >= 1 by a plain forward pass with the images' pixel inputs."""
    import torch

    full = torch.tensor([ids])
    pixels = processor(images=[image.to_pil() for image in images], return_tensors="pt")
    with torch.inference_mode():
        logits = model(
            input_ids=full,
            pixel_values=pixels["pixel_values"].to(model.dtype),
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=(full == IMAGE_PAD).int(),
        ).logits[0, :-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, full[0, 1:, None])[:, 0]
    return [float(x) for x in logprobs.tolist()]


def close(a: Sequence[float | None], b: Sequence[float | None], tol: float = 1e-4) -> bool:
    assert len(a) == len(b)
    return all(x is not None and y is not None and abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def test_input_kinds_only_for_a_vision_model(vl: TransformersBackend, tiny_backend: Any) -> None:
    assert "image" in vl.input_kinds and vl.capabilities().input_kinds == vl.input_kinds  # video with torchvision
    assert not tiny_backend.input_kinds and not tiny_backend.capabilities().input_kinds


async def test_greedy_output_and_prompt_logprobs_match_a_plain_forward_with_the_images(
    vl: TransformersBackend, processor: Any, vl_tokenizer: Any
) -> None:
    images = [picture(100, 80, (255, 0, 0)), picture(60, 200, (0, 0, 255))]
    ids, spans = expanded(vl_tokenizer, processor, "What colours are these?", images)
    assert [span.span.grid_thw for span in spans] == [(1, 6, 8), (1, 14, 4)]
    result = await vl.generate(request(ids, spans, prompt_logprobs=True, temperature=0, max_new_tokens=8))
    assert len(result.output_ids) == 8 and result.prompt_tokens == len(ids)
    reference = rescored(vl.model, processor, [*ids, *result.output_ids], images)
    assert result.prompt_logprobs is not None and result.output_logprobs is not None
    assert close(result.prompt_logprobs[1:], reference[: len(ids) - 1])
    assert close(result.output_logprobs, reference[len(ids) - 1 :])
    # the pictures reach the model: another picture in the same spans scores the same ids differently
    other = [picture(100, 80, (0, 255, 0)), images[1]]
    assert not close(rescored(vl.model, processor, [*ids, *result.output_ids], other), reference, tol=1e-3)


async def test_image_rows_decode_the_same_alone_and_batched_with_text_rows(
    vl: TransformersBackend, processor: Any, vl_tokenizer: Any, batch_sizes: list[int], decode_together: Any
) -> None:
    first = expanded(vl_tokenizer, processor, "Describe it.", [picture(224, 224, (0, 128, 255))])
    pair = [picture(56, 56, (9, 9, 9)), picture(448, 120, (200, 0, 0))]
    second = expanded(vl_tokenizer, processor, "Which is bigger?", pair)
    text = (vl_tokenizer.encode("Count to ten: one, two"), ())
    cases = [first, second, text]
    alone = [await vl.generate(request(ids, spans, temperature=0, max_new_tokens=6)) for ids, spans in cases]
    batch_sizes.clear()
    with decode_together(vl, len(cases)):  # image rows reach the queue after their pixels (made off the loop)
        together = await asyncio.gather(
            *(vl.generate(request(ids, spans, temperature=0, max_new_tokens=6)) for ids, spans in cases)
        )
    assert max(batch_sizes) == 3
    for one, batched in zip(alone, together, strict=True):
        assert batched.output_ids == one.output_ids
        assert one.output_logprobs is not None and batched.output_logprobs is not None
        assert close(batched.output_logprobs, one.output_logprobs)


async def test_never_sample_ids_are_masked_but_raw_logprobs_stay_the_models(
    vl: TransformersBackend, processor: Any, vl_tokenizer: Any
) -> None:
    image = picture(112, 112, (0, 0, 0))
    ids, spans = expanded(vl_tokenizer, processor, "Look.", [image])
    free = await vl.generate(request(ids, spans, temperature=0, max_new_tokens=1))
    banned = (*VISION_IDS, free.output_ids[0])
    masked = await vl.generate(
        GenerateRequest(
            rid="masked",
            input_ids=ids,
            prefix_len=0,
            sampling=SamplingParams(temperature=0, max_new_tokens=4),
            media=spans,
            never_sample=banned,
        )
    )
    assert masked.output_ids[0] != free.output_ids[0]
    assert not set(masked.output_ids) & set(banned)
    reference = rescored(vl.model, processor, [*ids, *masked.output_ids], [image])
    assert masked.output_logprobs is not None
    assert close(masked.output_logprobs, reference[len(ids) - 1 :])
    sampled = await vl.generate(request(ids, spans, temperature=1.5, max_new_tokens=32, seed=3))
    assert not set(sampled.output_ids) & set(VISION_IDS)


async def test_a_span_the_processor_disagrees_with_is_a_typed_error_and_nothing_runs(
    vl: TransformersBackend, processor: Any, vl_tokenizer: Any, batch_sizes: list[int]
) -> None:
    image = picture(100, 80, (255, 0, 0))
    ids, (good,) = expanded(vl_tokenizer, processor, "Look.", [image])
    wrong_grid = PromptMedia(span=_replace(good.span, grid_thw=(1, 4, 12)), item=image)
    named = r"image 0 \(png 100x80, sha256 [0-9a-f]{12}\).*grid \[1, 6, 8\]"
    with pytest.raises(BackendRequestError, match=named) as info:
        await vl.generate(request(ids, (wrong_grid,), max_new_tokens=2))
    assert info.value.field == "media[0]" and info.value.backend == "transformers"
    # a span of the right grid but fewer tokens (the prompt expanded for another size)
    short_ids = ids[: good.span.start] + ids[good.span.start + 4 :]
    short = PromptMedia(span=_replace(good.span, length=good.span.length - 4), item=image)
    with pytest.raises(BackendRequestError, match=r"makes it 12 placeholder tokens .* but its span has 8"):
        await vl.generate(request(short_ids, (short,), max_new_tokens=2))
    with pytest.raises(BackendRequestError, match=r"12 image placeholder tokens .* cover 0"):
        await vl.generate(request(ids, (), max_new_tokens=2))
    shifted = PromptMedia(span=_replace(good.span, start=good.span.start - 1), item=image)
    with pytest.raises(BackendRequestError, match="is not all placeholders"):
        await vl.generate(request(ids, (shifted,), max_new_tokens=2))
    assert batch_sizes == []  # nothing reached the model


async def test_images_for_a_text_only_model_are_refused(tiny_backend: Any, processor: Any, vl_tokenizer: Any) -> None:
    ids, spans = expanded(vl_tokenizer, processor, "Look.", [picture(56, 56, (1, 2, 3))])
    with pytest.raises(BackendRequestError, match=r"text-only .* cannot take images"):
        await tiny_backend.generate(request(ids, spans, max_new_tokens=1))


def _replace(span: MediaSpan, **changes: Any) -> MediaSpan:
    import msgspec

    return msgspec.structs.replace(span, **changes)

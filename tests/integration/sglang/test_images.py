"""Images on the real SGLang 0.5.23 CPU server, serving the tiny random Qwen2.5-VL (a second server).

What this proves, on the real engine:
* tito's request shape (one placeholder per image + ``image_data``) is what SGLang's own processor expands back
  into the trajectory's ids (``BaseMultimodalProcessor._expand_input_ids`` with the counts SGLang computes);
* a two-turn trajectory with an image in a user message and one in a tool result, rendered by the HF processor
  (the full render of the conversation), is consumed exactly: ``prompt_tokens`` is the expanded length and every
  text position of the engine's prompt holds the trajectory's id (its prompt logprobs echo them);
* sessions keep working with images: the second turn in a session (only the new ids and the new image sent) gives
  the same output ids and logprobs as a stateless call;
* the output logprobs match a plain transformers forward pass with the images (bf16 noise);
* the ids are recorded for the vLLM suite's comparison (tests/integration/cross_engine.py, case ``images``);
* an image whose placeholder count the engine computes otherwise is a BackendResponseError (``prompt_tokens``);
* a literal ``<image>`` in the text (SGLang's own image sentinel) makes SGLang refuse the prompt: a named
  BackendRequestError, nothing generated;
* a Strands agent on TitoModel (an image in the user's message, a tool returning a picture twice, sessions on) runs
  on the engine; its trajectory is the HF processor's full render of the conversation, with the processor's grids.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import BackendRequestError, BackendResponseError
from tito_core.media import Image, ImageSpan, PromptImage
from tito_sglang import SGLangBackend
from tito_sglang._wire import encode_generate

from ..cross_engine import record_and_compare
from .conftest import REPORT

pytestmark = pytest.mark.integration

IM_END, NEWLINE = 151645, 198
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
FIRST = [
    {"role": "user", "content": [{"type": "text", "text": "What is in it?"}, {"type": "image", "image": USER_IMAGE}]}
]
TOOL_TURN = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "look", "arguments": {}}}],
    },
    {"role": "tool", "content": [{"type": "image", "image": TOOL_IMAGE}, {"type": "text", "text": "the scene"}]},
]


@pytest.fixture(scope="module")
def processor(sglang_vl_model_dir: Path) -> Any:
    """The model's HF processor (the SGLang env has torchvision, so transformers builds the full one)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(sglang_vl_model_dir))


def hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with PIL images, as HF processors take them."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{**p, "image": p["image"].to_pil()} if p["type"] == "image" else p for p in content]
        out.append({**message, "content": content})
    return out


def render(processor: Any, text: str, images: list[Image]) -> tuple[list[int], Any]:
    """The processor's ids for ``text`` with its placeholders expanded for ``images``, and its image inputs."""
    encoded = processor(text=[text], images=[i.to_pil() for i in images], return_tensors="pt")
    return [int(t) for t in encoded["input_ids"][0]], encoded


def prompt_images(processor: Any, ids: list[int], images: list[Image]) -> tuple[PromptImage, ...]:
    """Each image's span: the i-th run of placeholders, as long as the processor's grid says."""
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    grids = processor.image_processor(images=[i.to_pil() for i in images], return_tensors="pt")["image_grid_thw"]
    out, cursor = [], 0
    for image, grid in zip(images, grids.tolist(), strict=True):
        start = ids.index(pad, cursor)
        length = grid[0] * grid[1] * grid[2] // 4
        assert ids[start : start + length] == [pad] * length and ids[start + length] != pad
        span = ImageSpan(start=start, length=length, sha256=image.sha256, format=image.format, size=image.size,
                         grid_thw=tuple(grid), placeholder_id=pad)  # fmt: skip
        out.append(PromptImage(span=span, image=image))
        cursor = start + length
    return tuple(out)


def request(ids: list[int], images: tuple[PromptImage, ...], prefix_len: int, **kwargs: Any) -> GenerateRequest:
    never = tuple(int(t) for t in (images[0].span.placeholder_id, 151652, 151653, 151656))
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    return GenerateRequest(rid=f"tito-vl-{uuid.uuid4().hex}", input_ids=ids, prefix_len=prefix_len, images=images,
                           never_sample=never, sampling=sampling, **kwargs)  # fmt: skip


def test_request_shape_is_what_sglangs_own_processor_expands(processor: Any) -> None:
    """Offline, SGLang's code on tito's body: the placeholder counts SGLang computes for the images, and its
    ``_expand_input_ids`` on the ids tito sends, give back the trajectory's expanded ids exactly."""
    import msgspec
    from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor

    text = processor.apply_chat_template(hf_messages(FIRST + TOOL_TURN), tools=TOOLS, add_generation_prompt=True)
    ids, _ = render(processor, text, [USER_IMAGE, TOOL_IMAGE])
    images = prompt_images(processor, ids, [USER_IMAGE, TOOL_IMAGE])
    body = msgspec.json.decode(encode_generate(request(ids, images, 0)))
    sizes = [(i.size[1], i.size[0]) for i in (USER_IMAGE, TOOL_IMAGE)]  # SGLang passes (height, width)
    counts = [int(c) for c in processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens]
    assert counts == [image.span.length for image in images]
    pad = images[0].span.placeholder_id
    assert BaseMultimodalProcessor._expand_input_ids(body["input_ids"], counts, pad) == ids
    assert len(body["image_data"]) == 2 and body["input_ids"].count(pad) == 2


async def two_turns(
    url: str, processor: Any, session: str
) -> tuple[list[int], list[int], tuple[PromptImage, ...], list[GenerateResult]]:
    """Turn 1: the user's image; turn 2: the tool's image, the first turn's ids and output kept verbatim.

    Returns both turns' prompts, the second's images and both answers.
    """
    backend = SGLangBackend(url, timeout=300.0, session=session)  # type: ignore[arg-type]
    sequence = f"vl-{uuid.uuid4().hex}"
    try:
        first_text = processor.apply_chat_template(hf_messages(FIRST), tools=TOOLS, add_generation_prompt=True)
        first, _ = render(processor, first_text, [USER_IMAGE])
        first_images = prompt_images(processor, first, [USER_IMAGE])
        one = await backend.generate(request(first, first_images, 0, sequence=sequence, return_prompt_logprobs=True))
        # the tool turn as the template renders it after the assistant's end: text from "<|im_start|>user" on
        full_text = processor.apply_chat_template(
            hf_messages(FIRST + TOOL_TURN), tools=TOOLS, add_generation_prompt=True
        )
        tail, _ = render(processor, full_text[full_text.rindex("<|im_start|>user") :], [TOOL_IMAGE])
        held = [*first, *one.output_ids, IM_END, NEWLINE]
        second = held + tail
        images = prompt_images(processor, second, [USER_IMAGE, TOOL_IMAGE])
        assert images[0] == first_images[0]
        # prefix_len: the engine saw ``first`` and its output; IM_END and "\n" are new prompt tokens
        two = await backend.generate(
            request(second, images, len(first) + len(one.output_ids), sequence=sequence, return_prompt_logprobs=True)
        )
        if session == "on":
            assert backend.sessions.open_count == 1
        return first, second, images, [one, two]
    finally:
        await backend.aclose()


def forward_logprobs(model_dir: Path, processor: Any, ids: list[int], images: list[Image], at: int) -> list[float]:
    """A plain transformers forward pass with the images: the logprob of each of ``ids[at:]``."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()
    inputs = processor.image_processor(images=[i.to_pil() for i in images], return_tensors="pt")
    with torch.inference_mode():
        x = torch.tensor([ids])
        logits = model(input_ids=x, pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]).logits
        logprobs = logits[0, :-1].float().log_softmax(-1).gather(-1, x[0, 1:, None])[:, 0]
    return [float(v) for v in logprobs[at - 1 :].tolist()]


async def test_image_turns_are_consumed_exactly(sglang_vl_url: str, sglang_vl_model_dir: Path, processor: Any) -> None:
    first, second, images, (one, two) = await two_turns(sglang_vl_url, processor, session="on")
    # the engine ran on exactly the expanded ids: its count, and its echo of every text position (the decoder checks
    # input_token_logprobs' ids against the trajectory outside the images)
    assert (one.prompt_tokens, two.prompt_tokens) == (len(first), len(second))
    assert one.prompt_logprobs is not None and two.prompt_logprobs is not None
    assert not set(two.output_ids) & {151652, 151653, 151655, 151656}

    _, stateless_second, _, (_, stateless) = await two_turns(sglang_vl_url, processor, session="off")
    assert stateless_second == second  # greedy: the same first turn
    assert stateless.output_ids == two.output_ids and stateless.output_logprobs == pytest.approx(two.output_logprobs)

    full = [*second, *two.output_ids]
    scored = forward_logprobs(sglang_vl_model_dir, processor, full, [USER_IMAGE, TOOL_IMAGE], len(second))
    assert two.output_logprobs is not None
    errors = [abs(a - b) for a, b in zip(two.output_logprobs, scored, strict=True)]
    REPORT.append(
        f"tiny VL, 2 turns ({len(second)} prompt tokens, images {[i.span.length for i in images]} tokens): "
        f"output logprobs vs a transformers forward pass: mean {sum(errors) / len(errors):.1e}, max {max(errors):.1e}"
    )
    assert sum(errors) / len(errors) < BF16_MEAN and max(errors) < BF16_MAX, errors

    why = record_and_compare("sglang", sglang_vl_model_dir, second, list(two.output_ids), case="images")
    REPORT.append(f"cross-engine ids with images: {'equal to vLLM' if why is None else why}")


async def test_an_image_the_engine_counts_otherwise_is_refused(sglang_vl_url: str, processor: Any) -> None:
    """The trajectory says the user's image (its placeholder count), the bytes sent are the tool's larger image:
    SGLang expands the placeholder to the tool image's count, and the answer is refused on ``prompt_tokens``."""
    text = processor.apply_chat_template(hf_messages(FIRST), tools=TOOLS, add_generation_prompt=True)
    ids, _ = render(processor, text, [USER_IMAGE])
    (image,) = prompt_images(processor, ids, [USER_IMAGE])
    swapped = PromptImage(span=image.span, image=TOOL_IMAGE)
    backend = SGLangBackend(sglang_vl_url, timeout=300.0, session="off")
    try:
        with pytest.raises(BackendResponseError, match="prompt tokens") as caught:
            await backend.generate(request(ids, (swapped,), 0))
    finally:
        await backend.aclose()
    assert caught.value.field == "meta_info.prompt_tokens" and caught.value.value > len(ids)


async def test_a_literal_image_sentinel_in_the_text_is_a_named_request_error(
    sglang_vl_url: str, processor: Any
) -> None:
    """SGLang's Qwen-VL processor also counts ``<image>`` in the decoded prompt as an image: with it in the user's
    text SGLang refuses the prompt (HTTP 400 before generating), which the adapter names."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "Is <image> a tag?"}, FIRST[0]["content"][1]]}]
    text = processor.apply_chat_template(hf_messages(messages), tools=TOOLS, add_generation_prompt=True)
    ids, _ = render(processor, text, [USER_IMAGE])
    images = prompt_images(processor, ids, [USER_IMAGE])
    backend = SGLangBackend(sglang_vl_url, timeout=300.0, session="off")
    try:
        with pytest.raises(BackendRequestError, match="literal text '<image>'") as caught:
            await backend.generate(request(ids, images, 0))
    finally:
        await backend.aclose()
    assert caught.value.status == 400 and caught.value.field == "input_ids"


CALL_RX = r"<tool_call>\n<function=look>\n</function>\n</tool_call>"
ANSWER_RX = r"It is (red|green|blue)\."


def strands_image(image: Image) -> dict[str, Any]:
    return {"image": {"format": image.format, "source": {"bytes": image.data}}}


async def test_an_image_agent_through_tito_model(sglang_vl_url: str, sglang_vl_model_dir: Path, processor: Any) -> None:
    """A Strands agent on TitoModel: an image in the user's message, a tool that returns a picture twice, then an
    answer (tool calls and the answer forced by regex). Every request extends the trajectory and the engine ran on
    it whole; the trajectory's text is the HF processor's full render of the conversation; the spans are the
    processor's grids over runs of placeholders."""
    from strands import Agent, tool

    from tito_core import TitoModel
    from tito_core.strands_messages import to_chat_messages

    pictures = [picture(90, 70, 11), picture(130, 60, 99)]
    backend = SGLangBackend(sglang_vl_url, timeout=300.0, session="on")
    model = await TitoModel.create(backend, str(sglang_vl_model_dir), tool_parser="qwen_xml",
                      chat_template_kwargs={"enable_thinking": False},
                      sampling={"max_new_tokens": 40, "temperature": 0.0, "extra": {"regex": CALL_RX}})  # fmt: skip
    calls: list[int] = []

    @tool
    def look() -> dict[str, Any]:
        """Take a picture of the scene."""
        calls.append(len(calls))
        if len(calls) == len(pictures):
            model.update_config(sampling={"max_new_tokens": 16, "temperature": 0.0, "extra": {"regex": ANSWER_RX}})
        return {"status": "success", "content": [strands_image(pictures[len(calls) - 1]), {"text": "the scene"}]}

    agent = Agent(model=model, tools=[look], callback_handler=None)
    try:
        await agent.invoke_async([{"role": "user", "content": [{"text": "What is in it?"}, strands_image(USER_IMAGE)]}])
    finally:
        await backend.aclose()
    trajectory = model.trajectory
    assert len(calls) == 2 and trajectory.status == "completed"
    assert [turn.stop_reason for turn in trajectory.turns] == ["tool_use", "tool_use", "end_turn"]
    ids = list(trajectory.token_ids)
    spans = trajectory.images
    images = [USER_IMAGE, *pictures]
    assert [s.sha256 for s in spans] == [i.sha256 for i in images]
    grids = processor.image_processor(images=[i.to_pil() for i in images], return_tensors="pt")["image_grid_thw"]
    assert [s.grid_thw for s in spans] == [tuple(g) for g in grids.tolist()]
    for span in spans:
        assert ids[span.start - 1] == 151652 and ids[span.end] == 151653
        assert ids[span.start : span.end] == [span.placeholder_id] * span.length
    # the full render of the conversation the last call saw (the agent's messages before its answer)
    last = trajectory.turns[-1]
    messages = to_chat_messages(agent.messages[:-1])
    tools = [
        {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                          "parameters": t["inputSchema"]["json"]}}
        for t in agent.tool_registry.get_all_tool_specs()
    ]  # fmt: skip
    text = processor.apply_chat_template(
        hf_messages(messages), tools=tools, add_generation_prompt=True, enable_thinking=False
    )
    reference, _ = render(processor, text, images)
    # as text: the engine's outputs are kept as it produced them, and under the regex it spells "<tool_call>" with
    # plain tokens (62752 ...) where a render has the special token 151657; the prompts are tito's own render
    decode = processor.tokenizer.decode
    assert decode(ids[: last.prompt_start + last.prompt_len]) == decode(reference)
    REPORT.append(
        f"image agent through TitoModel (session on): {len(trajectory.turns)} calls, {len(ids)} tokens, "
        f"image spans {[(s.start, s.length, s.grid_thw) for s in spans]}"
    )

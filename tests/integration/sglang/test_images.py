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
* the ids of the scenario's two turns and of its agent (tests/integration/image_scenario.py) are vLLM's and the
  embedded backend's (tests/integration/cross_engine.py, cases ``image-turns`` and ``image-agent``);
* an image whose placeholder count the engine computes otherwise is a BackendResponseError (``prompt_tokens``);
* a literal ``<image>`` in the text (SGLang's own image sentinel) makes SGLang refuse the prompt: a named
  BackendRequestError, nothing generated;
* a Strands agent on TitoModel (an image in the user's message, a tool returning a picture twice, sessions on) runs
  on the engine; its trajectory is the HF processor's full render of the conversation, with the processor's grids.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateResult
from tito_core.errors import BackendRequestError, BackendResponseError
from tito_core.media import Image, PromptMedia
from tito_sglang import SGLangBackend
from tito_sglang._wire import encode_generate

from ..cross_engine import record_and_compare_ids
from ..image_scenario import (
    AGENT_PICTURES,
    FIRST,
    TOOL_IMAGE,
    TOOL_TURN,
    TOOLS,
    USER_IMAGE,
    agent_ids,
    check_agent,
    describe_spans,
    hf_messages,
    near_tie,
    prompt_images,
    render,
    request,
    run_agent,
    turn_ids,
    two_turns,
)
from .conftest import REPORT

pytestmark = pytest.mark.integration

BF16_MEAN, BF16_MAX = 5e-3, 2e-2  # the suite's bf16 noise bounds (tests/integration/weight_updates.py)


@pytest.fixture(scope="module")
def processor(sglang_vl_model_dir: Path) -> Any:
    """The model's HF processor (the SGLang env has torchvision, so transformers builds the full one)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(sglang_vl_model_dir))


def test_request_shape_is_what_sglangs_own_processor_expands(processor: Any) -> None:
    """Offline, SGLang's code on tito's body: the placeholder counts SGLang computes for the images, and its
    ``_expand_input_ids`` on the ids tito sends, give back the trajectory's expanded ids exactly."""
    import msgspec
    from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor

    text = processor.apply_chat_template(hf_messages(FIRST + TOOL_TURN), tools=TOOLS, add_generation_prompt=True)
    ids = render(processor, text, [USER_IMAGE, TOOL_IMAGE])
    images = prompt_images(processor, ids, [USER_IMAGE, TOOL_IMAGE])
    body = msgspec.json.decode(encode_generate(request(ids, images, 0)))
    sizes = [(i.size[1], i.size[0]) for i in (USER_IMAGE, TOOL_IMAGE)]  # SGLang passes (height, width)
    counts = [int(c) for c in processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens]
    assert counts == [image.span.length for image in images]
    pad = images[0].span.placeholder_id
    assert BaseMultimodalProcessor._expand_input_ids(body["input_ids"], counts, pad) == ids
    assert len(body["image_data"]) == 2 and body["input_ids"].count(pad) == 2


async def sglang_turns(
    url: str, processor: Any, session: str
) -> tuple[list[int], list[int], tuple[PromptMedia, ...], list[GenerateResult]]:
    """The scenario's two turns on SGLang (one sequence, prompt logprobs on), ``session`` on or off."""
    backend = SGLangBackend(url, timeout=300.0, session=session)  # type: ignore[arg-type]
    try:
        turns = await two_turns(backend, processor, sequence=f"vl-{uuid.uuid4().hex}", return_prompt_logprobs=True)
        if session == "on":
            assert backend.sessions.open_count == 1
        return turns
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
    first, second, images, (one, two) = await sglang_turns(sglang_vl_url, processor, session="on")
    # the engine ran on exactly the expanded ids: its count, and its echo of every text position (the decoder checks
    # input_token_logprobs' ids against the trajectory outside the images)
    assert (one.prompt_tokens, two.prompt_tokens) == (len(first), len(second))
    assert one.prompt_logprobs is not None and two.prompt_logprobs is not None
    assert not set(two.output_ids) & {151652, 151653, 151655, 151656}

    _, stateless_second, _, (_, stateless) = await sglang_turns(sglang_vl_url, processor, session="off")
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

    ids, mask = turn_ids(first, second, [one, two])
    gap = near_tie(sglang_vl_model_dir, processor, ids, [USER_IMAGE, TOOL_IMAGE])
    REPORT.append(record_and_compare_ids("sglang", sglang_vl_model_dir, "image-turns", ids, mask, gap))


async def test_an_image_the_engine_counts_otherwise_is_refused(sglang_vl_url: str, processor: Any) -> None:
    """The trajectory says the user's image (its placeholder count), the bytes sent are the tool's larger image:
    SGLang expands the placeholder to the tool image's count, and the answer is refused on ``prompt_tokens``."""
    text = processor.apply_chat_template(hf_messages(FIRST), tools=TOOLS, add_generation_prompt=True)
    ids = render(processor, text, [USER_IMAGE])
    (image,) = prompt_images(processor, ids, [USER_IMAGE])
    swapped = PromptMedia(span=image.span, item=TOOL_IMAGE)
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
    ids = render(processor, text, [USER_IMAGE])
    images = prompt_images(processor, ids, [USER_IMAGE])
    backend = SGLangBackend(sglang_vl_url, timeout=300.0, session="off")
    try:
        with pytest.raises(BackendRequestError, match="literal text '<image>'") as caught:
            await backend.generate(request(ids, images, 0))
    finally:
        await backend.aclose()
    assert caught.value.status == 400 and caught.value.field == "input_ids"


async def test_an_image_agent_through_tito_model(sglang_vl_url: str, sglang_vl_model_dir: Path, processor: Any) -> None:
    """The scenario's agent on TitoModel (sessions on): every request extends the trajectory and the engine ran
    on it whole; the trajectory's text is the HF processor's full render of the conversation; the spans are the
    processor's grids over runs of placeholders; the ids are vLLM's (when its suite ran here)."""
    backend = SGLangBackend(sglang_vl_url, timeout=300.0, session="on")
    agent, trajectory = await run_agent(backend, sglang_vl_model_dir, lambda regex: {"regex": regex})
    check_agent(processor, agent, trajectory)
    REPORT.append(
        f"image agent through TitoModel (session on): {len(trajectory.turns)} calls, "
        f"{len(trajectory.token_ids)} tokens, image spans {describe_spans(trajectory)}"
    )
    ids, mask = agent_ids(trajectory)
    gap = near_tie(sglang_vl_model_dir, processor, ids, [USER_IMAGE, *AGENT_PICTURES])
    REPORT.append(record_and_compare_ids("sglang", sglang_vl_model_dir, "image-agent", ids, mask, gap, forced=True))

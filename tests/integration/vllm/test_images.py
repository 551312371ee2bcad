"""Images on the real vLLM 0.32 CPU server, serving the tiny random Qwen2.5-VL (a second server, see conftest).

What this proves, on the real engine:
* the ``features`` tito sends are what vLLM's own code reads: its request model validates them, and the tensors
  the server's processor made for an image (decoded with vLLM's own decoder) are the reference processor's;
* a two-turn trajectory with an image in a user message and one in a tool result, rendered by the HF processor
  (the full render of the conversation), is consumed exactly: ``prompt_tokens`` is the expanded length and the
  server's echo of the prompt is the trajectory's ids;
* the output logprobs match a plain transformers forward pass with the images (bf16 noise);
* a Strands agent on TitoModel (an image in the user's message, a tool returning a picture twice) runs on the
  engine: every call's prompt is the whole trajectory before it (the server's echo), its text the HF processor's
  full render of the conversation, its spans the processor's grids;
* the ids of both (tests/integration/image_scenario.py, the scenario SGLang's suite and the embedded backend run)
  are recorded for the others and compared with theirs (tests/integration/cross_engine.py, cases
  ``image-turns`` and ``image-agent``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tito_vllm import VLLMBackend

from ..cross_engine import record_and_compare_ids
from ..image_scenario import (
    AGENT_PICTURES,
    FIRST,
    TOOL_IMAGE,
    TOOL_TURN,
    TOOLS,
    USER_IMAGE,
    VISION_IDS,
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
from ..reference import Reference
from .conftest import REPORT

pytestmark = pytest.mark.integration

BF16_MEAN, BF16_MAX = 5e-3, 2e-2  # the suite's bf16 noise bounds (tests/integration/weight_updates.py)


@pytest.fixture(scope="module")
def processor(tiny_vl_dir: Path) -> Any:
    """The model's HF processor, built in code: this environment has no torchvision (tito_testing.vision)."""
    from transformers import AutoTokenizer

    from tito_testing.vision import hf_processor, vl_chat_template

    return hf_processor(AutoTokenizer.from_pretrained(str(tiny_vl_dir)), vl_chat_template())


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
        first, second, images, (one, two) = await two_turns(backend, processor, return_logprobs=True)
    finally:
        await backend.aclose()
    # the engine ran on exactly the expanded ids: its count, and its echo of the whole prompt
    assert (one.prompt_tokens, two.prompt_tokens) == (len(first), len(second))
    assert (one.prompt_ids, two.prompt_ids) == (first, second)
    assert not set(one.output_ids + two.output_ids) & set(VISION_IDS)

    pixels = processor.image_processor(images=[i.to_pil() for i in (USER_IMAGE, TOOL_IMAGE)])
    scored = Reference().score(tiny_vl_dir, [*second, *two.output_ids], images=pixels)[len(second) - 1 :]
    assert two.output_logprobs is not None
    errors = [abs(a - b) for a, b in zip(two.output_logprobs, scored, strict=True)]
    REPORT.append(
        f"tiny VL, 2 turns ({len(second)} prompt tokens, images {[i.span.length for i in images]} tokens): "
        f"output logprobs vs a transformers forward pass: mean {sum(errors) / len(errors):.1e}, max {max(errors):.1e}"
    )
    assert sum(errors) / len(errors) < BF16_MEAN and max(errors) < BF16_MAX, errors

    ids, mask = turn_ids(first, second, [one, two])
    gap = near_tie(tiny_vl_dir, processor, ids, [USER_IMAGE, TOOL_IMAGE])
    REPORT.append(record_and_compare_ids("vllm", tiny_vl_dir, "image-turns", ids, mask, gap))


async def test_an_image_agent_through_tito_model(vllm_vl_url: str, tiny_vl_dir: Path, processor: Any) -> None:
    """The scenario's agent on TitoModel: every request extends the trajectory and the engine ran on it whole
    (``prompt_tokens`` and vLLM's echo of each prompt); the trajectory's text is the
    HF processor's full render of the conversation; the spans are the processor's grids over runs of
    placeholders; the ids are recorded for the SGLang suite (and compared with its record, if it ran first)."""
    backend = VLLMBackend(vllm_vl_url, timeout=300.0, return_prompt_ids=True)
    echoed: list[tuple[list[int], int]] = []
    generate = backend.generate

    async def recording(request: Any) -> Any:
        result = await generate(request)
        echoed.append((list(request.input_ids), result.prompt_tokens))
        assert result.prompt_ids == list(request.input_ids)  # the server's echo of what it consumed
        return result

    backend.generate = recording  # type: ignore[method-assign]
    agent, trajectory = await run_agent(backend, tiny_vl_dir, lambda regex: {"structured_outputs": {"regex": regex}})
    reference = check_agent(processor, agent, trajectory)
    ids = list(trajectory.token_ids)
    assert len(echoed) == len(trajectory.turns) == 3
    for (prompt, prompt_tokens), turn in zip(echoed, trajectory.turns, strict=True):
        # each call's prompt is the whole trajectory before its output, and the engine counted exactly that
        assert prompt == ids[: turn.prompt_start + turn.prompt_len] and prompt_tokens == len(prompt)
    last = trajectory.turns[-1]
    REPORT.append(
        f"image agent through TitoModel: {len(trajectory.turns)} calls, {len(ids)} tokens (last prompt "
        f"{last.prompt_start + last.prompt_len}, the processor's render {len(reference)}), "
        f"image spans {describe_spans(trajectory)}"
    )
    ids, mask = agent_ids(trajectory)
    gap = near_tie(tiny_vl_dir, processor, ids, [USER_IMAGE, *AGENT_PICTURES])
    REPORT.append(record_and_compare_ids("vllm", tiny_vl_dir, "image-agent", ids, mask, gap, forced=True))

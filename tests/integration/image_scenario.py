"""One image scenario for every engine that runs the tiny random Qwen2.5-VL: vLLM, SGLang and the embedded backend.

The pictures, messages and tools of two scenarios, and the reference every engine is held to (the HF processor's
full render of the conversation, with the processor's grids):

* **two turns** (:func:`two_turns`): an image in the user's message, then the tool's image, the first turn's ids
  and output kept verbatim; greedy, 6 new tokens each;
* **the agent** (:func:`run_agent`): a Strands agent on TitoModel, an image in the user's message, a tool that
  returns a picture twice, then an answer (the tool calls and the answer forced by regex: the random model would
  never call a tool by itself). :func:`check_agent` checks its trajectory against the processor.

Each engine records both trajectories (ids and loss mask) for the others (tests/integration/cross_engine.py:
:func:`~tests.integration.cross_engine.compare_ids`); :func:`turn_ids` and :func:`agent_ids` give them.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tito_core.backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from tito_core.media import Image, MediaSpan, PromptMedia

from . import cross_engine

IM_END, NEWLINE = 151645, 198
VISION_START, VISION_END = 151652, 151653
VISION_IDS = (151652, 151653, 151655, 151656)  # never sampled: <|vision_start|>, <|vision_end|>, image/video pads
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
AGENT_PICTURES = (picture(90, 70, 11), picture(130, 60, 99))  # what the agent's tool returns, call by call
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
CALL_RX = r"<tool_call>\n<function=look>\n</function>\n</tool_call>"
ANSWER_RX = r"It is (red|green|blue)\."

# -- the reference: the HF processor ---------------------------------------------------------------------------


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


def grids(processor: Any, images: list[Image]) -> list[tuple[int, int, int]]:
    """The processor's vision grid (t, h, w) of each image."""
    found = processor.image_processor(images=[i.to_pil() for i in images])["image_grid_thw"]
    return [(int(g[0]), int(g[1]), int(g[2])) for g in found]


def prompt_images(processor: Any, ids: list[int], images: list[Image]) -> tuple[PromptMedia, ...]:
    """Each image's span: the i-th run of placeholders, as long as the processor's grid says."""
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    out, cursor = [], 0
    for image, grid in zip(images, grids(processor, images), strict=True):
        start = ids.index(pad, cursor)
        length = grid[0] * grid[1] * grid[2] // 4
        assert ids[start : start + length] == [pad] * length and ids[start + length] != pad
        span = MediaSpan(start=start, length=length, sha256=image.sha256, format=image.format, size=image.size,
                         grid_thw=grid, placeholder_id=pad)  # fmt: skip
        out.append(PromptMedia(span=span, item=image))
        cursor = start + length
    return tuple(out)


# -- two turns -------------------------------------------------------------------------------------------------


def request(ids: list[int], images: tuple[PromptMedia, ...], prefix_len: int, **kwargs: Any) -> GenerateRequest:
    """A greedy 6-token request over ``ids`` with their images; the vision ids never sampled."""
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    return GenerateRequest(rid=f"tito-vl-{uuid.uuid4().hex}", input_ids=ids, prefix_len=prefix_len, media=images,
                           never_sample=VISION_IDS, sampling=sampling, **kwargs)  # fmt: skip


async def two_turns(
    backend: Backend, processor: Any, **kwargs: Any
) -> tuple[list[int], list[int], tuple[PromptMedia, ...], list[GenerateResult]]:
    """Turn 1: the user's image; turn 2: the tool's image, the first turn's ids and output kept verbatim.

    ``kwargs`` go to both requests (``sequence``, logprob options). Returns both turns' prompts, the second's
    images and both answers.
    """
    first_text = processor.apply_chat_template(hf_messages(FIRST), tools=TOOLS, add_generation_prompt=True)
    first = render(processor, first_text, [USER_IMAGE])
    first_images = prompt_images(processor, first, [USER_IMAGE])
    one = await backend.generate(request(first, first_images, 0, **kwargs))
    # the tool turn as the template renders it after the assistant's end: text from "<|im_start|>user" on
    full_text = processor.apply_chat_template(hf_messages(FIRST + TOOL_TURN), tools=TOOLS, add_generation_prompt=True)
    tail = render(processor, full_text[full_text.rindex("<|im_start|>user") :], [TOOL_IMAGE])
    second = [*first, *one.output_ids, IM_END, NEWLINE, *tail]
    images = prompt_images(processor, second, [USER_IMAGE, TOOL_IMAGE])
    assert images[0] == first_images[0]
    # prefix_len: the engine saw ``first`` and its output; IM_END and "\n" are new prompt tokens
    two = await backend.generate(request(second, images, len(first) + len(one.output_ids), **kwargs))
    return first, second, images, [one, two]


def turn_ids(first: list[int], second: list[int], answers: list[GenerateResult]) -> tuple[list[int], list[int]]:
    """The two turns as one trajectory: its ids and loss mask (1 = the engine's output)."""
    one, two = answers
    ids = [*second, *two.output_ids]
    mask = [0] * len(first) + [1] * len(one.output_ids) + [0] * (len(second) - len(first) - len(one.output_ids))
    return ids, mask + [1] * len(two.output_ids)


# -- the agent ---------------------------------------------------------------------------------------------------


def strands_image(image: Image) -> dict[str, Any]:
    """An image as a Strands content block."""
    return {"image": {"format": image.format, "source": {"bytes": image.data}}}


async def run_agent(backend: Backend, model_dir: Path, constrain: Callable[[str], dict[str, Any]]) -> tuple[Any, Any]:
    """A Strands agent on TitoModel over ``backend``: the user's image, ``look`` twice (each returns a picture),
    then an answer. ``constrain(regex)`` is the engine's ``sampling.extra`` forcing ``regex``. Closes ``backend``;
    returns the agent and its trajectory."""
    from strands import Agent, tool

    from tito_core import TitoModel

    sampling = {"max_new_tokens": 40, "temperature": 0.0, "extra": constrain(CALL_RX)}
    model = await TitoModel.create(backend, str(model_dir), tool_parser="qwen_xml",
                                   chat_template_kwargs={"enable_thinking": False}, sampling=sampling)  # fmt: skip
    calls: list[int] = []

    @tool
    def look() -> dict[str, Any]:
        """Take a picture of the scene."""
        calls.append(len(calls))
        if len(calls) == len(AGENT_PICTURES):
            model.update_config(sampling={"max_new_tokens": 16, "temperature": 0.0, "extra": constrain(ANSWER_RX)})
        return {"status": "success", "content": [strands_image(AGENT_PICTURES[len(calls) - 1]), {"text": "the scene"}]}

    agent = Agent(model=model, tools=[look], callback_handler=None)
    try:
        await agent.invoke_async([{"role": "user", "content": [{"text": "What is in it?"}, strands_image(USER_IMAGE)]}])
    finally:
        await backend.aclose()
    assert len(calls) == len(AGENT_PICTURES)
    return agent, model.trajectory


def check_agent(processor: Any, agent: Any, trajectory: Any) -> list[int]:
    """Check the agent's trajectory against the HF processor; returns the processor's render of the last prompt.

    Three calls (two tool calls, an answer); the spans are the processor's grids over runs of placeholders between
    ``<|vision_start|>`` and ``<|vision_end|>``; the last call's prompt is, as text, the processor's full render of
    the conversation that call saw. As text: the engine's outputs are kept as it produced them, and under the regex
    it spells ``<tool_call>`` with plain tokens (62752 ...) where a render has the special token 151657.
    """
    from tito_core.strands_front.messages import to_chat_messages

    assert trajectory.status == "completed"
    assert [turn.stop_reason for turn in trajectory.turns] == ["tool_use", "tool_use", "end_turn"]
    ids = list(trajectory.token_ids)
    spans = trajectory.media
    images = [USER_IMAGE, *AGENT_PICTURES]
    assert [s.sha256 for s in spans] == [i.sha256 for i in images]
    assert [s.grid_thw for s in spans] == grids(processor, images)
    for span in spans:
        assert ids[span.start - 1] == VISION_START and ids[span.end] == VISION_END
        assert ids[span.start : span.end] == [span.placeholder_id] * span.length
    generated = [t for t, m in zip(ids, trajectory.loss_mask, strict=True) if m]
    assert not set(generated) & set(VISION_IDS)
    last = trajectory.turns[-1]
    messages = to_chat_messages(agent.messages[:-1])  # what the last call saw: all but its answer
    tools = [
        {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                          "parameters": t["inputSchema"]["json"]}}
        for t in agent.tool_registry.get_all_tool_specs()
    ]  # fmt: skip
    text = processor.apply_chat_template(
        hf_messages(messages), tools=tools, add_generation_prompt=True, enable_thinking=False
    )
    reference = render(processor, text, images)
    decode = processor.tokenizer.decode
    assert decode(ids[: last.prompt_start + last.prompt_len]) == decode(reference)
    return reference


def agent_ids(trajectory: Any) -> tuple[list[int], list[int]]:
    """The agent's trajectory: its ids and loss mask."""
    return [int(t) for t in trajectory.token_ids], [int(m) for m in trajectory.loss_mask]


def describe_spans(trajectory: Any) -> str:
    """The trajectory's image spans, as (start, length, grid)."""
    return str([(s.start, s.length, s.grid_thw) for s in trajectory.media])


def near_tie(model_dir: Path, processor: Any, ids: list[int], images: list[Image]) -> Callable[[int, int], float]:
    """``gap(position, theirs)``: how far apart the logprobs of ``ids[position]`` and ``theirs`` are after
    ``ids[:position]`` under a plain bf16 forward pass of the checkpoint with the images shown so far
    (:func:`~tests.integration.cross_engine.near_tie`)."""

    def shown_before(position: int) -> Any:
        shown = images[: ids[:position].count(VISION_START)]
        return processor.image_processor(images=[i.to_pil() for i in shown], return_tensors="pt") if shown else None

    return cross_engine.near_tie(model_dir, ids, shown_before)

"""A video tool result on the embedded backend and the tiny random Qwen2.5-VL: the second input kind, end to end.

A rollout (the core's ``Rollout``, which every front drives) asks about a screen, is forced to call ``record``,
and gets back a short screen recording: a :class:`~tito_core.media.Video` of frames in the tool message. The
recorded ids equal Hugging Face's ``Qwen2_5_VLProcessor``'s full render of the same conversation (the clip's
``<|video_pad|>`` run, its ``video_grid_thw``), and the logprobs the backend reported equal a plain forward pass of
the model over the recorded ids with the processor's ``pixel_values_videos``, ``video_grid_thw`` and
``second_per_grid_ts`` (transformers computes the 3-D positions itself). Float32, so the comparison is exact to
1e-4.

transformers' video processors need torchvision. The ``tests_transformers`` session's CPU torch has no CPU
torchvision on the index here, so there the module is skipped with the reason; the ``integration_sglang``
session (torch 2.14.1 with torchvision 0.29.1, CPU) runs it.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import SamplingParams
from tito_core.conversation import Conversation
from tito_core.export import to_slime, to_trl, to_verl
from tito_core.media import Image, MediaError, Video, VideoError, image_part, video_part
from tito_core.media.processor import load_video_processor
from tito_core.model_setup import vision_processor
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.trajectory import Trajectory
from tito_testing.vision import vl_chat_template

VIDEO_PAD, IMAGE_PAD = 151656, 151655
NO_THINK = {"enable_thinking": False}
TOOLS = [{"name": "record", "description": "record the screen", "inputSchema": {"json": {"type": "object"}}}]


@pytest.fixture(scope="module")
def video_processor(tiny_vl_dir: Path) -> Any:
    try:
        from transformers import AutoVideoProcessor

        return AutoVideoProcessor.from_pretrained(str(tiny_vl_dir))
    except Exception as exc:  # no torchvision, or one built for another torch
        pytest.skip(f"transformers' video processor does not load here ({type(exc).__name__}: {exc})")


@pytest.fixture(scope="module")
def backend(tiny_vl_dir: Path, video_processor: Any) -> Iterator[Any]:
    from tito_transformers import TransformersBackend

    vl = TransformersBackend(tiny_vl_dir, dtype="float32", num_threads=1)
    yield vl
    vl.close()


def frame(width: int, height: int, step: int) -> bytes:
    """One frame of a screen recording: a cursor box moving right."""
    from PIL import Image as PILImage
    from PIL import ImageDraw

    canvas = PILImage.new("RGB", (width, height), (250, 250, 250))
    ImageDraw.Draw(canvas).rectangle((8 + 12 * step, 10, 28 + 12 * step, 30), fill=(200, 30, 30))
    out = io.BytesIO()
    canvas.save(out, format="PNG")
    return out.getvalue()


def to_hf(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """The conversation as the HF processor takes it: placeholder parts, and the pictures and clips in order."""
    images: list[Any] = []
    videos: list[Any] = []
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if part["type"] == "image":
                    images.append(part["image"].to_pil())
                    parts.append({"type": "image"})
                elif part["type"] == "video":
                    videos.append(part["video"].to_pil_frames())
                    parts.append({"type": "video"})
                else:
                    parts.append(part)
            content = parts
        out.append({**message, "content": content})
    return out, images, videos


def rescored(model: Any, ids: list[int], processed: Any) -> list[float]:
    """``log p(ids[i] | ids[:i])`` for i >= 1 by a plain forward pass with the processor's pixel inputs."""
    import torch

    full = torch.tensor([ids])
    pixels = {k: v for k, v in processed.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    types = (full == IMAGE_PAD).int() + 2 * (full == VIDEO_PAD).int()  # text 0, image 1, video 2
    with torch.inference_mode():
        logits = model(input_ids=full, mm_token_type_ids=types, **pixels).logits[0, :-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, full[0, 1:, None])[:, 0]
    return [float(x) for x in logprobs.tolist()]


def test_the_backend_takes_videos_where_the_video_processor_loads(backend: Any) -> None:
    assert backend.input_kinds == {"image", "video"}
    assert backend.capabilities().input_kinds == {"image", "video"}


@pytest.mark.parametrize(
    ("width", "height", "frames"), [(100, 80, 4), (200, 60, 3), (56, 56, 1), (300, 300, 6), (64, 500, 5)]
)
def test_tito_sizes_a_clip_as_the_video_processor_does(
    video_processor: Any, tiny_vl_dir: Path, width: int, height: int, frames: int
) -> None:
    from transformers import AutoTokenizer

    vision = vision_processor(str(tiny_vl_dir), AutoTokenizer.from_pretrained(str(tiny_vl_dir)))
    assert vision is not None
    clip = Video([frame(width, height, step) for step in range(frames)])
    grid, count = vision.measure(clip)
    out = video_processor(videos=[clip.to_pil_frames()], do_sample_frames=False, return_tensors="pt")
    assert [list(grid or ())] == out["video_grid_thw"].tolist()
    assert count * 4 == out["pixel_values_videos"].shape[0]  # patches, merged 2x2 into the pads


def test_a_video_tool_result_gives_the_processors_ids_and_logprobs_a_forward_pass_scores(
    backend: Any, tiny_vl_dir: Path
) -> None:
    import torch
    from transformers import AutoProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_vl_dir))
    hf = AutoProcessor.from_pretrained(str(tiny_vl_dir))
    template = vl_chat_template()
    vision = vision_processor(str(tiny_vl_dir), tok)
    assert vision is not None and vision.kinds == {"image", "video"}
    run = Rollout(
        backend,
        ChatRenderer(tok, chat_template=template, template_kwargs=NO_THINK),
        get_tool_parser("qwen_xml"),
        vision=vision,
    )
    screen = Image(frame(120, 90, 0))
    clip = Video([frame(120, 90, step) for step in range(5)], fps=4.0)  # 5 frames: the last one is repeated
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [image_part(screen), {"type": "text", "text": "What moves on this screen?"}]}
    ]
    forced = CallOptions(tool_choice={"tool": {"name": "record"}}, sampling=SamplingParams(max_new_tokens=24))
    free = CallOptions(sampling=SamplingParams(max_new_tokens=12))

    async def go() -> None:
        first = await run.call(Conversation(messages=list(messages), tool_specs=TOOLS), forced)
        messages.append(first.reply())
        (call,) = first.reply()["tool_calls"]
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": [video_part(clip)]})
        await run.call(Conversation(messages=list(messages), tool_specs=TOOLS), free)

    asyncio.run(go())
    traj = run.trajectory
    assert len(traj.turns) == 2  # the second call may end at its token limit (status truncated)
    image_span, video_span = traj.media
    assert (image_span.kind, video_span.kind) == ("image", "video")
    assert video_span.frames == tuple(f.sha256 for f in clip.frames) and video_span.fps == 4.0
    # the processor's full render of the conversation: the first prompt is its head, the tool result's prompt (the
    # clip's pads among it) its tail; between them the template re-renders the model's call, which tito never does
    first, second = traj.turns
    hf_messages, images, videos = to_hf(messages)
    spec = {"type": "function", "function": {"name": "record", "description": "record the screen", "parameters": {}}}
    spec["function"]["parameters"] = {"type": "object"}
    text = tok.apply_chat_template(
        hf_messages, tools=[spec], add_generation_prompt=True, tokenize=False, chat_template=template, **NO_THINK
    )
    metadata = [{"total_num_frames": len(clip.frames), "fps": clip.fps}]  # the clip's rate, as tito records it

    def processed(clips: list[Any]) -> Any:
        return hf(
            text=[text],
            images=images,
            videos=clips,
            video_metadata=metadata,
            do_sample_frames=False,
            return_tensors="pt",
        )

    full = processed(videos)
    rendered = full["input_ids"][0].tolist()
    ids = traj.token_ids
    assert ids[: first.output_start] == rendered[: first.output_start]
    tail = ids[first.output_start + first.output_len : second.output_start]
    assert VIDEO_PAD in tail and tail == rendered[len(rendered) - len(tail) :]
    assert [list(video_span.grid_thw or ())] == full["video_grid_thw"].tolist() == [[3, 6, 8]]
    assert video_span.length == 3 * 6 * 8 // 4
    assert full["second_per_grid_ts"].tolist() == [0.5]  # temporal_patch_size 2 / 4 fps
    # every output logprob the engine reported equals a plain forward pass over the recorded ids
    reference = rescored(backend.model, ids, full)
    # (the free call's: a forced call's logprobs are the grammar-constrained distribution's, not the model's)
    logprobs, after = traj.logprobs, second.output_start
    scored = [(i, logprobs[i]) for i in range(after, after + second.output_len)]
    assert scored and all(lp is not None and abs(lp - reference[i - 1]) <= 1e-4 for i, lp in scored), [
        (i, lp, reference[i - 1]) for i, lp in scored
    ]
    # the clip reaches the model: other frames in the same span score the same ids differently
    still = [[frames[0]] * len(frames) for frames in videos]
    moved = rescored(backend.model, ids, processed(still))
    assert max(abs(moved[i - 1] - reference[i - 1]) for i, _ in scored) > 1e-3
    # the record keeps the clip: its frames once each, read back into the same Video
    back = Trajectory.from_json(traj.to_json())
    assert back.media == traj.media and back.prompt_media()[1].item == clip
    assert len(traj.image_bytes()) == 5  # the five frames; the screen is the first frame, stored once
    # the exports carry the clip where the trainer takes one, with the pixels the engine consumed
    verl = to_verl(traj)["multi_modal_data"]
    ((frames, meta),) = verl["videos"]
    assert len(verl["images"]) == 1 and len(frames) == 5 and meta == {"fps": 4.0, "total_num_frames": 5}
    train = to_slime(traj, processor=str(tiny_vl_dir))["multimodal_train_inputs"]
    assert train["video_grid_thw"].tolist() == [[3, 6, 8]] and train["image_grid_thw"].tolist() == [[1, 6, 8]]
    assert torch.equal(train["pixel_values_videos"], full["pixel_values_videos"])
    assert torch.equal(train["pixel_values"], full["pixel_values"])
    # the export's video processor is loaded once per directory, like the image processor (not once per sample)
    assert load_video_processor(tiny_vl_dir) is load_video_processor(str(tiny_vl_dir))
    with pytest.raises(VideoError, match=r"TRL's multimodal field takes images only; rollout .* holds 1 video"):
        to_trl(traj)


def test_a_clip_for_a_text_only_backend_is_refused_before_any_request(tiny_vl_dir: Path) -> None:
    from transformers import AutoTokenizer

    from tito_testing.scripted import ScriptedBackend

    tok = AutoTokenizer.from_pretrained(str(tiny_vl_dir))
    scripted = ScriptedBackend(tok, ["never"])
    scripted.input_kinds = frozenset({"image"})  # an engine that takes pictures but not clips
    run = Rollout(
        scripted,
        ChatRenderer(tok, chat_template=vl_chat_template(), template_kwargs=NO_THINK),
        get_tool_parser("qwen_xml"),
        vision=vision_processor(str(tiny_vl_dir), tok),
    )
    clip = Video([frame(64, 64, 0), frame(64, 64, 1)])
    conversation = Conversation(messages=[{"role": "user", "content": [video_part(clip)]}], tool_specs=TOOLS)
    with pytest.raises(MediaError, match=r"the scripted backend takes no videos \(it takes images\)"):
        asyncio.run(run.call(conversation, CallOptions()))
    assert scripted.requests == [] and len(run.trajectory) == 0

"""Input kinds as an axis: the video kind through a rollout, records and files; kinds and families as plugins.

No torch: the Pillow image processor, the offline Qwen3 tokenizer and a model directory holding only the tiny
model's processor configs (``preprocessor_config.json``, ``video_preprocessor_config.json``). That tito's video
grids are the video processor's own is checked where transformers' video processor runs (it needs torchvision:
``tests/transformers/test_video.py``).
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tito_core.conversation import Conversation
from tito_core.errors import ConfigError
from tito_core.media import (
    Image,
    MediaError,
    MediaItem,
    MediaSpan,
    Video,
    VideoError,
    image_part,
    media_part,
    video_part,
)
from tito_core.media.processor import VisionProcessor, refusal
from tito_core.model_setup import family_of, vision_processor
from tito_core.plugins import InputKindSpec, VisionFamilySpec, get_tool_parser, hookimpl, temporary_plugin
from tito_core.records import open_writer, read_records
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.rollout_core.prompt import chat_media
from tito_core.trajectory import Trajectory, TrajectoryRecord
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import load_qwen_tokenizer
from tito_testing.vision import TINY_VIDEO, TINY_VISION, tiny_image_processor, vl_chat_template

from .test_images_files import record

PAD, VIDEO_PAD, VSTART, VEND = 151655, 151656, 151652, 151653
CALL = "<tool_call>\n<function=record>\n</function>\n</tool_call>"
TOOLS = [{"name": "record", "description": "record the screen", "inputSchema": {"json": {"type": "object"}}}]


def png(width: int, height: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), ((seed * 37) % 256, (seed * 91) % 256, 128)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory with the tiny model's tokenizer and processor configs (no weights: none are needed)."""
    out = tmp_path_factory.mktemp("tiny-vl")
    config = json.loads(tiny_image_processor().to_json_string())
    (out / "preprocessor_config.json").write_text(json.dumps({**config, **TINY_VISION}))
    (out / "video_preprocessor_config.json").write_text(json.dumps(TINY_VIDEO))
    return out


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_qwen_tokenizer("qwen3")


def test_a_clip_is_its_frames_and_rate() -> None:
    frames = [png(64, 48, i) for i in range(3)]
    clip = Video(frames, fps=4)
    assert clip.kind == "video" and clip.format == "frames" and clip.size == (64, 48) and clip.fps == 4.0
    assert [f.data for f in clip.frames] == frames and clip.pictures() == clip.frames
    assert clip == Video([Image(f) for f in frames], fps=4.0) and hash(clip) == hash(Video(frames, fps=4))
    assert clip != Video(frames, fps=2) and clip != Video(frames[::-1], fps=4)
    assert media_part(clip) == video_part(clip) == {"type": "video", "video": clip}


@pytest.mark.parametrize(
    ("frames", "fps", "message"),
    [
        ([], 2.0, "non-empty sequence of frames"),
        (b"not a list", 2.0, "non-empty sequence of frames"),
        ([png(10, 10)], 0, "fps must be a positive number"),
        ([png(10, 10)], float("nan"), "fps must be a positive number"),
        ([png(10, 10), b"garbage"], 2.0, "frame 1 of the video: the image bytes do not decode"),
        ([png(10, 10), png(12, 10)], 2.0, r"frames must share one size; these have \[\(10, 10\), \(12, 10\)\]"),
    ],
)
def test_a_bad_clip_is_a_video_error_naming_the_problem(frames: Any, fps: float, message: str) -> None:
    with pytest.raises(VideoError, match=message):
        Video(frames, fps=fps)


def test_the_family_takes_videos_with_the_video_processor_config(tok: Any, model_dir: Path) -> None:
    vision = vision_processor(model_dir, tok)
    assert vision is not None and vision.kinds == {"image", "video"}
    assert vision.placeholder_ids == {"image": PAD, "video": VIDEO_PAD}
    # 5 frames: padded to 6, two per temporal patch; each 120x90 frame resized within 56*56..28*28*64 pixels
    grid, count = vision.measure(Video([png(120, 90, i) for i in range(5)]))
    assert grid == (3, 6, 8) and count == 3 * 6 * 8 // 4
    images_only = vision_processor(tiny_image_processor(), tok)
    assert images_only is not None and images_only.kinds == {"image"}


def test_vision_processors_are_shared_per_tokenizer_without_keeping_it_alive(model_dir: Path) -> None:
    import gc
    import weakref

    from transformers import AutoTokenizer

    from tito_core import model_setup as setup_module
    from tito_core.media.processor import directory_key
    from tito_testing.tokenizers import qwen_tokenizer_dir

    first = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir("qwen3")))
    shared = vision_processor(model_dir, first)
    assert shared is not None and vision_processor(model_dir, first) is shared
    # an entry whose tokenizer is another object (as after a dead tokenizer's id is reused) is not handed out
    second = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir("qwen3")))
    key = (id(shared.image_processor), id(second), shared.max_images, directory_key(model_dir))
    setup_module._shared[key] = (shared, weakref.ref(first))
    fresh = vision_processor(model_dir, second)
    assert fresh is not None and fresh is not shared and vision_processor(model_dir, second) is fresh
    # the cache holds tokenizers weakly: a dropped tokenizer is collected and its entry goes with it
    gone = weakref.ref(first)
    del first, shared
    gc.collect()
    assert gone() is None
    assert not any(ref() is None for _, ref in setup_module._shared.values())


def test_a_directory_without_a_video_processor_config_is_a_named_video_error(tmp_path: Path) -> None:
    from tito_core.media.processor import load_video_processor

    with pytest.raises(VideoError, match=r"holds no video processor \(no video_preprocessor_config.json\)"):
        load_video_processor(tmp_path)


def test_a_config_that_samples_frames_is_refused(tok: Any, tmp_path: Path) -> None:
    config = json.loads(tiny_image_processor().to_json_string())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**config, **TINY_VISION}))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({**TINY_VIDEO, "do_sample_frames": True}))
    vision = vision_processor(tmp_path, tok)
    assert vision is not None
    with pytest.raises(VideoError, match=r"samples frames .* an engine would drop frames tito records"):
        vision.measure(Video([png(64, 64, 0), png(64, 64, 1)]))


def rollout(tok: Any, model_dir: Path, replies: list[str], kinds: frozenset[str]) -> tuple[Rollout, ScriptedBackend]:
    backend = ScriptedBackend(tok, replies)
    backend.input_kinds = kinds
    renderer = ChatRenderer(tok, chat_template=vl_chat_template(), template_kwargs={"enable_thinking": False})
    run = Rollout(backend, renderer, get_tool_parser("qwen_xml"), vision=vision_processor(model_dir, tok))
    return run, backend


def test_a_video_tool_result_is_expanded_recorded_and_sent(tok: Any, model_dir: Path, tmp_path: Path) -> None:
    run, backend = rollout(tok, model_dir, [CALL, "a box moves right"], frozenset({"image", "video"}))
    shot = Image(png(100, 80, 9))
    clip = Video([png(120, 90, i) for i in range(4)], fps=4.0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": [image_part(shot), {"type": "text", "text": "?"}]}]

    async def go() -> None:
        reply = (await run.call(Conversation(messages=list(messages), tool_specs=TOOLS), CallOptions())).reply()
        call = reply["tool_calls"][0]
        messages.extend([reply, {"role": "tool", "tool_call_id": call["id"], "content": [video_part(clip)]}])
        await run.call(Conversation(messages=list(messages), tool_specs=TOOLS), CallOptions())

    asyncio.run(go())
    traj = run.trajectory
    image_span, video_span = traj.media
    assert (image_span.kind, video_span.kind) == ("image", "video")
    assert video_span.grid_thw == (2, 6, 8) and video_span.length == 24 and video_span.fps == 4.0
    assert video_span.frames == tuple(f.sha256 for f in clip.frames) and video_span.sha256 == clip.sha256
    ids = traj.token_ids
    assert ids[video_span.start - 1] == VSTART and ids[video_span.end] == VEND
    assert set(ids[video_span.start : video_span.end]) == {VIDEO_PAD}
    # the engine got every item of the prompt, in token order, the clip as a Video
    sent = backend.requests[-1].media
    assert [m.kind for m in sent] == ["image", "video"] and sent[1].item == clip
    assert [m.span for m in sent] == list(traj.media)
    # records: the frames stored once each as pictures, the clip read back whole
    traj.close()
    output = tmp_path / "out.jsonl"
    with open_writer(output) as writer:
        writer.write(record(traj, 0))
    stored = sorted(p.name for p in (tmp_path / "out.jsonl.images").iterdir())
    assert stored == sorted(f"{sha}.png" for sha in {shot.sha256, *video_span.frames})
    (back,) = read_records(output)
    restored = Trajectory.from_record(back.trajectory)
    assert restored.media == traj.media and restored.prompt_media()[1].item == clip


def test_a_clip_the_backend_or_model_cannot_take_is_refused_before_any_request(tok: Any, model_dir: Path) -> None:
    run, backend = rollout(tok, model_dir, ["never"], frozenset({"image"}))
    clip = Video([png(64, 64, 0), png(64, 64, 1)])
    conversation = Conversation(messages=[{"role": "user", "content": [video_part(clip)]}])
    with pytest.raises(VideoError, match=r"the scripted backend takes no videos \(it takes images\)"):
        asyncio.run(run.call(conversation, CallOptions()))
    assert backend.requests == [] and len(run.trajectory) == 0
    vision = vision_processor(tiny_image_processor(), tok)  # no video processor config
    assert refusal({"video"}, vision, "scripted", {"image", "video"}) == "this model takes no videos (it takes images)"
    assert refusal({"image"}, None, "x", {"image"}) is not None and refusal(set(), None, "x", set()) is None


def test_a_record_written_with_images_reads_into_media() -> None:
    span = {"start": 1, "length": 2, "sha256": "ab", "format": "png", "size": [4, 4], "grid_thw": None,
            "placeholder_id": 9}  # fmt: skip
    old = {"rollout_id": "r", "branch": 0, "token_ids": [1, 9, 9], "logprobs": [None] * 3, "segments": [],
           "turns": [], "status": "completed", "images": [span]}  # fmt: skip
    import msgspec

    back = msgspec.json.decode(json.dumps(old), type=TrajectoryRecord)
    assert back.images is None and len(back.media) == 1 and back.media[0].kind == "image"
    assert b'"images"' not in msgspec.json.encode(back) and b'"media"' in msgspec.json.encode(back)


class Audio(MediaItem):
    """A third-party kind with no pixels: a MIME type, no size (its bytes ride in one picture, for this test only)."""

    __slots__ = ("_image",)
    kind: ClassVar[str] = "audio"

    def __init__(self, image: Image) -> None:
        self._image = image

    sha256 = property(lambda self: "audio-" + self._image.sha256)
    mime_type = property(lambda self: "audio/wav")

    def pictures(self) -> tuple[Image, ...]:
        return (self._image,)

    def span_fields(self) -> dict[str, Any]:
        return {"format": "wav"}

    @classmethod
    def from_span(cls, span: Any, pictures: Any) -> Audio:
        raise NotImplementedError


class AudioPlugin:
    @hookimpl
    def tito_input_kinds(self) -> Any:
        yield InputKindSpec("audio", Audio, "test audio")

    @hookimpl
    def tito_vision_families(self) -> Any:
        yield VisionFamilySpec("fake", lambda processor, tokenizer, directory: ("fake", directory), ("FakeProc",))


class Listening:
    """A family that takes audio: one placeholder per clip, expanded to three tokens (no grid)."""

    placeholder_ids: ClassVar[dict[str, int]] = {"audio": 7}
    never_sample = (7,)

    def measure(self, item: MediaItem) -> tuple[tuple[int, ...] | None, int]:
        return None, 3


def test_an_audio_kind_fits_the_axis_without_a_size() -> None:
    """The contract assumes no picture: an item with a MIME type and no size is expanded and spanned like any."""
    clip = Audio(Image(png(8, 8)))
    vision = VisionProcessor(object(), Listening())
    ids, (media,) = vision.expand([1, 7, 2], [clip], start=10)
    assert ids == [1, 7, 7, 7, 2] and media.item is clip and clip.mime_type == "audio/wav"
    span = media.span
    assert (span.kind, span.start, span.length, span.format, span.grid_thw) == ("audio", 11, 3, "wav", None)
    assert span.size is None and b'"size"' not in msgspec.json.encode(span)  # no pixels: no size, none written
    assert msgspec.json.decode(msgspec.json.encode(span), type=MediaSpan) == span
    assert Image(png(8, 8)).mime_type == "image/png" and Video([png(8, 8)]).mime_type == "video/x-frames"


class FakeProcessor:
    pass


FakeProcessor.__name__ = "FakeProcessorPil"


def test_a_plugin_registers_a_kind_and_a_family() -> None:
    clip = Audio(Image(png(8, 8)))
    chat = [{"role": "user", "content": [media_part(clip), {"type": "audio", "audio": clip}]}]
    assert chat_media(chat) == []  # not registered: a part of an unknown type is not media
    with temporary_plugin(AudioPlugin(), name="audio-test"):
        assert chat_media(chat) == [clip, clip]
        with pytest.raises(MediaError, match=r"the audio part must hold a .*Audio, not str"):
            chat_media([{"role": "user", "content": [{"type": "audio", "audio": "x.wav"}]}])
        assert family_of(FakeProcessor(), None, "/m") == ("fake", "/m")  # by the processor's name prefix
    with pytest.raises(ConfigError, match=r"does not know the image placeholders of FakeProcessorPil .*qwen_vl"):
        family_of(FakeProcessor(), None)

"""A training sample's images and videos in the forms trainers take: PIL images, hashes, data URLs, pixel inputs.

The exporters (:mod:`tito_core.export`) put a trajectory's images and videos in each trainer's own field
(docs/multimodal.md, "Trainer fields"); this module makes those values from ``Trajectory.prompt_media()``, always
every image of the sample's ids, in token order (the order of their placeholder runs, which is the order a
processor pairs images with placeholders).

:func:`pixel_inputs` runs the model's image processor (given by the caller: a directory or a Hugging Face
image processor) and checks that it gives each image the grid the rollout recorded: a different processor
would give the trainer pixel rows that do not fit the recorded placeholder runs, so it is an ``ImageError``
(``tito_core.media``) rather than a silently wrong sample. Videos likewise (:func:`video_values`, and
:func:`pixel_inputs` runs the video processor: transformers' video processors need torchvision); a trainer whose
field takes no videos gets a ``VideoError`` for a sample with one (:func:`only_images`), never a sample whose video
pads nothing fills.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from ..media import ImageError, PromptMedia, Video, VideoError
from ..trajectory import Trajectory

__all__ = [
    "ImageForm",
    "data_url",
    "image_values",
    "media_data",
    "only_images",
    "pixel_inputs",
    "prompt_images",
    "video_values",
]

ImageForm = Literal["pil", "sha256"]
"""How an exporter gives each image: ``pil`` (an RGB ``PIL.Image.Image``, what trainers' processors take) or
``sha256`` (its content hash: plain data for rows written to a file, whose bytes are in ``<output>.images/``)."""

IMAGE_FORMS: tuple[ImageForm, ...] = ("pil", "sha256")


def image_values(traj: Trajectory, form: ImageForm = "pil") -> list[Any]:
    """Each image of ``traj``'s ids, in token order, as a PIL image or its sha256 (``form``).

    Raises:
        ValueError: an unknown ``form``.
    """
    if form not in IMAGE_FORMS:
        raise ValueError(f"images must be one of {list(IMAGE_FORMS)}, not {form!r}")
    images = prompt_images(traj)
    if form == "sha256":
        return [item.image.sha256 for item in images]
    return [item.image.to_pil() for item in images]


def prompt_images(traj: Trajectory) -> list[PromptMedia]:
    """The images of ``traj``'s ids with their spans, in token order (its videos: :func:`video_values`)."""
    return [item for item in traj.prompt_media() if item.kind == "image"]


def prompt_videos(traj: Trajectory) -> list[PromptMedia]:
    """The videos of ``traj``'s ids with their spans, in token order."""
    return [item for item in traj.prompt_media() if item.kind == "video"]


def video_values(traj: Trajectory, form: ImageForm = "pil") -> list[Any]:
    """Each video of ``traj``'s ids, in token order, as ``(frames, metadata)`` or plain data (``form``).

    ``pil``: ``(list of RGB PIL frames, {"fps", "total_num_frames"})``, verl's ``(video, metadata)`` pair (the
    metadata carries the clip's rate: Qwen2.5-VL's temporal positions depend on it). ``sha256``:
    ``{"sha256", "frames": [frame hashes], "fps"}`` for rows written to a file.
    """
    if form not in IMAGE_FORMS:
        raise ValueError(f"videos must be one of {list(IMAGE_FORMS)}, not {form!r}")
    out: list[Any] = []
    for item in prompt_videos(traj):
        clip = item.item
        assert isinstance(clip, Video)
        if form == "sha256":
            out.append({"sha256": clip.sha256, "frames": [f.sha256 for f in clip.frames], "fps": clip.fps})
        else:
            out.append((clip.to_pil_frames(), _metadata(clip)))
    return out


def _metadata(clip: Video) -> dict[str, Any]:
    return {"fps": clip.fps, "total_num_frames": len(clip.frames)}


def media_data(traj: Trajectory, form: ImageForm = "pil") -> dict[str, list[Any]]:
    """``{"images": [...], "videos": [...]}`` of ``traj``'s ids, each key only when present.

    verl's and slime's raw multimodal form.
    """
    out: dict[str, list[Any]] = {}
    images = image_values(traj, form)
    if images:
        out["images"] = images
    videos = video_values(traj, form)
    if videos:
        out["videos"] = videos
    return out


def only_images(traj: Trajectory, trainer: str) -> None:
    """Refuse a sample with videos for a trainer whose field takes images only.

    Raises:
        VideoError: the sample's ids hold a video.
    """
    videos = [s for s in traj.media if s.kind == "video"]
    if videos:
        raise VideoError(
            f"{trainer}'s multimodal field takes images only; rollout {traj.rollout_id} holds {len(videos)} video(s) "
            f"(the first at token {videos[0].start}): export it for verl or slime, which take videos"
        )


def data_url(item: PromptMedia) -> str:
    """The image as a ``data:image/<format>;base64,...`` URL (OpenAI's ``image_url`` content part)."""
    return item.image.data_url


def _image_processor(processor: Any) -> Any:
    """A Hugging Face image processor from a directory, an image processor, or a processor holding one."""
    if isinstance(processor, (str, os.PathLike)):
        from ..media.processor import load_image_processor

        return load_image_processor(processor)
    inner = getattr(processor, "image_processor", None)
    return inner if inner is not None else processor


def pixel_inputs(traj: Trajectory, processor: Any, *, return_tensors: str | None = "pt") -> dict[str, Any]:
    """The pixel inputs of ``traj``'s images and videos, by the model's processors.

    Args:
        traj: The sample's trajectory; every image and video of its ids is processed, in token order.
        processor: A model directory (its ``preprocessor_config.json``), a Hugging Face image processor, or
            a processor with an ``image_processor`` (``Qwen2_5_VLProcessor``; its ``video_processor`` for videos).
        return_tensors: The processor's tensor type (``"pt"``: torch tensors, what verl and slime train on;
            ``"np"``; None: its default).

    Returns:
        ``{"pixel_values", "image_grid_thw"}`` for images (one grid row per image, its patches' rows
        concatenated in ``pixel_values``) and ``{"pixel_values_videos", "video_grid_thw"}`` for videos, or ``{}``
        for a trajectory without either.

    Raises:
        ImageError: the processor gives an image another grid than the rollout recorded (a different
            processor or settings than the rollout's: its rows would not fit the recorded placeholders).
        VideoError: the same for a video, or no video processor loads (transformers' need torchvision).
    """
    out: dict[str, Any] = {}
    images = prompt_images(traj)
    if images:
        proc = _image_processor(processor)
        pixels = proc(images=[item.image.to_pil() for item in images], return_tensors=return_tensors)
        grid = pixels["image_grid_thw"]
        _check_grids(images, _rows(grid))
        out |= {"pixel_values": pixels["pixel_values"], "image_grid_thw": grid}
    videos = prompt_videos(traj)
    if videos:
        clips = [item.item for item in videos]
        assert all(isinstance(clip, Video) for clip in clips)
        pixels = _video_processor(processor)(
            videos=[clip.to_pil_frames() for clip in clips],  # type: ignore[attr-defined]
            video_metadata=[_metadata(clip) for clip in clips],  # type: ignore[arg-type]
            do_sample_frames=False,
            return_tensors=return_tensors,
        )
        grid = pixels["video_grid_thw"]
        _check_grids(videos, _rows(grid))
        out |= {"pixel_values_videos": pixels["pixel_values_videos"], "video_grid_thw": grid}
    return out


def _rows(grid: Any) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in row) for row in (grid.tolist() if hasattr(grid, "tolist") else grid)]


def _video_processor(processor: Any) -> Any:
    """The video processor of a model directory or of a processor holding one (``Qwen2_5_VLProcessor``)."""
    inner = getattr(processor, "video_processor", None)
    if inner is not None:
        return inner
    if not isinstance(processor, (str, os.PathLike)):
        raise VideoError(
            f"{type(processor).__name__} has no video processor: pass the model directory or its processor"
        )
    from ..media.processor import load_video_processor

    return load_video_processor(processor)


def _check_grids(items: Sequence[PromptMedia], rows: Sequence[tuple[int, ...]]) -> None:
    """Each processed item's grid must be the grid its span recorded."""
    recorded = [item.span.grid_thw for item in items]
    if recorded != list(rows):
        first = next(
            (i for i, (a, b) in enumerate(zip(recorded, rows, strict=False)) if a != b), min(len(rows), len(recorded))
        )
        got = rows[first] if first < len(rows) else None
        want = recorded[first] if first < len(recorded) else None
        kind = items[0].kind if items else "image"
        error = VideoError if kind == "video" else ImageError
        raise error(
            f"the {kind} processor gives {kind} {first} (of {len(items)}) the grid {got}, but the rollout recorded"
            f" {want}: pass the processor (and its settings) the rollout was rendered with"
        )

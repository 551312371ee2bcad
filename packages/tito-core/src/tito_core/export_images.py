"""A training sample's images in the forms trainers take: PIL images, content hashes, data URLs, pixel inputs.

The exporters (:mod:`tito_core.export`, :mod:`tito_core.trainers.agentlightning`) put a trajectory's images in
each trainer's own field (docs/multimodal.md, "Trainer fields"); this module makes those values from
``Trajectory.prompt_media()``, always every image of the sample's ids, in token order
(the order of their placeholder runs, which is the order a processor pairs images with placeholders).

:func:`pixel_inputs` runs the model's image processor (given by the caller: a directory or a Hugging Face
image processor) and checks that it gives each image the grid the rollout recorded: a different processor
would give the trainer pixel rows that do not fit the recorded placeholder runs, so it is an ``ImageError``
(``tito_core.media``) rather than a silently wrong sample.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from .media import ImageError, PromptMedia
from .trajectory import Trajectory

__all__ = ["ImageForm", "data_url", "image_values", "pixel_inputs"]

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


def data_url(item: PromptMedia) -> str:
    """The image as a ``data:image/<format>;base64,...`` URL (OpenAI's ``image_url`` content part)."""
    return item.image.data_url


def _image_processor(processor: Any) -> Any:
    """A Hugging Face image processor from a directory, an image processor, or a processor holding one."""
    if isinstance(processor, (str, os.PathLike)):
        from .media.processor import load_image_processor

        return load_image_processor(processor)
    inner = getattr(processor, "image_processor", None)
    return inner if inner is not None else processor


def pixel_inputs(traj: Trajectory, processor: Any, *, return_tensors: str | None = "pt") -> dict[str, Any]:
    """``pixel_values`` and ``image_grid_thw`` of ``traj``'s images, by the model's image processor.

    Args:
        traj: The sample's trajectory; every image of its ids is processed, in token order.
        processor: A model directory (its ``preprocessor_config.json``), a Hugging Face image processor, or
            a processor with an ``image_processor`` (``Qwen2_5_VLProcessor``).
        return_tensors: The processor's tensor type (``"pt"``: torch tensors, what verl and slime train on;
            ``"np"``; None: its default).

    Returns:
        ``{"pixel_values", "image_grid_thw"}`` (one ``image_grid_thw`` row per image, its patches' rows
        concatenated in ``pixel_values``), or ``{}`` for a trajectory without images.

    Raises:
        ImageError: the processor gives an image another grid than the rollout recorded (a different
            processor or settings than the rollout's: its rows would not fit the recorded placeholders).
    """
    images = prompt_images(traj)
    if not images:
        return {}
    proc = _image_processor(processor)
    out = proc(images=[item.image.to_pil() for item in images], return_tensors=return_tensors)
    grid = out["image_grid_thw"]
    rows = [tuple(int(x) for x in row) for row in (grid.tolist() if hasattr(grid, "tolist") else grid)]
    _check_grids(images, rows)
    return {"pixel_values": out["pixel_values"], "image_grid_thw": grid}


def _check_grids(images: Sequence[PromptMedia], rows: Sequence[tuple[int, ...]]) -> None:
    """Each processed image's grid must be the grid its span recorded."""
    recorded = [item.span.grid_thw for item in images]
    if recorded != list(rows):
        first = next(
            (i for i, (a, b) in enumerate(zip(recorded, rows, strict=False)) if a != b), min(len(rows), len(recorded))
        )
        got = rows[first] if first < len(rows) else None
        want = recorded[first] if first < len(recorded) else None
        raise ImageError(
            f"the image processor gives image {first} (of {len(images)}) the grid {got}, but the rollout recorded"
            f" {want}: pass the processor (and its settings) the rollout was rendered with"
        )

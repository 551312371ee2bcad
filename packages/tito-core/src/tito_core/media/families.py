"""What a model family knows about its inputs: each kind's placeholder token, and the tokens an item becomes.

A chat template renders each image or video part as one placeholder token (Qwen-VL: ``<|image_pad|>`` /
``<|video_pad|>`` between ``<|vision_start|>`` and ``<|vision_end|>``); the model's forward pass consumes many:
the vision encoder's output for that item. A :class:`VisionFamily` says which placeholder each kind has and how
many tokens an item expands to. Families are registered through the ``tito_vision_families`` plugin hook
(:class:`~tito_core.plugins.VisionFamilySpec`), matched by the name of the model's Hugging Face image processor;
:class:`QwenVLFamily` is the built-in one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError
from .base import MediaError, MediaItem
from .image import Image
from .video import Video, VideoError

__all__ = ["QWEN_VL_PROCESSORS", "QwenVLFamily", "VideoGeometry", "VisionFamily"]


class VisionFamily(Protocol):
    """What one model family knows about its inputs (built by a ``VisionFamilySpec``'s factory)."""

    placeholder_ids: Mapping[str, int]
    """Per input kind it takes, the token id the chat template writes once per item (repeated over its span)."""
    never_sample: tuple[int, ...]
    """The family's vision token ids (placeholders, vision start / end): an engine must never sample them."""

    def measure(self, item: MediaItem) -> tuple[tuple[int, ...] | None, int]:
        """``(grid, count)``: the item's vision grid (None for families without one) and its token count.

        Raises:
            MediaError: the family cannot take this item (its kind, or a size its processor refuses).
        """
        ...


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token``, None when the tokenizer lacks it.

    Not ``get_vocab()``: that builds a dict of the whole vocabulary (~0.1 s for Qwen's 151k tokens) every call.
    """
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int) or tokenizer.convert_ids_to_tokens(found) != token:  # an unknown token's stand-in
        return None
    return found


def _grid_sizer(image_processor: Any) -> Any:
    """The ``smart_resize`` of a Qwen-VL processor's own module when the processor resizes every image with it.

    Such a processor's grid depends on the image's size only (``smart_resize`` to multiples of
    ``patch_size * merge_size`` within ``size``'s pixel bounds, one temporal slice), so tito computes it from
    the size instead of running the processor (decoding, resizing and normalizing the pixels: ~50 ms for a
    448x448 image on a busy core). None when it does not (``do_resize`` off, another ``size`` form): then the
    processor runs.
    """
    size = getattr(image_processor, "size", None)
    module = sys.modules.get(type(image_processor).__module__)
    sizer = getattr(module, "smart_resize", None)
    try:
        bounds = (size["shortest_edge"], size["longest_edge"]) if size is not None else None
    except (KeyError, TypeError):
        bounds = None
    if not callable(sizer) or getattr(image_processor, "do_resize", None) is not True or bounds is None:
        return None
    if not all(isinstance(b, int) and b > 0 for b in bounds):
        return None
    if not isinstance(getattr(image_processor, "patch_size", None), int):
        return None
    return sizer


class VideoGeometry:
    """How a Qwen-VL video processor sizes a clip, read from the model directory's video processor config.

    ``video_preprocessor_config.json`` (else ``preprocessor_config.json``, as transformers falls back), over the
    defaults of transformers' ``Qwen2VLVideoProcessor``. Every frame is resized as one image of the clip's size
    within the video pixel bounds; the frames are padded (last frame repeated) to a multiple of
    ``temporal_patch_size``. tito sends every frame, so a config that samples frames (``do_sample_frames``) is
    refused when a clip is measured: the engine would drop frames tito recorded.
    """

    FILES = ("video_preprocessor_config.json", "preprocessor_config.json")
    DEFAULTS: Mapping[str, Any] = {
        "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "do_sample_frames": False,
        "cap_pixels_per_frame": None,
        "max_video_tokens": 128000,
    }

    def __init__(self, config: Mapping[str, Any]) -> None:
        merged = {**self.DEFAULTS, **{k: v for k, v in config.items() if v is not None or k not in self.DEFAULTS}}
        size = dict(merged["size"] or {})
        if merged.get("min_pixels") is not None:
            size["shortest_edge"] = merged["min_pixels"]
        if merged.get("max_pixels") is not None:
            size["longest_edge"] = merged["max_pixels"]
        try:
            self.min_pixels, self.max_pixels = int(size["shortest_edge"]), int(size["longest_edge"])
            self.patch, self.temporal = int(merged["patch_size"]), int(merged["temporal_patch_size"])
            self.merge, self.max_tokens = int(merged["merge_size"]), int(merged["max_video_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"the video processor config has no usable size or patch sizes: {exc}") from exc
        self.samples_frames = bool(merged["do_sample_frames"])
        self.caps_pixels = bool(merged["cap_pixels_per_frame"])

    @classmethod
    def of_directory(cls, directory: str | os.PathLike[str]) -> VideoGeometry | None:
        """The geometry of a model directory's video processor config; None without any processor config."""
        for name in cls.FILES:
            path = Path(directory) / name
            if path.is_file():
                try:
                    config = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as exc:
                    raise ConfigError(f"cannot read {path}: {exc}") from exc
                return cls(config)
        return None

    def grid(self, video: Video, sizer: Any) -> tuple[int, int, int]:
        """The clip's ``video_grid_thw`` row: padded frames / temporal patch, resized height / patch, width / patch.

        Raises:
            VideoError: the config samples frames, or the resize refuses the clip's size.
        """
        if self.samples_frames:
            raise VideoError(
                "the model's video processor samples frames (do_sample_frames): an engine would drop frames tito "
                "records; set do_sample_frames to false in its video processor config"
            )
        frames = len(video.frames)
        factor = self.patch * self.merge
        max_pixels = self.max_pixels
        if self.caps_pixels:  # transformers' per-frame share of the whole clip's pixel budget
            total = int(self.max_tokens * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total * self.temporal // frames), int(self.min_pixels * 1.05))
        width, height = video.size
        try:
            resized_h, resized_w = sizer(
                height, width, factor=factor, min_pixels=self.min_pixels, max_pixels=max_pixels
            )
        except ValueError as exc:
            raise VideoError(f"the video processor cannot resize {video!r}: {exc}") from exc
        return math.ceil(frames / self.temporal), int(resized_h) // self.patch, int(resized_w) // self.patch


class QwenVLFamily:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5: an item becomes ``grid_thw.prod() // merge_size**2`` pads.

    Images by the model's image processor; videos (a clip of frames) by its video processor's config
    (:class:`VideoGeometry`) when the model directory has one and the tokenizer has ``<|video_pad|>``.

    Args:
        image_processor: A Qwen-VL image processor (``Qwen2VLImageProcessor`` or its Pillow variant): it gives
            each image's ``image_grid_thw`` and has ``merge_size``.
        tokenizer: The model's tokenizer, which holds ``<|image_pad|>`` and the vision tokens.
        directory: The model directory (its video processor config); None: images only.

    Raises:
        ConfigError: the tokenizer has no image placeholder token, or the processor no ``merge_size``.
    """

    PLACEHOLDERS: Mapping[str, str] = {"image": "<|image_pad|>", "video": "<|video_pad|>"}
    VISION_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>")

    def __init__(self, image_processor: Any, tokenizer: Any, directory: str | os.PathLike[str] | None = None) -> None:
        merge = getattr(image_processor, "merge_size", None)
        if not isinstance(merge, int) or merge < 1:
            raise ConfigError(f"{type(image_processor).__name__} has no merge_size; it is not a Qwen-VL processor")
        token = getattr(image_processor, "image_token", None) or self.PLACEHOLDERS["image"]
        placeholder = _token_id(tokenizer, token)
        if placeholder is None:
            raise ConfigError(f"the tokenizer has no {token!r} token: it is not a Qwen-VL tokenizer")
        placeholders = {"image": placeholder}
        self.video = VideoGeometry.of_directory(directory) if directory is not None else None
        video_pad = _token_id(tokenizer, self.PLACEHOLDERS["video"])
        if self.video is not None and video_pad is not None:
            placeholders["video"] = video_pad
        else:
            self.video = None
        self.placeholder_ids: Mapping[str, int] = placeholders
        found = (_token_id(tokenizer, t) for t in self.VISION_TOKENS)
        self.never_sample = tuple(sorted({i for i in found if i is not None}))
        self.merge_size = merge
        self._processor = image_processor
        self._sizer = _grid_sizer(image_processor)

    def measure(self, item: MediaItem) -> tuple[tuple[int, ...] | None, int]:
        """The item's grid row (``image_grid_thw`` / ``video_grid_thw``) as the processor computes it, and pads.

        An image's from its size with the processor's own ``smart_resize`` when the processor resizes every image
        with it (:func:`_grid_sizer`), else by running the processor on the decoded image; a clip's from its frame
        count and size (:class:`VideoGeometry`).

        Raises:
            MediaError: a kind this model does not take.
        """
        if isinstance(item, Video) and self.video is not None:
            sizer = self._sizer or getattr(sys.modules.get(type(self._processor).__module__), "smart_resize", None)
            if sizer is None:
                raise VideoError(f"{type(self._processor).__name__}'s module has no smart_resize to size a video")
            grid: tuple[int, ...] = self.video.grid(item, sizer)
            return grid, math.prod(grid) // self.video.merge**2
        if not isinstance(item, Image):  # the kinds it sizes are visual: images here, clips above
            raise MediaError(f"this Qwen-VL model takes no {item.kind} (its kinds: {', '.join(self.placeholder_ids)})")
        if self._sizer is not None:
            processor = self._processor
            patch = processor.patch_size
            width, height = item.size
            resized_h, resized_w = self._sizer(
                height,
                width,
                factor=patch * self.merge_size,
                min_pixels=processor.size["shortest_edge"],
                max_pixels=processor.size["longest_edge"],
            )
            grid = (1, int(resized_h) // patch, int(resized_w) // patch)
        else:
            out = self._processor(images=[item.to_pil()], return_tensors=None)
            grid = tuple(int(x) for x in out["image_grid_thw"][0])
        return grid, math.prod(grid) // self.merge_size**2


QWEN_VL_PROCESSORS = ("Qwen2VL", "Qwen2_5_VL", "Qwen3VL")
"""Name prefixes of the Qwen-VL family's Hugging Face image processors (Qwen2-VL's serves Qwen2.5-VL and Qwen3.5)."""

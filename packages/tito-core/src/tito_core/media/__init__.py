"""Non-text inputs, with input kinds as an axis: images, videos, their spans and the families that expand them.

Modules, each with one job: :mod:`~tito_core.media.base` (:class:`MediaItem`, what every kind is, a visual
kind's :class:`VisualItem`, and :class:`MediaError`), :mod:`~tito_core.media.image` (the image kind, loaded as
engines load it), :mod:`~tito_core.media.video` (the video kind: a clip of frames), :mod:`~tito_core.media.spans`
(where an item sits in the ids: :class:`MediaSpan`; a request's :class:`PromptMedia`),
:mod:`~tito_core.media.families` (what a model family knows: placeholders and token counts; Qwen-VL) and
:mod:`~tito_core.media.processor` (the :class:`~tito_core.media.processor.VisionProcessor` a model renders with,
the one check of whether a call can take its inputs).

Kinds and families are registered through plugin hooks (``tito_input_kinds``, ``tito_vision_families``), as
backends and tool parsers are; docs/architecture.md walks a new kind through, with video as the example.
"""

from __future__ import annotations

from .base import MediaError, MediaItem, VisualItem, media_part
from .image import FORMATS, Image, ImageError, ImageFormat, image_part, is_image_part
from .spans import MediaSpan, PromptMedia, picture_hashes
from .video import DEFAULT_FPS, Video, VideoError, video_part

__all__ = [
    "DEFAULT_FPS",
    "FORMATS",
    "Image",
    "ImageError",
    "ImageFormat",
    "MediaError",
    "MediaItem",
    "MediaSpan",
    "PromptMedia",
    "Video",
    "VideoError",
    "VisualItem",
    "image_part",
    "is_image_part",
    "media_part",
    "picture_hashes",
    "video_part",
]

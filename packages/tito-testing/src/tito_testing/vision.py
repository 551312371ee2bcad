"""The tiny Qwen-VL image processor of tito's tests, and the Hugging Face processor that renders its reference.

:func:`tiny_image_processor` is the image processor of the tiny VL model (small grids: 56x56 to 448x448 pixels,
14-pixel patches merged 2x2, so an image is 4 to 256 placeholder tokens). :func:`hf_processor` builds the full
``Qwen2_5_VLProcessor`` around it, whose ``apply_chat_template(..., tokenize=True)`` is the reference a test
compares tito's render with. Neither needs torch.

transformers 5.24 cannot build ``Qwen2_5_VLProcessor`` without torchvision (it insists on a video processor,
and its video processor mapping breaks without torchvision); :func:`hf_processor` lets it take
``video_processor=None`` for the time of the construction only. That is a test shim, not something tito does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["TINY_VIDEO", "TINY_VISION", "hf_processor", "tiny_image_processor", "vl_chat_template"]

TINY_VISION: dict[str, int] = {
    "min_pixels": 56 * 56,
    "max_pixels": 448 * 448,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
}
"""The tiny model's image processor settings (the tiny VL model's vision config matches them)."""

TINY_VIDEO: dict[str, Any] = {
    "video_processor_type": "Qwen2VLVideoProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64},
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "do_sample_frames": False,
    "cap_pixels_per_frame": False,
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
}
"""The tiny model's video processor config (``video_preprocessor_config.json``): frames of 56x56 up to 64 merged
patches (224x224 pixels), every frame kept (no sampling), two frames per temporal patch. Written as JSON, so the
model builds without torchvision (transformers' video processors need it to run, not to be described)."""

_patch_lock = threading.Lock()


def vl_chat_template() -> str:
    """The published Qwen3.5 chat template: images in user and tool messages, tools in qwen_xml syntax, ``<think>``."""
    return (Path(__file__).parent / "templates" / "qwen3_5.jinja").read_text()


def tiny_image_processor() -> Any:
    """A fresh ``Qwen2VLImageProcessorPil`` with :data:`TINY_VISION` (Pillow only; no torch, no torchvision)."""
    from transformers import Qwen2VLImageProcessorPil

    build: Any = Qwen2VLImageProcessorPil
    return build(**TINY_VISION)


@contextlib.contextmanager
def _video_processor_optional() -> Iterator[None]:
    import transformers.processing_utils as pu

    original: Any = pu.ProcessorMixin.check_argument_for_proper_class

    def check(self: Any, name: str, argument: Any) -> Any:
        return None if argument is None else original(self, name, argument)

    with _patch_lock:
        pu.ProcessorMixin.check_argument_for_proper_class = check  # type: ignore[method-assign]
        try:
            yield
        finally:
            pu.ProcessorMixin.check_argument_for_proper_class = original  # type: ignore[method-assign]


def hf_processor(tokenizer: Any, chat_template: str, image_processor: Any | None = None) -> Any:
    """A ``Qwen2_5_VLProcessor`` over ``tokenizer`` and ``image_processor`` (:func:`tiny_image_processor` by default).

    Its ``apply_chat_template(chat, tokenize=True, return_dict=True)`` gives the expanded ids and
    ``image_grid_thw`` of a conversation whose image parts hold PIL images: the reference render.
    """
    from transformers import Qwen2_5_VLProcessor

    build: Any = Qwen2_5_VLProcessor
    with _video_processor_optional():
        return build(
            image_processor=image_processor if image_processor is not None else tiny_image_processor(),
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=chat_template,
        )

"""The vision side of rendering: how many placeholder tokens each image becomes, and where they sit.

A chat template renders each image part of a message as one placeholder token (Qwen-VL: ``<|image_pad|>``
between ``<|vision_start|>`` and ``<|vision_end|>``). The model's forward pass consumes many: the vision
encoder's output for that image. :class:`VisionProcessor` wraps the model's Hugging Face image processor and
expands each placeholder of rendered ids to its count, producing one :class:`~tito_core.media.PromptImage` (span
+ bytes) per image, so the trajectory holds exactly the ids the engine consumes.

What is family-specific (the placeholder, the grid, the count) lives behind :class:`VisionFamily`; only the
Qwen-VL family (:class:`QwenVLFamily`: ``grid_thw.prod() // merge_size**2`` tokens) is implemented. Another
family (Gemma / LLaVA style: a fixed count per image) plugs in as another :class:`VisionFamily`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError
from ..media import Image, ImageError, ImageSpan, PromptImage, is_image_part

__all__ = [
    "DEFAULT_MAX_IMAGES",
    "QwenVLFamily",
    "VisionFamily",
    "VisionProcessor",
    "chat_images",
    "family_of",
    "has_preprocessor",
    "load_image_processor",
    "vision_processor",
]

DEFAULT_MAX_IMAGES = 64
"""How many images one prompt (a request's ``input_ids``) may hold unless ``max_images`` says otherwise."""

_MEASURED = 4096  # grids remembered per processor (by image hash), so re-rendered images are not re-processed


class VisionFamily(Protocol):
    """What one model family knows about images: its placeholder token, the tokens an image becomes."""

    placeholder_id: int
    """The token id the chat template writes once per image, repeated over the image's span."""
    never_sample: tuple[int, ...]
    """The family's vision token ids (placeholders, vision start / end): an engine must never sample them."""

    def measure(self, image: Image) -> tuple[tuple[int, ...] | None, int]:
        """``(grid, count)``: the image's vision grid (None for families without one) and its token count."""
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


class QwenVLFamily:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5: an image becomes ``grid_thw.prod() // merge_size**2`` pads.

    Args:
        image_processor: A Qwen-VL image processor (``Qwen2VLImageProcessor`` or its Pillow variant): it gives
            each image's ``image_grid_thw`` and has ``merge_size``.
        tokenizer: The model's tokenizer, which holds ``<|image_pad|>`` and the vision tokens.

    Raises:
        ConfigError: the tokenizer has no image placeholder token, or the processor no ``merge_size``.
    """

    PLACEHOLDER = "<|image_pad|>"
    VISION_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>")

    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        merge = getattr(image_processor, "merge_size", None)
        if not isinstance(merge, int) or merge < 1:
            raise ConfigError(f"{type(image_processor).__name__} has no merge_size; it is not a Qwen-VL processor")
        token = getattr(image_processor, "image_token", None) or self.PLACEHOLDER
        placeholder = _token_id(tokenizer, token)
        if placeholder is None:
            raise ConfigError(f"the tokenizer has no {token!r} token: it is not a Qwen-VL tokenizer")
        self.placeholder_id = placeholder
        found = (_token_id(tokenizer, t) for t in self.VISION_TOKENS)
        self.never_sample = tuple(sorted({i for i in found if i is not None}))
        self.merge_size = merge
        self._processor = image_processor
        self._sizer = _grid_sizer(image_processor)

    def measure(self, image: Image) -> tuple[tuple[int, ...] | None, int]:
        """The image's ``image_grid_thw`` row, as the processor computes it, and its pad count.

        From the image's size with the processor's own ``smart_resize`` when the processor resizes every image
        with it (:func:`_grid_sizer`); else by running the processor on the decoded image.
        """
        if self._sizer is not None:
            processor = self._processor
            patch = processor.patch_size
            width, height = image.size
            resized_h, resized_w = self._sizer(
                height,
                width,
                factor=patch * self.merge_size,
                min_pixels=processor.size["shortest_edge"],
                max_pixels=processor.size["longest_edge"],
            )
            grid: tuple[int, ...] = (1, int(resized_h) // patch, int(resized_w) // patch)
        else:
            out = self._processor(images=[image.to_pil()], return_tensors=None)
            grid = tuple(int(x) for x in out["image_grid_thw"][0])
        return grid, math.prod(grid) // self.merge_size**2


QWEN_VL_PROCESSORS = ("Qwen2VL", "Qwen2_5_VL", "Qwen3VL")
"""Name prefixes of the Qwen-VL family's Hugging Face image processors (Qwen2-VL's serves Qwen2.5-VL and Qwen3.5)."""


def family_of(image_processor: Any, tokenizer: Any) -> VisionFamily:
    """The :class:`VisionFamily` of a Hugging Face image processor (Qwen-VL only, for now).

    Raises:
        ConfigError: no family is known for this processor.
    """
    name = type(image_processor).__name__
    if name.startswith(QWEN_VL_PROCESSORS):  # by name: another family's processor may have a `merge_size` too
        return QwenVLFamily(image_processor, tokenizer)
    raise ConfigError(
        f"tito does not know the image placeholders of {name} (supported: the Qwen-VL family, whose image "
        f"processors' names start with {' / '.join(QWEN_VL_PROCESSORS)}); pass `family=` a VisionFamily of your own"
    )


class VisionProcessor:
    """Expands each image placeholder of rendered ids into the tokens the model consumes for that image.

    Args:
        image_processor: The model's Hugging Face image processor (``AutoImageProcessor`` of its directory).
        tokenizer: The model's tokenizer.
        max_images: The most images one prompt may hold (an :class:`ImageError` beyond).
        family: The family knowledge; None picks it from ``image_processor`` (:func:`family_of`).
    """

    def __init__(
        self,
        image_processor: Any,
        tokenizer: Any,
        *,
        max_images: int = DEFAULT_MAX_IMAGES,
        family: VisionFamily | None = None,
    ) -> None:
        if max_images < 1:
            raise ConfigError(f"max_images must be at least 1, not {max_images}")
        self.image_processor = image_processor
        self.family = family if family is not None else family_of(image_processor, tokenizer)
        self.max_images = max_images
        self._measured: dict[str, tuple[tuple[int, ...] | None, int]] = {}
        self._lock = threading.Lock()

    @property
    def placeholder_id(self) -> int:
        """The token id a template writes once per image."""
        return self.family.placeholder_id

    @property
    def never_sample(self) -> tuple[int, ...]:
        """The vision token ids an engine must never sample (requests carry them as ``never_sample``)."""
        return self.family.never_sample

    def measure(self, image: Image) -> tuple[tuple[int, ...] | None, int]:
        """``(grid_thw, token count)`` of ``image``, computed once per distinct image (by hash)."""
        known = self._measured.get(image.sha256)
        if known is not None:
            return known
        try:
            measured = self.family.measure(image)
        except ImageError:
            raise
        except Exception as exc:  # the processor's own errors (a size it refuses, ...)
            raise ImageError(f"the image processor cannot process {image!r}: {exc}") from exc
        with self._lock:
            if len(self._measured) >= _MEASURED:
                self._measured.clear()
            self._measured[image.sha256] = measured
        return measured

    def expand(self, ids: Sequence[int], images: Sequence[Image], start: int) -> tuple[list[int], list[PromptImage]]:
        """Replace the i-th placeholder of ``ids`` by ``images[i]``'s tokens; ``start`` is ``ids[0]``'s position.

        Returns the expanded ids and one :class:`PromptImage` per image, its span in trajectory positions.

        Raises:
            ImageError: the ids hold a different number of placeholders than there are images (a chat template
                that does not render images, or text spelling the placeholder token).
        """
        placeholder = self.placeholder_id
        at = [i for i, token in enumerate(ids) if token == placeholder]
        if len(at) != len(images):
            raise ImageError(
                f"the rendered prompt holds {len(at)} image placeholder(s) for {len(images)} image(s): the chat "
                "template does not render these images (a text-only template?), or a text spells the placeholder"
            )
        out: list[int] = []
        spans: list[PromptImage] = []
        prev = 0
        for pos, image in zip(at, images, strict=True):
            out.extend(ids[prev:pos])
            grid, count = self.measure(image)
            span = ImageSpan(
                start=start + len(out),
                length=count,
                sha256=image.sha256,
                format=image.format,
                size=image.size,
                grid_thw=grid,
                placeholder_id=placeholder,
            )
            out.extend([placeholder] * count)
            spans.append(PromptImage(span=span, image=image))
            prev = pos + 1
        out.extend(ids[prev:])
        return out, spans


def chat_images(chat: Iterable[Mapping[str, Any]]) -> list[Image]:
    """The images of chat messages' image parts, in the order a template renders them (message, then part)."""
    found: list[Image] = []
    for message in chat:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if is_image_part(part):
                    image = part.get("image")
                    if not isinstance(image, Image):
                        raise ImageError(f"an image part must hold a tito_core.media.Image, not {type(image).__name__}")
                    found.append(image)
    return found


def has_preprocessor(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds an image processor config (``preprocessor_config.json``)."""
    return (Path(directory) / "preprocessor_config.json").is_file()


_processors: dict[str, Any] = {}
_processors_lock = threading.Lock()


def load_image_processor(directory: str | os.PathLike[str]) -> Any:
    """The image processor of a local model directory (``AutoImageProcessor``), loaded once per process per path.

    Raises:
        ConfigError: the directory holds no loadable image processor.
    """
    path = Path(directory).expanduser()
    key = str(path.resolve()) if path.exists() else str(path)
    with _processors_lock:
        cached = _processors.get(key)
        if cached is not None:
            return cached
        if not has_preprocessor(path):
            raise ConfigError(f"{directory} holds no image processor (no preprocessor_config.json)")
        try:
            from transformers import AutoImageProcessor

            auto: Any = AutoImageProcessor
            processor = auto.from_pretrained(key, local_files_only=True)
        except (OSError, ValueError, ImportError) as exc:
            raise ConfigError(f"cannot load the image processor of {directory}: {exc}") from exc
        _processors[key] = processor
        return processor


ProcessorSpec = Any
"""What ``TitoModel(processor=...)`` takes: None (the tokenizer's directory, when it holds a
``preprocessor_config.json``), False (no vision), a directory, a Hugging Face image processor, or a
:class:`VisionProcessor`."""

_shared: dict[tuple[int, int, int], VisionProcessor] = {}


def vision_processor(
    processor: ProcessorSpec, tokenizer: Any, *, max_images: int = DEFAULT_MAX_IMAGES
) -> VisionProcessor | None:
    """The :class:`VisionProcessor` a model uses (None: a text-only model), one per processor and tokenizer.

    Raises:
        ConfigError: a directory without a loadable image processor, or a processor of an unknown family.
    """
    if processor is False:
        return None
    if isinstance(processor, VisionProcessor):
        return processor
    if processor is None:
        directory = getattr(tokenizer, "name_or_path", None)
        if not directory or not has_preprocessor(directory):
            return None
        processor = directory
    if isinstance(processor, (str, os.PathLike)):
        processor = load_image_processor(processor)
    key = (id(processor), id(tokenizer), max_images)
    with _processors_lock:
        shared = _shared.get(key)
        if shared is None or shared.image_processor is not processor:
            shared = _shared[key] = VisionProcessor(processor, tokenizer, max_images=max_images)
        return shared

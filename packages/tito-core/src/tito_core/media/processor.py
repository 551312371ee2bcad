"""The vision side of rendering: how many placeholder tokens each item of a prompt becomes, and where they sit.

:class:`VisionProcessor` wraps the model's Hugging Face image processor and its :class:`VisionFamily`, and
expands each placeholder of rendered ids (one per image or video part) to the item's token count, producing one
:class:`~tito_core.media.PromptMedia` (span + item) per item, so the trajectory holds exactly the ids the engine
consumes. :func:`refusal` is the one answer to "can this call take these kinds?".

Nothing here looks a kind or a family up by name: the plugin registry sits above ``tito_core.media`` (its hook
records name media classes), so a processor is given its family (:func:`tito_core.model_setup.vision_processor`
picks the registered one), and the lookups of kinds by name live with the prompt
(:mod:`tito_core.rollout_core.prompt`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import MediaError, MediaItem
from .families import VisionFamily
from .spans import MediaSpan, PromptMedia
from .video import VideoError

__all__ = [
    "DEFAULT_MAX_IMAGES",
    "ProcessorSpec",
    "VisionProcessor",
    "directory_key",
    "has_preprocessor",
    "load_image_processor",
    "load_video_processor",
    "refusal",
]

DEFAULT_MAX_IMAGES = 64
"""How many images and videos one prompt (a request's ``input_ids``) may hold unless ``max_images`` says otherwise."""

_MEASURED = 4096  # grids remembered per processor (by item hash), so re-rendered items are not re-measured


class VisionProcessor:
    """Expands each placeholder of rendered ids into the tokens the model consumes for that image or video.

    A model's is built by :func:`tito_core.model_setup.vision_processor`, which finds the registered family of its
    processor.

    Args:
        image_processor: The model's Hugging Face image processor (``AutoImageProcessor`` of its directory).
        family: Placeholders and token counts per kind (:func:`tito_core.model_setup.family_of` gives the
            registered family of ``image_processor``).
        max_images: The most items (images and videos) one prompt may hold (a :class:`MediaError` beyond).
    """

    def __init__(self, image_processor: Any, family: VisionFamily, *, max_images: int = DEFAULT_MAX_IMAGES) -> None:
        if max_images < 1:
            raise ConfigError(f"max_images must be at least 1, not {max_images}")
        self.image_processor = image_processor
        self.family = family
        self.max_images = max_images
        self._measured: dict[str, tuple[tuple[int, ...] | None, int]] = {}
        self._lock = threading.Lock()

    @property
    def kinds(self) -> frozenset[str]:
        """The input kinds this model takes."""
        return frozenset(self.family.placeholder_ids)

    @property
    def placeholder_ids(self) -> Mapping[str, int]:
        """Per input kind, the token id a template writes once per item."""
        return self.family.placeholder_ids

    @property
    def never_sample(self) -> tuple[int, ...]:
        """The vision token ids an engine must never sample (requests carry them as ``never_sample``)."""
        return self.family.never_sample

    def measure(self, item: MediaItem) -> tuple[tuple[int, ...] | None, int]:
        """``(grid_thw, token count)`` of ``item``, computed once per distinct item (by hash)."""
        known = self._measured.get(item.sha256)
        if known is not None:
            return known
        try:
            measured = self.family.measure(item)
        except MediaError:
            raise
        except Exception as exc:  # the processor's own errors (a size it refuses, ...)
            raise item.error(f"the model's processor cannot process {item!r}: {exc}") from exc
        with self._lock:
            if len(self._measured) >= _MEASURED:
                self._measured.clear()
            self._measured[item.sha256] = measured
        return measured

    def expand(self, ids: Sequence[int], items: Sequence[MediaItem], start: int) -> tuple[list[int], list[PromptMedia]]:
        """Replace the i-th placeholder of ``ids`` by ``items[i]``'s tokens; ``start`` is ``ids[0]``'s position.

        Returns the expanded ids and one :class:`~tito_core.media.PromptMedia` per item, its span in trajectory
        positions.

        Raises:
            MediaError: the ids' placeholders differ from the items, in number or kind (a chat template that
                does not render them, or text spelling a placeholder token).
        """
        kind_of = {token: kind for kind, token in self.placeholder_ids.items()}
        at = [(i, kind_of[token]) for i, token in enumerate(ids) if token in kind_of]
        found, wanted = [kind for _, kind in at], [item.kind for item in items]
        if found != wanted:
            raise _error_of(set(found) | set(wanted), items)(
                f"the rendered prompt holds {_count(found)} placeholder(s) for {_count(wanted)}: the chat template "
                "does not render these inputs (a text-only template?), or a text spells a placeholder"
            )
        out: list[int] = []
        spans: list[PromptMedia] = []
        prev = 0
        for (pos, kind), item in zip(at, items, strict=True):
            out.extend(ids[prev:pos])
            grid, count = self.measure(item)
            placeholder = self.placeholder_ids[kind]
            span = MediaSpan(
                start=start + len(out),
                length=count,
                sha256=item.sha256,
                grid_thw=grid,
                placeholder_id=placeholder,
                kind=kind,
                **item.span_fields(),
            )
            out.extend([placeholder] * count)
            spans.append(PromptMedia(span=span, item=item))
            prev = pos + 1
        out.extend(ids[prev:])
        return out, spans


def _count(kinds: Sequence[str]) -> str:
    """``2 image(s) and 1 video(s)``; ``no input`` for none."""
    if not kinds:
        return "no input"
    return " and ".join(f"{kinds.count(k)} {k}(s)" for k in dict.fromkeys(kinds))


def _error_of(kinds: Collection[str], items: Sequence[MediaItem]) -> type[MediaError]:
    """The error about inputs of ``kinds``: the kind's own (``ImageError``) when they are one kind among ``items``."""
    own = {item.kind: item.error for item in items}
    return own.get(next(iter(kinds)), MediaError) if len(kinds) == 1 else MediaError


def refusal(
    kinds: Collection[str], vision: VisionProcessor | None, backend: str, backend_kinds: Collection[str]
) -> str | None:
    """Why a call whose prompt holds items of ``kinds`` cannot go to this model and backend, or None when it can.

    The one check of a prompt's inputs: the model must have a vision processor whose family takes each kind, and
    the backend must send each kind to its engine (its ``input_kinds``).
    """
    if not kinds:
        return None
    names = _plural(kinds)
    if vision is None:
        return (
            f"this model takes no {names}: it is text-only (no vision processor: set `processor` in the config, or "
            "use a model directory with a preprocessor_config.json)"
        )
    missing = sorted(set(kinds) - vision.kinds)
    if missing:
        return f"this model takes no {_plural(missing)} (it takes {_plural(vision.kinds)})"
    unsent = sorted(set(kinds) - set(backend_kinds))
    if unsent:
        return f"the {backend} backend takes no {_plural(unsent)} (it takes {_plural(backend_kinds) or 'text only'})"
    return None


def _plural(kinds: Collection[str]) -> str:
    """``images, videos``: the kinds' names in the plural, sorted."""
    return ", ".join(f"{kind}s" for kind in sorted(kinds))


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
    key = directory_key(directory)
    with _processors_lock:
        cached = _processors.get(key)
        if cached is not None:
            return cached
        if not has_preprocessor(key):
            raise ConfigError(f"{directory} holds no image processor (no preprocessor_config.json)")
        try:
            from transformers import AutoImageProcessor

            auto: Any = AutoImageProcessor
            processor = auto.from_pretrained(key, local_files_only=True)
        except (OSError, ValueError, ImportError) as exc:
            raise ConfigError(f"cannot load the image processor of {directory}: {exc}") from exc
        _processors[key] = processor
        return processor


_video_processors: dict[str, Any] = {}


def load_video_processor(directory: str | os.PathLike[str]) -> Any:
    """The video processor of a local model directory (``AutoVideoProcessor``), loaded once per process per path.

    Raises:
        VideoError: the directory holds no ``video_preprocessor_config.json``, or its processor does not load
            (transformers' video processors need torchvision).
    """
    key = directory_key(directory)
    with _processors_lock:
        cached = _video_processors.get(key)
        if cached is not None:
            return cached
        if not (Path(key) / "video_preprocessor_config.json").is_file():
            raise VideoError(f"{directory} holds no video processor (no video_preprocessor_config.json)")
        try:
            from transformers import AutoVideoProcessor

            auto: Any = AutoVideoProcessor
            processor = auto.from_pretrained(key, local_files_only=True)
        except Exception as exc:  # ImportError without torchvision, a broken torchvision build, a bad config ...
            raise VideoError(f"the video processor of {directory} does not load ({type(exc).__name__}: {exc})") from exc
        _video_processors[key] = processor
        return processor


def directory_key(directory: str | os.PathLike[str]) -> str:
    """The cache key of a model directory: its resolved path (as given when it does not exist)."""
    path = Path(directory).expanduser()
    return str(path.resolve()) if path.exists() else str(path)


ProcessorSpec = Any
"""What ``TitoModel(processor=...)`` takes: None (the tokenizer's directory, when it holds a
``preprocessor_config.json``), False (no vision), a directory, a Hugging Face image processor, or a
:class:`VisionProcessor`."""

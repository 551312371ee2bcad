"""Images for the embedded backend: pixel inputs of a request's images, checked against its placeholder spans.

A vision model (Qwen2.5-VL and its kin: a ``vision_config`` and an ``image_token_id``) takes, with the
prompt's ids, the images' ``pixel_values`` and ``image_grid_thw`` from the model directory's own image
processor, and 3-D (MRoPE) positions. :class:`_Vision` runs on the caller's side before a request is queued:
it processes each image once (cached by content hash), checks that the processor's grid and token count are
those of the image's span in ``input_ids`` (a mismatch is a
:class:`~tito_core.errors.BackendRequestError` naming the image, and nothing is generated) and hands the job
a :class:`_Pixels`. :func:`_rope_positions` computes the positions with the model's own ``get_rope_index``.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tito_core.backend import GenerateRequest
from tito_core.errors import BackendRequestError
from tito_core.media import PromptMedia

if TYPE_CHECKING:
    import torch

_CACHED_IMAGES = 64  # processed images kept (by sha256); a 448x448 image is ~5 MB of float32 pixels


@dataclasses.dataclass(frozen=True)
class _Pixels:
    """A request's vision inputs, in token order: what the model's forward takes with the prompt."""

    pixel_values: torch.Tensor  # [patches of all images, channels * temporal * patch * patch], float32
    image_grid_thw: torch.Tensor  # [images, 3]


class _Vision:
    """A vision model's image token and image processor; turns requests' images into checked pixel inputs."""

    def __init__(self, name: str, model_path: str, config: Any) -> None:
        self.name = name  # the backend's, for its errors
        self.model_path = model_path
        self.image_token_id = int(config.image_token_id)
        self.kinds = frozenset({"image"})
        self.merge = int(getattr(config.vision_config, "spatial_merge_size", 2))
        self._processor: Any = None  # the model directory's image processor, loaded on the first image
        self._cache: collections.OrderedDict[str, tuple[torch.Tensor, tuple[int, ...]]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def pixels(self, request: GenerateRequest) -> _Pixels:
        """Check the request's images against its ids and return their pixel inputs (BackendRequestError if not)."""
        import torch

        ids = request.input_ids
        self._check_spans(request.media, ids)
        values, grids = [], []
        for index, prompt_image in enumerate(request.media):
            pixels, grid = self._process(prompt_image)
            span = prompt_image.span
            if span.grid_thw is not None and tuple(span.grid_thw) != grid:
                raise self._error(
                    index,
                    prompt_image,
                    f"the model's image processor gives it the grid {list(grid)}, not the span's {list(span.grid_thw)}",
                )
            tokens = grid[0] * grid[1] * grid[2] // (self.merge * self.merge)
            if tokens != span.length:
                raise self._error(
                    index,
                    prompt_image,
                    f"the model's image processor makes it {tokens} placeholder tokens (grid {list(grid)}), "
                    f"but its span has {span.length}",
                )
            values.append(pixels)
            grids.append(grid)
        return _Pixels(torch.cat(values), torch.tensor(grids, dtype=torch.long))

    def _check_spans(self, images: Sequence[PromptMedia], ids: Sequence[int]) -> None:
        """Each span lies inside ``ids``, in order, over image placeholders; no placeholder is outside a span."""
        end = 0
        for index, prompt_image in enumerate(images):
            span = prompt_image.span
            if span.placeholder_id != self.image_token_id:
                raise self._error(
                    index,
                    prompt_image,
                    f"its placeholder id {span.placeholder_id} is not this model's image token {self.image_token_id}",
                )
            if span.start < end or span.length < 1 or span.end > len(ids):
                raise self._error(
                    index,
                    prompt_image,
                    f"its span [{span.start}, {span.end}) is outside the prompt (length {len(ids)}), empty, "
                    "or before the previous image's end",
                )
            if any(ids[i] != self.image_token_id for i in range(span.start, span.end)):
                raise self._error(index, prompt_image, f"its span [{span.start}, {span.end}) is not all placeholders")
            end = span.end
        placed = sum(image.span.length for image in images)
        found = sum(1 for token in ids if token == self.image_token_id)
        if found != placed:
            raise BackendRequestError(
                f"the prompt has {found} image placeholder tokens (id {self.image_token_id}) but its images' spans "
                f"cover {placed}: every placeholder must belong to one image",
                field="images",
                backend=self.name,
            )

    def _process(self, prompt_image: PromptMedia) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The image's pixel values and grid from the model's image processor (cached by sha256; thread-safe)."""
        key = prompt_image.image.sha256
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            processor = self._load_processor()
        out = processor(images=[prompt_image.image.to_pil()], return_tensors="pt")
        entry = (out["pixel_values"].float(), tuple(int(x) for x in out["image_grid_thw"][0].tolist()))
        with self._lock:
            self._cache[key] = entry
            while len(self._cache) > _CACHED_IMAGES:
                self._cache.popitem(last=False)
        return entry

    def _load_processor(self) -> Any:
        if self._processor is None:
            from transformers import AutoImageProcessor

            try:
                self._processor = AutoImageProcessor.from_pretrained(self.model_path)
            except (OSError, ValueError) as exc:
                raise BackendRequestError(
                    f"images need the model's image processor (preprocessor_config.json in {self.model_path}), "
                    f"which failed to load: {exc}",
                    field="images",
                    backend=self.name,
                ) from exc
        return self._processor

    def _error(self, index: int, prompt_image: PromptMedia, reason: str) -> BackendRequestError:
        image = prompt_image.image
        width, height = image.size
        return BackendRequestError(
            f"image {index} ({image.format} {width}x{height}, sha256 {image.sha256[:12]}): {reason}",
            field=f"images[{index}]",
            value=prompt_image.span,
            backend=self.name,
        )


def _vision_of(name: str, model_path: str, model: Any) -> _Vision | None:
    """The model's vision side, or None for a text-only model (no ``vision_config`` / ``image_token_id``)."""
    config = model.config
    if getattr(config, "vision_config", None) is None or getattr(config, "image_token_id", None) is None:
        return None
    return _Vision(name, model_path, config)


def _rope_positions(model: Any, ids: torch.Tensor, grid: torch.Tensor, image_token_id: int) -> tuple[torch.Tensor, int]:
    """The 3-D positions ``[3, 1, len]`` of a prompt with images, by the model's ``get_rope_index``.

    Also returns the offset (``max + 1 - len``) that the positions of the tokens after the prompt take.
    """
    owner = _rope_owner(model)
    kwargs: dict[str, Any] = {"image_grid_thw": grid}
    if "mm_token_type_ids" in inspect.signature(owner.get_rope_index).parameters:
        kwargs["mm_token_type_ids"] = (ids == image_token_id).int()  # 1 on images, 0 on text (no videos)
    positions, deltas = owner.get_rope_index(ids, **kwargs)
    return positions, int(deltas.reshape(-1)[0])


def _rope_owner(model: Any) -> Any:
    """The submodule with ``get_rope_index`` (the inner model; a peft wrapper adds levels)."""
    seen = model
    for _ in range(4):
        if hasattr(seen, "get_rope_index"):
            return seen
        seen = getattr(seen, "model", None) or getattr(seen, "base_model", None)
        if seen is None:
            break
    raise TypeError(f"{type(model).__name__} has vision inputs but no get_rope_index (not a Qwen-VL model?)")

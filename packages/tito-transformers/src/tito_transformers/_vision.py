"""Images and videos for the embedded backend: pixel inputs of a request's media, checked against their spans.

A vision model (Qwen2.5-VL and its kin: a ``vision_config`` and an ``image_token_id``) takes, with the prompt's
ids, its images' ``pixel_values`` and ``image_grid_thw`` from the model directory's own image processor, its
videos' ``pixel_values_videos`` and ``video_grid_thw`` (and, for Qwen2.5-VL, ``second_per_grid_ts``: seconds per
temporal patch) from its video processor, and 3-D (MRoPE) positions. Videos need the directory's
``video_preprocessor_config.json`` and a transformers whose video processors load (they need torchvision); without
them the backend takes images only (``input_kinds``). :class:`_Vision` runs on the caller's side before a request
is queued: it processes each item once (cached by content hash), checks that the processor's grid and token count
are those of the item's span in ``input_ids`` (a mismatch is a
:class:`~tito_core.errors.BackendRequestError` naming the item, and nothing is generated) and hands the job a
:class:`_Pixels`. :func:`_rope_positions` computes the positions with the model's own ``get_rope_index``.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import logging
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tito_core.backend import GenerateRequest
from tito_core.errors import BackendRequestError
from tito_core.media import PromptMedia, Video, VideoError
from tito_core.media.processor import load_video_processor

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("tito")

_CACHED = 64  # processed items kept (by sha256); a 448x448 image is ~5 MB of float32 pixels
_TYPE_IDS = {"image": 1, "video": 2}  # transformers' mm_token_type_ids: text 0, image 1, video 2


@dataclasses.dataclass(frozen=True)
class _Pixels:
    """A request's vision inputs, in token order per kind: what the model's forward takes with the prompt."""

    pixel_values: torch.Tensor | None  # [patches of all images, channels * temporal * patch * patch], float32
    image_grid_thw: torch.Tensor | None  # [images, 3]
    pixel_values_videos: torch.Tensor | None  # [patches of all videos, ...], float32
    video_grid_thw: torch.Tensor | None  # [videos, 3]
    second_per_grid_ts: torch.Tensor | None  # [videos]: seconds per temporal patch (temporal_patch_size / fps)

    def forward_inputs(self, device: Any, dtype: Any) -> dict[str, Any]:
        """The keyword arguments of the model's forward for these inputs (only the kinds present)."""
        out: dict[str, Any] = {}
        if self.pixel_values is not None and self.image_grid_thw is not None:
            out["pixel_values"] = self.pixel_values.to(device, dtype)
            out["image_grid_thw"] = self.image_grid_thw.to(device)
        if self.pixel_values_videos is not None and self.video_grid_thw is not None:
            out["pixel_values_videos"] = self.pixel_values_videos.to(device, dtype)
            out["video_grid_thw"] = self.video_grid_thw.to(device)
            if self.second_per_grid_ts is not None:
                out["second_per_grid_ts"] = self.second_per_grid_ts.to(device)
        return out


class _Vision:
    """A vision model's placeholder tokens and processors; turns requests' media into checked pixel inputs."""

    def __init__(self, name: str, model_path: str, config: Any) -> None:
        self.name = name  # the backend's, for its errors
        self.model_path = model_path
        self.image_token_id = int(config.image_token_id)
        video_token = getattr(config, "video_token_id", None)
        self.token_ids = {"image": self.image_token_id}
        self.merge = int(getattr(config.vision_config, "spatial_merge_size", 2))
        self._processor: Any = None  # the model directory's image processor, loaded on the first image
        self._video_processor = _video_processor(model_path) if video_token is not None else None
        if self._video_processor is not None and video_token is not None:
            self.token_ids["video"] = int(video_token)
        self.kinds = frozenset(self.token_ids)
        self._cache: collections.OrderedDict[str, tuple[torch.Tensor, tuple[int, ...]]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def pixels(self, request: GenerateRequest) -> _Pixels:
        """Check the request's media against its ids and return their pixel inputs (BackendRequestError if not)."""
        import torch

        ids = request.input_ids
        self._check_spans(request.media, ids)
        values: dict[str, list[torch.Tensor]] = {"image": [], "video": []}
        grids: dict[str, list[tuple[int, ...]]] = {"image": [], "video": []}
        seconds: list[float] = []
        for index, item in enumerate(request.media):
            pixels, grid = self._process(index, item)
            span = item.span
            if span.grid_thw is not None and tuple(span.grid_thw) != grid:
                raise self._error(
                    index,
                    item,
                    f"the model's {span.kind} processor gives it the grid {list(grid)}, not the span's "
                    f"{list(span.grid_thw)}",
                )
            tokens = math.prod(grid) // (self.merge * self.merge)
            if tokens != span.length:
                raise self._error(
                    index,
                    item,
                    f"the model's {span.kind} processor makes it {tokens} placeholder tokens (grid {list(grid)}), "
                    f"but its span has {span.length}",
                )
            values[span.kind].append(pixels)
            grids[span.kind].append(grid)
            if isinstance(item.item, Video):
                seconds.append(self._videos().temporal_patch_size / item.item.fps)

        def stacked(kind: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
            if not values[kind]:
                return None, None
            return torch.cat(values[kind]), torch.tensor(grids[kind], dtype=torch.long)

        images, image_grid = stacked("image")
        videos, video_grid = stacked("video")
        per_grid = torch.tensor(seconds, dtype=torch.float32) if seconds else None
        return _Pixels(images, image_grid, videos, video_grid, per_grid)

    def _check_spans(self, media: Sequence[PromptMedia], ids: Sequence[int]) -> None:
        """Each span lies inside ``ids``, in order, over its kind's placeholders; no placeholder is outside a span."""
        end = 0
        for index, item in enumerate(media):
            span = item.span
            token = self.token_ids.get(span.kind)
            if token is None:
                raise self._error(index, item, f"the model at {self.model_path} takes no {span.kind}s")
            if span.placeholder_id != token:
                raise self._error(
                    index,
                    item,
                    f"its placeholder id {span.placeholder_id} is not this model's {span.kind} token {token}",
                )
            if span.start < end or span.length < 1 or span.end > len(ids):
                raise self._error(
                    index,
                    item,
                    f"its span [{span.start}, {span.end}) is outside the prompt (length {len(ids)}), empty, "
                    "or before the previous item's end",
                )
            if any(ids[i] != token for i in range(span.start, span.end)):
                raise self._error(index, item, f"its span [{span.start}, {span.end}) is not all placeholders")
            end = span.end
        for kind, token in self.token_ids.items():
            placed = sum(item.span.length for item in media if item.span.kind == kind)
            found = sum(1 for t in ids if t == token)
            if found != placed:
                raise BackendRequestError(
                    f"the prompt has {found} {kind} placeholder tokens (id {token}) but its {kind}s' spans cover "
                    f"{placed}: every placeholder must belong to one {kind}",
                    field="media",
                    backend=self.name,
                )

    def _process(self, index: int, item: PromptMedia) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The item's pixel values and grid from the model's processor (cached by sha256; thread-safe)."""
        key = item.item.sha256
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        if isinstance(item.item, Video):
            out = self._videos()(videos=[item.item.to_pil_frames()], return_tensors="pt", do_sample_frames=False)
            values, grid = out["pixel_values_videos"], out["video_grid_thw"]
        else:
            with self._lock:
                processor = self._load_processor()
            out = processor(images=[item.image.to_pil()], return_tensors="pt")
            values, grid = out["pixel_values"], out["image_grid_thw"]
        entry = (values.float(), tuple(int(x) for x in grid[0].tolist()))
        with self._lock:
            self._cache[key] = entry
            while len(self._cache) > _CACHED:
                self._cache.popitem(last=False)
        return entry

    def _videos(self) -> Any:
        """The video processor (``_check_spans`` refused videos before, when there is none)."""
        if self._video_processor is None:
            raise BackendRequestError(
                f"the model at {self.model_path} takes no videos", field="media", backend=self.name
            )
        return self._video_processor

    def _load_processor(self) -> Any:
        if self._processor is None:
            from transformers import AutoImageProcessor

            try:
                self._processor = AutoImageProcessor.from_pretrained(self.model_path)
            except (OSError, ValueError) as exc:
                raise BackendRequestError(
                    f"images need the model's image processor (preprocessor_config.json in {self.model_path}), "
                    f"which failed to load: {exc}",
                    field="media",
                    backend=self.name,
                ) from exc
        return self._processor

    def _error(self, index: int, item: PromptMedia, reason: str) -> BackendRequestError:
        span = item.span
        size = f" {span.size[0]}x{span.size[1]}" if span.size is not None else ""
        return BackendRequestError(
            f"{span.kind} {index} ({span.format}{size}, sha256 {span.sha256[:12]}): {reason}",
            field=f"media[{index}]",
            value=item.span,
            backend=self.name,
        )


def _video_processor(model_path: str) -> Any:
    """The model directory's video processor, or None: then the backend takes no videos (the reason is logged).

    None without a ``video_preprocessor_config.json``, or when it does not load (transformers' video processors
    need torchvision).
    """
    try:
        return load_video_processor(model_path)
    except VideoError as exc:
        logger.info("videos are off: %s", exc)
        return None


def _vision_of(name: str, model_path: str, model: Any) -> _Vision | None:
    """The model's vision side, or None for a text-only model (no ``vision_config`` / ``image_token_id``)."""
    config = model.config
    if getattr(config, "vision_config", None) is None or getattr(config, "image_token_id", None) is None:
        return None
    return _Vision(name, model_path, config)


def _rope_positions(model: Any, ids: torch.Tensor, pixels: _Pixels, vision: _Vision) -> tuple[torch.Tensor, int]:
    """The 3-D positions ``[3, 1, len]`` of a prompt with images or videos, by the model's ``get_rope_index``.

    Also returns the offset (``max + 1 - len``) that the positions of the tokens after the prompt take.
    """
    owner = _rope_owner(model)
    accepted = inspect.signature(owner.get_rope_index).parameters
    kwargs: dict[str, Any] = {"image_grid_thw": pixels.image_grid_thw, "video_grid_thw": pixels.video_grid_thw}
    if pixels.second_per_grid_ts is not None and "second_per_grid_ts" in accepted:
        kwargs["second_per_grid_ts"] = pixels.second_per_grid_ts
    if "mm_token_type_ids" in accepted:
        types = ids.new_zeros(ids.shape, dtype=ids.dtype).int()
        for kind, token in vision.token_ids.items():
            types[ids == token] = _TYPE_IDS[kind]
        kwargs["mm_token_type_ids"] = types
    device = ids.device
    kwargs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in kwargs.items() if v is not None}
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

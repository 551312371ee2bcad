"""Where each input sits among a trajectory's tokens, whatever its kind, and the form requests carry it in.

The renderer expands each item's placeholder into the tokens the model's forward pass consumes; the trajectory
records each item as a :class:`MediaSpan` over those tokens (its ``kind`` says which input kind) and keeps each
distinct picture's bytes once by hash. A request carries its prompt's items as :class:`PromptMedia` in token
order, so each adapter sends them in its engine's own shape.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from .base import MediaError, MediaItem
from .image import Image

__all__ = ["MediaSpan", "PromptMedia", "picture_hashes"]


class MediaSpan(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """Where one image, video or other input sits in a trajectory's token ids.

    Attributes:
        start: Index of its first placeholder token in the trajectory's ids.
        length: How many placeholder tokens it expanded to (what the vision encoder's output replaces).
        sha256: The item's content hash (an image's bytes are stored once per hash).
        format: The short name of its encoded form (``png`` ...; a video clip of frames: ``frames``).
        size: ``(width, height)`` of the original item, for a visual kind (None for a kind without pixels).
        grid_thw: The vision grid the model family's processor gave it (Qwen-VL's ``image_grid_thw`` or
            ``video_grid_thw``: temporal, height, width patches), or None for families without one.
        placeholder_id: The token id repeated over the span.
        kind: The input kind (``image``, ``video``, ...).
        frames: A video's frames, in order, by hash (each stored as an image); empty for other kinds.
        fps: A video's frame rate as the front declared it (the engine's temporal positions use it).
    """

    start: int
    length: int
    sha256: str
    format: str
    grid_thw: tuple[int, ...] | None
    placeholder_id: int
    size: tuple[int, int] | None = None
    kind: str = "image"
    frames: tuple[str, ...] = ()
    fps: float | None = None

    @property
    def end(self) -> int:
        """One past the last placeholder token."""
        return self.start + self.length

    @property
    def pictures(self) -> tuple[str, ...]:
        """The hashes of the pictures that hold this item's bytes: the image's own, or a clip's frames."""
        return self.frames if self.frames else (self.sha256,)


class PromptMedia(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One item of a request's ``input_ids``: its span there and the item itself (for the adapter to send)."""

    span: MediaSpan
    item: MediaItem

    @property
    def kind(self) -> str:
        """The item's input kind."""
        return self.span.kind

    @property
    def image(self) -> Image:
        """The item as an :class:`~tito_core.media.Image`, for code that takes images only.

        Raises:
            MediaError: the item is of another kind.
        """
        if not isinstance(self.item, Image):
            raise MediaError(f"a {self.item.kind} at token {self.span.start} where only images are taken")
        return self.item


def picture_hashes(spans: Iterable[MediaSpan]) -> set[str]:
    """The hashes of every picture the spans reference (what a record must hold bytes for)."""
    return {sha for span in spans for sha in span.pictures}

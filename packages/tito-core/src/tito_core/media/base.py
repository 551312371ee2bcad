"""What every input kind shares: the item a front hands in, its content part, and the errors.

An input kind (``image``, ``video``, ``audio``, ...) is a :class:`MediaItem` subclass: its ``kind`` names it, its
``mime_type`` says what its content is, and it says which pictures hold its bytes (an image is one, a video clip
its frames) and how to rebuild it from its span and those pictures, so a trajectory stores, exports and reloads
every kind the same way. Nothing in the contract assumes a picture: a visual kind (:class:`VisualItem`: images,
clips) adds its ``size`` in pixels. Kinds are registered through the ``tito_input_kinds`` plugin hook
(:class:`~tito_core.plugins.InputKindSpec`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from ..errors import UnsupportedContentError

__all__ = ["MediaError", "MediaItem", "VisualItem", "media_part"]


class MediaError(UnsupportedContentError):
    """An image, a video or another input tito cannot use, raised before any request (nothing is recorded).

    Bytes that do not decode, an unsupported format, too many items, an input for a model, template or backend
    that cannot take its kind.
    """


class MediaItem(ABC):
    """One non-text input of a prompt: immutable, identified (compared and hashed) by its kind and content hash."""

    __slots__ = ()

    kind: ClassVar[str]
    """The input kind's name: the content part's ``type``, the request's and the span's ``kind``."""
    error: ClassVar[type[MediaError]] = MediaError
    """The error raised about items of this kind (a :class:`MediaError` subclass, ``ImageError`` for images)."""

    @property
    @abstractmethod
    def sha256(self) -> str:
        """Hex SHA-256 of the item's content: its identity in spans, records and caches."""

    @property
    @abstractmethod
    def mime_type(self) -> str:
        """The media type of its content: ``image/png``, ``audio/wav``; a clip of decoded frames ``video/x-frames``."""

    @abstractmethod
    def pictures(self) -> tuple[Any, ...]:
        """The :class:`~tito_core.media.Image` objects that hold its bytes: an image itself, a clip's frames.

        A trajectory stores each distinct one once, by hash (a kind whose bytes are no pictures has none to store
        that way yet).
        """

    @abstractmethod
    def span_fields(self) -> dict[str, Any]:
        """The kind's own fields of its :class:`~tito_core.media.MediaSpan`.

        ``format`` (the short name of its encoded form: ``png``; a clip's ``frames``), and what applies to the
        kind: a visual kind's ``size``, a clip's ``frames`` and ``fps``.
        """

    def __eq__(self, other: object) -> bool:
        """Items are equal when they are of one kind and have one content hash."""
        return isinstance(other, MediaItem) and other.kind == self.kind and other.sha256 == self.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    @classmethod
    @abstractmethod
    def from_span(cls, span: Any, pictures: Mapping[str, Any]) -> MediaItem:
        """The item a :class:`~tito_core.media.MediaSpan` describes, from the stored pictures (a record read back).

        ``pictures`` holds the stored :class:`~tito_core.media.Image` objects by hash.

        Raises:
            MediaError: a picture it names is missing.
        """


class VisualItem(MediaItem):
    """An input kind seen as pixels (an image, a video clip): it has a size."""

    __slots__ = ()

    @property
    @abstractmethod
    def size(self) -> tuple[int, int]:
        """``(width, height)`` in pixels, upright."""


def media_part(item: MediaItem) -> dict[str, Any]:
    """The content part that puts ``item`` into a chat message: ``{"type": kind, kind: item}``.

    The form chat templates render (Qwen-VL's templates test ``content.type`` or the kind's key).
    """
    return {"type": item.kind, item.kind: item}

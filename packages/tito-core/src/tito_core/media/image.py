"""The image input kind: an image's bytes as a front hands them in, checked to decode, loaded as engines load them.

A front puts an image into a message as a content part, ``{"type": "image", "image": Image(...)}`` (the form
chat templates take), in a user or tool message. The renderer expands each image's placeholder into the tokens
the model's forward pass consumes; the trajectory records each image as a
:class:`~tito_core.media.MediaSpan` over those tokens and keeps the bytes once per distinct image (by content
hash).

Pillow reads the bytes (``pip install "tito-core[vision]"``): an image that does not decode is an
:class:`ImageError` when the :class:`Image` is built, before any request.
"""

from __future__ import annotations

import base64
import hashlib
import io
import threading
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from .base import MediaError, VisualItem, media_part

__all__ = ["FORMATS", "Image", "ImageError", "ImageFormat", "image_part", "is_image_part", "picture_format"]

ImageFormat = Literal["png", "jpeg", "gif", "webp"]
FORMATS: frozenset[str] = frozenset({"png", "jpeg", "gif", "webp"})
"""The formats tito accepts (Strands' image formats; PIL's names, ``jpg`` read as ``jpeg``)."""


class ImageError(MediaError):
    """An image tito cannot use, raised before any request (nothing is recorded).

    An unsupported format, bytes that do not decode, too many images, an image for a model or template without vision.
    """


class Image(VisualItem):
    """One image's encoded bytes, checked to decode, with its format, size and content hash.

    Immutable; compared and hashed by content (``sha256`` of the bytes). :func:`~tito_core.conversation.canonical`
    encodes it as its hash, so comparing conversations never walks the bytes. Bytes already decoded once in this
    process (same hash) are not decoded again: a front that converts its whole conversation every call (Strands)
    builds each image of it again each call, and decoding is ~20x the cost of hashing.

    Args:
        data: The encoded image (PNG, JPEG, GIF or WebP).
        format: The format the front declares (``"jpg"`` is read as ``"jpeg"``); None takes the decoded one.
            A declared format that differs from the bytes' is an :class:`ImageError`.

    Raises:
        ImageError: the format is not supported, or the bytes do not decode.
    """

    __slots__ = ("__weakref__", "_base64", "_data", "_format", "_sha256", "_size")
    kind: ClassVar[str] = "image"
    error: ClassVar[type[MediaError]] = ImageError

    def __init__(self, data: bytes, format: str | None = None) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ImageError(f"image data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        sha256 = hashlib.sha256(data).hexdigest()
        decoded, size = _probe_once(data, sha256)
        _check_declared(format, decoded)
        self._data = data
        self._format: ImageFormat = decoded  # type: ignore[assignment]
        self._size = size
        self._sha256 = sha256
        self._base64: str | None = None

    @classmethod
    def of(cls, data: bytes, format: str | None = None) -> Image:
        """The :class:`Image` of ``data``: the one built before from this very ``bytes`` object while it lives.

        What a front calls when it converts its whole conversation every call (Strands, whose messages keep each
        image's ``bytes`` object from call to call): an image already in the conversation then costs a dict
        lookup, not a hash (and its base64 is encoded once), so a call pays only for its new images.

        Raises:
            ImageError: as the constructor.
        """
        if type(data) is bytes:
            known = _by_object.get(id(data))
            if known is not None and known._data is data:  # the Image holds ``data``: its id is not reused
                _check_declared(format, known._format)
                return known
        image = cls(data, format)
        _by_object[id(image._data)] = image
        return image

    @property
    def data(self) -> bytes:
        """The encoded bytes, as given."""
        return self._data

    @property
    def format(self) -> ImageFormat:
        """``png``, ``jpeg``, ``gif`` or ``webp``."""
        return self._format

    @property
    def mime_type(self) -> str:
        """``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp``."""
        return f"image/{self._format}"

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of :attr:`data`: the image's identity in records and on disk."""
        return self._sha256

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` in pixels, upright (an EXIF orientation that turns it by 90 degrees swaps them)."""
        return self._size

    @property
    def base64(self) -> str:
        """:attr:`data` in base64 (ASCII), encoded on first use and kept.

        Adapters that send every image of a prompt each call (SGLang's ``image_data``, ``data:`` URLs) then encode
        each image once per rollout, not once per call.
        """
        encoded = self._base64
        if encoded is None:
            encoded = self._base64 = base64.b64encode(self._data).decode("ascii")
        return encoded

    @property
    def data_url(self) -> str:
        """The image as a ``data:image/<format>;base64,...`` URL (OpenAI's ``image_url``; what SGLang and vLLM load).

        The one place tito writes one, from the cached :attr:`base64`.
        """
        return f"data:{self.mime_type};base64,{self.base64}"

    def to_pil(self) -> Any:
        """The decoded image as an RGB ``PIL.Image.Image`` (what image processors take), loaded as engines load it.

        Turned upright by its EXIF orientation (transformers' ``load_image``, vLLM), and any transparency composited
        onto white (transformers' ``convert_to_rgb``, vLLM): a transparent pixel's hidden colour is never what the
        model sees.
        """
        pil = _pil()
        from PIL import ImageOps

        with pil.open(io.BytesIO(self._data)) as opened:
            upright = ImageOps.exif_transpose(opened)
            if "A" in upright.getbands() or upright.info.get("transparency") is not None:
                rgba = upright.convert("RGBA")
                white = pil.new("RGBA", rgba.size, (255, 255, 255, 255))
                return pil.alpha_composite(white, rgba).convert("RGB")
            return upright.convert("RGB")

    def pictures(self) -> tuple[Image, ...]:
        """The image itself: its bytes are stored as they are."""
        return (self,)

    def span_fields(self) -> dict[str, Any]:
        """Its format and size."""
        return {"format": self._format, "size": self._size}

    @classmethod
    def from_span(cls, span: Any, pictures: Mapping[str, Image]) -> Image:
        """The stored image of the :class:`~tito_core.media.MediaSpan`'s hash.

        Raises:
            ImageError: no picture of that hash is stored.
        """
        try:
            return pictures[span.sha256]
        except KeyError:
            raise ImageError(f"no bytes are stored for image {span.sha256}") from None

    def __repr__(self) -> str:
        w, h = self._size
        return f"Image({self._format}, {w}x{h}, sha256={self._sha256[:12]}…)"


def image_part(image: Image) -> dict[str, Any]:
    """The content part that puts ``image`` into a chat message (the form chat templates render)."""
    return media_part(image)


def is_image_part(part: object) -> bool:
    """Whether a message content part is an image."""
    return isinstance(part, Mapping) and part.get("type") == "image"


_MAGIC = ((b"\x89PNG", "png"), (b"\xff\xd8", "jpeg"), (b"GIF8", "gif"))


def picture_format(data: bytes) -> str:
    """The format of encoded picture bytes by their signature, without decoding (a stored picture's file suffix).

    ``png``, ``jpeg``, ``gif``, ``webp``, or ``bin`` for anything else.
    """
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    return "webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else "bin"


def _format_name(name: str) -> str:
    lowered = name.lower()
    lowered = "jpeg" if lowered == "jpg" else lowered
    if lowered not in FORMATS:
        raise ImageError(f"image format {name!r} is not supported (supported: {', '.join(sorted(FORMATS))})")
    return lowered


def _pil() -> Any:
    try:
        from PIL import Image as PILImage
    except ImportError as exc:  # pragma: no cover - pillow is in the vision extra
        raise ImageError('images need Pillow: pip install "tito-core[vision]"') from exc
    return PILImage


def _check_declared(format: str | None, decoded: str) -> None:
    declared = _format_name(format) if format is not None else None
    if declared is not None and declared != decoded:
        raise ImageError(f"the image is declared {declared!r} but its bytes are {decoded!r}")


_by_object: weakref.WeakValueDictionary[int, Image] = weakref.WeakValueDictionary()
"""The live :class:`Image` of each ``bytes`` object (by ``id``) that :meth:`Image.of` built one from; an entry goes
when its Image does, and the Image holds the bytes, so an id in here is never a reused one."""

_ORIENTATION = 0x0112  # the EXIF tag
_TURNED = frozenset({5, 6, 7, 8})  # the orientations that turn the image by 90 or 270 degrees
_PROBED = 4096  # decoded (format, size) remembered by hash; a few hundred bytes each
_probed: dict[str, tuple[str, tuple[int, int]]] = {}
_probed_lock = threading.Lock()


def _probe_once(data: bytes, sha256: str) -> tuple[str, tuple[int, int]]:
    """:func:`_probe` of ``data``, whose hash is ``sha256``; bytes of a hash probed before are not decoded again."""
    known = _probed.get(sha256)
    if known is not None:
        return known
    probed = _probe(data)  # raises for bytes that do not decode: those are not remembered
    with _probed_lock:
        if len(_probed) >= _PROBED:
            _probed.clear()
        _probed[sha256] = probed
    return probed


def _probe(data: bytes) -> tuple[str, tuple[int, int]]:
    """The decoded format and size of ``data``; fully decoded, so truncated bytes fail here, not in a processor."""
    pil = _pil()
    try:
        with pil.open(io.BytesIO(data)) as opened:
            fmt = (opened.format or "").lower()
            size = (int(opened.width), int(opened.height))
            if opened.getexif().get(_ORIENTATION) in _TURNED:
                size = size[::-1]  # as exif_transpose turns it (to_pil)
            opened.load()
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError ...
        raise ImageError(f"the image bytes do not decode ({type(exc).__name__}: {exc})") from exc
    fmt = "jpeg" if fmt in ("jpg", "mpo") else fmt
    if fmt not in FORMATS:
        raise ImageError(
            f"image format {fmt or 'unknown'!r} is not supported (supported: {', '.join(sorted(FORMATS))})"
        )
    return fmt, size

"""Images in a request as the core's image parts: inline data only (a ``data:`` URL, base64 bytes), each checked.

Each front finds its image parts (OpenAI's ``image_url``, Responses' ``input_image``, Anthropic's base64 ``image``
source, Gemini's ``inlineData``) and hands their data here: :meth:`ImageReader.read_url` takes a
``data:image/<format>;base64,<bytes>`` URL, :meth:`ImageReader.read_base64` the base64 bytes and their media type.
The gateway fetches nothing: an ``http(s)`` or any other URL is a 400, as is a data URL that is not base64 image
data, bytes that do not decode, a format tito does not take (the :class:`~tito_core.media.ImageError`'s words), and
any image for a model that cannot take one (text-only, or a backend without images). Each error names the field.

Clients resend the whole history every call, images included; :class:`ImageReader` keeps the previous request's
images by their data, so a replayed image is not decoded again (the core compares it by content hash, so the same
image matches and a changed one forks).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..conversation import message_content as content_of
from ..media import Image, ImageError
from .errors import bad_request

__all__ = ["DETAILS", "ImageReader", "message_content"]

DETAILS = frozenset({"auto", "low", "high"})
"""OpenAI's ``detail`` values; accepted and without effect: the model's image processor sets the resolution."""

_TEXT_JOINER = "\n"


class ImageReader:
    """One rollout's reader of images.

    Args:
        refusal: Why this rollout's model takes no images (every image is then a 400), or None.
    """

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self._seen: dict[tuple[str, str], Image] = {}  # the last request's images by media type and data
        self._now: dict[tuple[str, str], Image] = {}

    def begin(self) -> None:
        """Start reading a new request: the images of the last one stay known, older ones are forgotten."""
        self._seen, self._now = self._now, {}

    def read_url(self, url: str, field: str, part: str | None = None) -> Image:
        """The image of a ``data:`` URL the caller wrote at ``field``, in its image part ``part`` (default: ``field``).

        A model that takes no images refuses the part; a bad URL or bad data is refused at ``field``.

        Raises:
            GatewayError: 400 naming the field: no images for this model, not a data URL, not base64 image data,
                or an :class:`~tito_core.media.ImageError` (undecodable bytes, unsupported or mismatched format).
        """
        if self.refusal is not None:
            raise bad_request(part or field, self.refusal)
        head, comma, payload = url.partition(",")
        if head[:5].lower() != "data:" or not comma:
            scheme = url.split(":", 1)[0].lower() if ":" in url[:16] else ""
            shown = f"an {scheme} URL" if scheme in ("http", "https") else "not a data: URL"
            raise bad_request(
                field,
                f"{shown}: the tito gateway fetches nothing; send the image inline as data:image/png;base64,...",
                code="image_url_not_inline",
            )
        params = head[5:].split(";")
        media, encoding = params[0].strip().lower(), [p.strip().lower() for p in params[1:]]
        if "base64" not in encoding:
            raise bad_request(field, "a data URL image must be base64 encoded (data:image/png;base64,...)")
        return self.read_base64(payload, media, field)

    def read_base64(self, data: str, media_type: str | None, field: str, part: str | None = None) -> Image:
        """The image of base64 ``data`` of ``media_type`` (``image/png``; None: from the bytes) written at ``field``.

        Raises:
            GatewayError: 400 naming the field, or the part for a model that takes no images (as :meth:`read_url`).
        """
        if self.refusal is not None:
            raise bad_request(part or field, self.refusal)
        media = (media_type or "").strip().lower()
        if media and not media.startswith("image/"):
            raise bad_request(field, f"the media type {media!r} is not an image")
        key = (media, data)
        image = self._now.get(key) or self._seen.get(key)
        if image is None:
            image = _decode(data, media, field)
        self._now[key] = image
        return image


def _decode(payload: str, media: str, field: str) -> Image:
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(field, f"the image data is not valid base64 ({exc})", code="invalid_image") from None
    try:
        return Image(data, media.removeprefix("image/") or None)
    except ImageError as exc:
        raise bad_request(field, str(exc), code="invalid_image") from None


def message_content(parts: list[str | Image]) -> str | list[dict[str, Any]]:
    """A message's text pieces and images as the core's ``content``, as the Strands front builds it."""
    return content_of(parts, _TEXT_JOINER)

"""OpenAI ``image_url`` content parts to the core's image parts: inline ``data:`` URLs only, each a checked Image.

A user or tool message's ``image_url`` part (``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}``,
or ``"image_url": "<url>"``) whose URL is ``data:image/<format>;base64,<bytes>`` becomes
:func:`~tito_core.media.image_part` of an :class:`~tito_core.media.Image` (decoded once, here, before any request).
The gateway fetches nothing: an ``http(s)`` or any other URL is a 400, as is a data URL that is not base64 image
data, bytes that do not decode, a format tito does not take (the :class:`~tito_core.media.ImageError`'s words), and
any image for a model that cannot take one (text-only, or a backend without images). Each error names the field.

Clients resend the whole history every call, images included; :class:`ImageReader` keeps the previous request's
images by URL, so a replayed image is not decoded again (the core compares it by content hash, so the same image
matches and a changed one forks).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from ..conversation import message_content as content_of
from ..media import Image, ImageError
from .errors import bad_request

__all__ = ["DETAILS", "ImageReader", "message_content"]

DETAILS = frozenset({"auto", "low", "high"})
"""OpenAI's ``detail`` values; accepted and without effect: the model's image processor sets the resolution."""

_TEXT_JOINER = "\n"


class ImageReader:
    """One rollout's reader of ``image_url`` parts.

    Args:
        refusal: Why this rollout's model takes no images (every image part is then a 400), or None.
    """

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self._seen: dict[str, Image] = {}  # the last request's images by URL
        self._now: dict[str, Image] = {}

    def begin(self) -> None:
        """Start reading a new request: the images of the last one stay known, older ones are forgotten."""
        self._seen, self._now = self._now, {}

    def read(self, part: Mapping[str, Any], where: str) -> Image:
        """The image of the ``image_url`` part at ``where`` (``messages[1].content[0]``).

        Raises:
            GatewayError: 400 naming the field: no images for this model, not a data URL, not base64 image data,
                or an :class:`~tito_core.media.ImageError` (undecodable bytes, unsupported or mismatched format).
        """
        if self.refusal is not None:
            raise bad_request(where, self.refusal)
        url, field = _url(part, where)
        image = self._now.get(url) or self._seen.get(url)
        if image is None:
            image = _decode(url, field)
        self._now[url] = image
        return image


def _url(part: Mapping[str, Any], where: str) -> tuple[str, str]:
    """The part's URL and the field that holds it."""
    extra = sorted(k for k in part if k not in ("type", "image_url") and part[k] is not None)
    if extra:
        raise bad_request(f"{where}.{extra[0]}", "this field is not supported in an image_url part")
    value = part.get("image_url")
    if isinstance(value, str):
        return value, f"{where}.image_url"
    if not isinstance(value, Mapping):
        raise bad_request(f"{where}.image_url", "must be an object with a `url` (or the URL string)")
    unknown = sorted(k for k in value if k not in ("url", "detail") and value[k] is not None)
    if unknown:
        raise bad_request(f"{where}.image_url.{unknown[0]}", "this field is not supported (only url and detail)")
    detail = value.get("detail")
    if detail is not None and detail not in DETAILS:
        raise bad_request(f"{where}.image_url.detail", f"must be 'auto', 'low' or 'high', got {detail!r}")
    url = value.get("url")
    if not isinstance(url, str):
        raise bad_request(f"{where}.image_url.url", "must be a string")
    return url, f"{where}.image_url.url"


def _decode(url: str, field: str) -> Image:
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
    if media and not media.startswith("image/"):
        raise bad_request(field, f"the data URL's media type {media!r} is not an image")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(field, f"the data URL's payload is not valid base64 ({exc})", code="invalid_image") from None
    try:
        return Image(data, media.removeprefix("image/") or None)
    except ImageError as exc:
        raise bad_request(field, str(exc), code="invalid_image") from None


def message_content(parts: list[str | Image]) -> str | list[dict[str, Any]]:
    """A message's text pieces and images as the core's ``content``, as the Strands front builds it."""
    return content_of(parts, _TEXT_JOINER)

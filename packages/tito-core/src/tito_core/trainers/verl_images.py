"""A verl dataset row's images as tito images: its ``raw_prompt`` messages as Strands content or chat messages.

verl's ``RLHFDataset`` puts a row's images (its ``images`` column, ``multi_modal_data`` once rolled out) into
the ``raw_prompt`` messages: each ``<image>`` in a message's text becomes a part ``{"type": "image", "image":
...}`` (a PIL image; a ``{"bytes": ...}`` dict is opened into one; a path stays a path) between
``{"type": "text", "text": ...}`` parts. A rollout function hands a user message to its Strands agent as
content blocks (:func:`strands_content`), or drives a tito :class:`~tito_core.conversation.Conversation` with
:func:`chat_messages`. A PIL image becomes PNG bytes (lossless: the engine and the trainer see the dataset's
pixels). Nothing here imports verl.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UnsupportedContentError
from ..media import Image, ImageError, image_part

__all__ = ["chat_messages", "strands_content", "verl_image"]

_PNG_MODES = frozenset({"1", "L", "LA", "I", "P", "RGB", "RGBA"})


def verl_image(value: Any) -> Image:
    """One image of a verl row (a PIL image, encoded bytes, a path, a ``data:`` URL, or a dict holding one).

    Raises:
        ImageError: a remote URL (tito fetches nothing), a file that cannot be read, or a value that is no image.
    """
    if isinstance(value, Image):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Image(bytes(value))
    if isinstance(value, Mapping):
        for key in ("bytes", "image", "path"):
            if value.get(key) is not None:
                return verl_image(value[key])
        raise ImageError(f"an image dict needs bytes, image or path (got keys {sorted(map(str, value))})")
    if isinstance(value, (str, os.PathLike)):
        return _from_location(os.fspath(value))
    if callable(getattr(value, "save", None)) and isinstance(getattr(value, "mode", None), str):  # a PIL image
        picture = value if value.mode in _PNG_MODES else value.convert("RGB")
        buf = io.BytesIO()
        picture.save(buf, format="PNG")
        return Image(buf.getvalue(), "png")
    raise ImageError(
        f"a verl image must be a PIL image, bytes, a path or a dict holding one, not {type(value).__name__}"
    )


def _from_location(where: str) -> Image:
    if where.startswith("data:"):
        head, sep, payload = where.partition(",")
        if not sep or not head.endswith(";base64"):
            raise ImageError(f"a data: URL image must be base64 ({head[:40]!r})")
        try:
            return Image(base64.b64decode(payload, validate=True))
        except binascii.Error as exc:
            raise ImageError(f"a data: URL image is not valid base64: {exc}") from exc
    if where.startswith(("http://", "https://")):
        raise ImageError(f"tito does not fetch images; give the bytes or a local path, not {where[:80]!r}")
    path = Path(where.removeprefix("file://"))
    try:
        return Image(path.read_bytes())
    except OSError as exc:
        raise ImageError(f"cannot read the image file {str(path)!r}: {exc}") from exc


def _parts(content: Any) -> list[str | Image]:
    """A verl message's content as text pieces and images, in order."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, Sequence):
        raise UnsupportedContentError(
            f"a message's content must be a str or a list of parts, not {type(content).__name__}"
        )
    out: list[str | Image] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            out.append(str(part.get("text", "")))
        elif kind == "image" or (kind is None and isinstance(part, Mapping) and "image" in part):
            out.append(verl_image(part.get("image", part)))
        else:
            shown = kind if kind is not None else type(part).__name__
            raise UnsupportedContentError(f"a {shown!r} part is not supported: tito takes text and image parts")
    return out


def strands_content(message: Mapping[str, Any] | str) -> list[dict[str, Any]]:
    """A verl ``raw_prompt`` message (or its content) as Strands content blocks: ``{"text"}`` and ``{"image"}``.

    ``await agent.invoke_async(strands_content(raw_prompt[-1]))`` sends the row's user message, images
    included; tito records each image's bytes and its placeholder span.
    """
    content = message.get("content", "") if isinstance(message, Mapping) else message
    blocks: list[dict[str, Any]] = []
    for part in _parts(content):
        if isinstance(part, Image):
            blocks.append({"image": {"format": part.format, "source": {"bytes": part.data}}})
        else:
            blocks.append({"text": part})
    return blocks


def chat_messages(raw_prompt: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages of a verl ``raw_prompt`` as tito chat messages: image parts hold :class:`~tito_core.media.Image`.

    A message without images keeps a string content; one with images gets a list of text and image parts
    (:func:`~tito_core.media.image_part`), the form :class:`~tito_core.conversation.Conversation` takes.
    """
    messages: list[dict[str, Any]] = []
    for message in raw_prompt:
        parts = _parts(message.get("content", ""))
        if not any(isinstance(p, Image) for p in parts):
            content: Any = "".join(p for p in parts if isinstance(p, str))
        else:
            content = [image_part(p) if isinstance(p, Image) else {"type": "text", "text": p} for p in parts]
        messages.append({**message, "content": content})
    return messages

"""The media of a trajectory: the spans and pictures it keeps, and how a record stores the pictures in files.

:class:`TrajectoryMedia` is the read side :class:`~tito_core.trajectory.Trajectory` has: its spans in token order,
of every input kind (:class:`~tito_core.media.MediaSpan`), and each distinct picture's bytes once, by sha256 (an
image is one picture, a video clip its frames). A :class:`~tito_core.trajectory.TrajectoryRecord` holds the bytes
inline (``image_data``, base64 in JSON) so a trajectory file stands alone; the runner's writers move them into
files next to the rollout file (:func:`store_images`: ``<output>.images/<sha256>.<format>``, written atomically,
once per distinct picture) and :func:`load_images` puts them back when the records are read.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ..errors import TrajectoryError
from ..media import Image, MediaItem, MediaSpan, PromptMedia
from ..media.image import picture_format
from ..plugins.registry import input_kinds
from .record import TrajectoryRecord

__all__ = ["TrajectoryMedia", "images_dir", "load_images", "referenced", "store_images"]


class TrajectoryMedia:
    """The media views of a trajectory (the spans in ``_media``, the pictures in ``_image_data`` by sha256)."""

    __slots__ = ()
    _media: list[MediaSpan]
    _image_data: dict[str, Image]

    @property
    def media(self) -> tuple[MediaSpan, ...]:
        """The images, videos and other inputs among the tokens, in token order.

        Each span says where the item sits, its kind, hash, size and vision grid.
        """
        return tuple(self._media)

    def image(self, sha256: str) -> Image:
        """The picture with this content hash: an image, or a video's frame (each distinct one is kept once).

        Raises:
            TrajectoryError: the trajectory holds no such picture.
        """
        try:
            return self._image_data[sha256]
        except KeyError:
            raise TrajectoryError(f"the trajectory holds no image {sha256}") from None

    def prompt_media(self) -> tuple[PromptMedia, ...]:
        """Each item with its span, in token order: what a trainer rebuilds pixel inputs and positions from.

        ``span.start`` / ``span.length`` place it among the token ids, ``span.kind`` names its kind,
        ``span.grid_thw`` is its vision grid (Qwen-VL's ``image_grid_thw`` / ``video_grid_thw`` row), ``item`` the
        :class:`~tito_core.media.Image` or :class:`~tito_core.media.Video` to re-process.
        """
        kinds = input_kinds() if self._media else {}
        return tuple(PromptMedia(span=s, item=item_of(s, self._image_data, kinds)) for s in self._media)

    def image_bytes(self) -> dict[str, bytes]:
        """The encoded bytes of each distinct picture (images and video frames), by sha256."""
        return {sha: image.data for sha, image in self._image_data.items()}


def item_of(span: MediaSpan, pictures: dict[str, Image], kinds: dict[str, type[MediaItem]]) -> MediaItem:
    """The item ``span`` describes, rebuilt from the pictures by its kind's class.

    Raises:
        TrajectoryError: the span's kind is not registered.
    """
    item_type = kinds.get(span.kind)
    if item_type is None:
        raise TrajectoryError(f"the trajectory holds a {span.kind!r} input, a kind no installed plugin registers")
    return item_type.from_span(span, pictures)


def referenced(spans: Sequence[MediaSpan], data: dict[str, Image]) -> dict[str, Image]:
    """The entries of ``data`` that ``spans`` use (an image's own, a video's frames)."""
    return {sha: data[sha] for s in spans for sha in s.pictures}


def images_dir(output: str | os.PathLike[str]) -> Path:
    """Where the images of the rollout file ``output`` are stored: ``<output>.images`` beside it."""
    path = Path(output)
    return path.with_name(path.name + ".images")


def store_images(record: TrajectoryRecord, output: str | os.PathLike[str]) -> TrajectoryRecord:
    """Write ``record``'s pictures (images, video frames; branches too) next to ``output``; the record names them.

    Each distinct picture is written once, atomically (a temporary file renamed into place), before the record
    that references it is written; an image already there is not written again. Paths are relative to
    ``output``'s directory.
    """
    branches = [store_images(b, output) for b in record.branches]
    if not record.image_data and all(new is old for new, old in zip(branches, record.branches, strict=True)):
        return record  # text-only: nothing to write, nothing copied
    directory = images_dir(output)
    paths = dict(record.image_paths)
    formats = {s.sha256: s.format for s in record.media if s.kind == "image"}
    for sha, data in record.image_data.items():
        name = f"{sha}.{formats.get(sha) or picture_format(data)}"
        target = directory / name
        if not target.exists():
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{sha[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        paths[sha] = f"{directory.name}/{name}"
    return msgspec.structs.replace(record, image_data={}, image_paths=paths, branches=branches)


def load_images(record: TrajectoryRecord, output: str | os.PathLike[str]) -> TrajectoryRecord:
    """Read the image files ``record`` names (relative to ``output``'s directory) back into ``image_data``.

    Raises:
        TrajectoryError: an image file is missing or its bytes do not have the recorded hash.
    """
    branches = [load_images(b, output) for b in record.branches]
    if not record.image_paths and all(new is old for new, old in zip(branches, record.branches, strict=True)):
        return record
    root = Path(output).parent
    data = dict(record.image_data)
    for sha, rel in record.image_paths.items():
        if sha in data:
            continue
        try:
            blob = (root / rel).read_bytes()
        except OSError as exc:
            raise TrajectoryError(
                f"image {sha} of rollout {record.rollout_id} cannot be read from {rel}: {exc}"
            ) from exc
        if hashlib.sha256(blob).hexdigest() != sha:
            raise TrajectoryError(f"the image file {rel} does not hold image {sha} (its bytes changed)")
        data[sha] = blob
    return msgspec.structs.replace(record, image_data=data, image_paths={}, branches=branches)

"""The video input kind: a short clip as a list of frames (a tool's screen recording), each frame an image.

A front puts a clip into a message as ``{"type": "video", "video": Video([...frames], fps=2.0)}``. The frames
are :class:`~tito_core.media.Image` objects (or their encoded bytes), all of one size; the clip is identified by
the hash of its frames' hashes and its rate. A trajectory stores each distinct frame once, as it stores an
image, and the clip's :class:`~tito_core.media.MediaSpan` names its frames in order.

tito hands engines the decoded frames, never a re-encoded video file: a lossy encoding would make the pixels
the engine saw differ from those a trainer re-processes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .base import MediaError, VisualItem, media_part
from .image import Image

if TYPE_CHECKING:
    from .spans import MediaSpan

__all__ = ["DEFAULT_FPS", "Video", "VideoError", "video_part"]

DEFAULT_FPS = 2.0
"""The frame rate a clip has unless its front says otherwise (Qwen-VL's processors' default)."""


class VideoError(MediaError):
    """A clip tito cannot use: no frames, frames that do not decode or differ in size, a bad frame rate."""


class Video(VisualItem):
    """A clip: its frames in order (each an :class:`~tito_core.media.Image`) and its frame rate.

    Immutable; compared and hashed by content (the frames' hashes and the rate).

    Args:
        frames: The frames, as :class:`~tito_core.media.Image` or encoded bytes (PNG, JPEG, GIF, WebP).
        fps: Frames per second (the temporal positions of Qwen2.5-VL and later depend on it).

    Raises:
        VideoError: no frames, frames of different sizes, a frame that does not decode, or an fps that is not a
            positive finite number.
    """

    __slots__ = ("_fps", "_frames", "_sha256")
    kind: ClassVar[str] = "video"
    error: ClassVar[type[MediaError]] = VideoError

    def __init__(self, frames: Sequence[Image | bytes], fps: float = DEFAULT_FPS) -> None:
        if isinstance(frames, (bytes, bytearray, str)) or not isinstance(frames, Sequence) or not frames:
            raise VideoError("a video is a non-empty sequence of frames (Image objects or encoded image bytes)")
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
            raise VideoError(f"a video's fps must be a positive number, not {fps!r}")
        decoded: list[Image] = []
        for index, frame in enumerate(frames):
            try:
                decoded.append(frame if isinstance(frame, Image) else Image.of(frame))
            except MediaError as exc:
                raise VideoError(f"frame {index} of the video: {exc}") from exc
        sizes = {frame.size for frame in decoded}
        if len(sizes) > 1:
            raise VideoError(f"a video's frames must share one size; these have {sorted(sizes)}")
        self._frames = tuple(decoded)
        self._fps = float(fps)
        digest = hashlib.sha256(f"video:{self._fps!r}:".encode())
        for frame in self._frames:
            digest.update(frame.sha256.encode("ascii"))
        self._sha256 = digest.hexdigest()

    @property
    def frames(self) -> tuple[Image, ...]:
        """The frames, in order."""
        return self._frames

    @property
    def fps(self) -> float:
        """Frames per second."""
        return self._fps

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the rate and the frames' hashes, in order."""
        return self._sha256

    @property
    def format(self) -> str:
        """``frames``: a clip is stored as its frames, each in its own image format."""
        return "frames"

    @property
    def mime_type(self) -> str:
        """``video/x-frames``: decoded frames, in no container format (tito never re-encodes a clip)."""
        return "video/x-frames"

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` of its frames."""
        return self._frames[0].size

    def to_pil_frames(self) -> list[Any]:
        """The frames as RGB ``PIL.Image.Image`` objects, loaded as engines load images (what video processors take)."""
        return [frame.to_pil() for frame in self._frames]

    def pictures(self) -> tuple[Image, ...]:
        """Its frames: a clip's bytes are its frames' bytes."""
        return self._frames

    def span_fields(self) -> dict[str, Any]:
        """``frames`` as its format, its size, its frames by hash in order, and its frame rate."""
        frames = tuple(frame.sha256 for frame in self._frames)
        return {"format": "frames", "size": self.size, "frames": frames, "fps": self._fps}

    @classmethod
    def from_span(cls, span: MediaSpan, pictures: Mapping[str, Image]) -> Video:
        """The clip of ``span``, its frames from the stored pictures.

        Raises:
            VideoError: a frame is missing, or the span is not a clip's.
        """
        if not span.frames or span.fps is None:
            raise VideoError(f"the span at {span.start} is not a video's (no frames or fps)")
        missing = [sha for sha in span.frames if sha not in pictures]
        if missing:
            raise VideoError(f"no bytes are stored for frame {missing[0]} of video {span.sha256}")
        return cls([pictures[sha] for sha in span.frames], fps=span.fps)

    def __repr__(self) -> str:
        w, h = self.size
        return f"Video({len(self._frames)} frames, {w}x{h}, {self._fps:g} fps, sha256={self._sha256[:12]}…)"


def video_part(video: Video) -> dict[str, Any]:
    """The content part that puts ``video`` into a chat message (the form chat templates render)."""
    return media_part(video)

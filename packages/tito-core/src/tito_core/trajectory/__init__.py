"""The token-level record of one rollout, exactly as the engine consumed and produced it.

One job per module: :mod:`~tito_core.trajectory.live` (:class:`Trajectory`, the append-only live record with
its branches and status), :mod:`~tito_core.trajectory.record` (its frozen snapshot, :class:`TrajectoryRecord`,
and the JSON / MessagePack forms), :mod:`~tito_core.trajectory.views` (the flat views derived from it: ids, loss
mask, logprobs, versions), :mod:`~tito_core.trajectory.media` (its media: the spans of every input kind in token
order, each distinct picture's bytes once, an image's or a video frame's, and the picture files beside an
output), :mod:`~tito_core.trajectory.arrays` (the compact token and logprob arrays).
"""

from __future__ import annotations

from .live import Trajectory
from .record import Segment, SegmentKind, Status, TrajectoryRecord, Turn, Usage

__all__ = ["Segment", "SegmentKind", "Status", "Trajectory", "TrajectoryRecord", "Turn", "Usage"]

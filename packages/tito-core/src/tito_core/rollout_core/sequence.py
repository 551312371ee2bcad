"""The backend sequence of one lineage's branch, and the one place that ends one.

A backend that keeps engine state between calls (SGLang sessions, an adapter's cached ids JSON) keys it by
:attr:`~tito_core.backend.GenerateRequest.sequence`. A branch has one sequence; a fork that supersedes it, a reset,
a failed call, the rollout's bound on live sequences (:class:`~tito_core.rollout_core.lineages.Lineages`) or the
rollout being garbage-collected ends it (:meth:`~tito_core.backend.Backend.end_sequence`), here and
nowhere else.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from typing import Any

from ..backend import Backend
from ..trajectory import Trajectory

__all__ = ["SequenceTracker"]

logger = logging.getLogger("tito")


def _end(backend: Backend, box: list[Any]) -> None:
    """End the sequence held in ``box`` (``[name, trajectory]``), if any; never raises."""
    name = box[0]
    box[0] = box[1] = None
    if name is None:
        return
    try:
        backend.end_sequence(name)
    except Exception as exc:  # a hook that raises must not hide the call's own outcome
        logger.warning("%s backend: end_sequence(%r) failed: %r", backend.name, name, exc)


class SequenceTracker:
    """Names the backend sequence of a lineage's branch and ends it when the branch changes or the call fails."""

    __slots__ = ("__weakref__", "_backend", "_box")

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._box: list[Any] = [None, None]  # [name, the trajectory branch it belongs to]
        finalizer = weakref.finalize(self, _end, backend, self._box)
        finalizer.atexit = False  # at exit the backend closes what it still holds itself

    def name(self, branch: Trajectory) -> str:
        """The sequence of ``branch``; a new branch (fork, reset) ends the previous branch's sequence first."""
        box = self._box
        if box[1] is not branch:
            _end(self._backend, box)
            box[0], box[1] = f"{branch.rollout_id}/{branch.branch}/{uuid.uuid4().hex[:12]}", branch
        return str(box[0])

    @property
    def live(self) -> bool:
        """Whether a sequence is held (named and not ended)."""
        return self._box[0] is not None

    def end(self) -> None:
        """End the current sequence (its engine state may hold what was not recorded); the next call starts one."""
        _end(self._backend, self._box)

"""A gate that holds a backend's calls until a test opens it, across processes: files in a directory.

A held call (:meth:`~FileGate.enter`) writes a file ``arrived-*`` there, then waits until the file ``open`` exists.
A test counts the calls held (:meth:`~FileGate.arrived`), acts while they are known to be in flight (sends a signal,
runs out a time limit), then opens the gate (:meth:`~FileGate.open`). Files, so that the test and the backend may be
two processes: the scripted backend takes a gate's directory as its ``gate`` option, which a ``tito serve`` config
can name.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

__all__ = ["FileGate"]

_OPEN = "open"
_ARRIVED = "arrived-"


class FileGate:
    """A gate in the directory ``path`` (made if missing); a held call polls it every ``poll_s`` seconds."""

    def __init__(self, path: str | os.PathLike[str], *, poll_s: float = 0.01) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.poll_s = poll_s

    async def enter(self) -> None:
        """Count this call as arrived, then wait until the gate is open."""
        fd, _ = tempfile.mkstemp(prefix=_ARRIVED, dir=self.path)  # a name of its own: callers in several processes
        os.close(fd)
        while not self.is_open():
            await asyncio.sleep(self.poll_s)

    def arrived(self) -> int:
        """How many calls have entered the gate (held, or let through once it opened)."""
        return sum(1 for _ in self.path.glob(_ARRIVED + "*"))

    def open(self) -> None:
        """Let every call held, and every later one, through."""
        (self.path / _OPEN).touch()

    def is_open(self) -> bool:
        """Whether :meth:`open` was called."""
        return (self.path / _OPEN).exists()

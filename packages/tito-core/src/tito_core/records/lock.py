"""The output file's lock: one live writer per output, across processes (``flock`` on ``<output>.lock``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import ConfigError

try:
    import fcntl as _fcntl
except ImportError:  # Windows: no flock
    _fcntl = None  # type: ignore[assignment]

__all__ = ["OutputLock", "OutputLockedError"]


class OutputLockedError(ConfigError):
    """Another live writer (this process or another) holds the output's lock."""


class OutputLock:
    """An exclusive advisory lock on ``<output>.lock``, beside the output: one writer per output.

    ``flock`` semantics: the kernel releases it when the holding process exits, also after ``kill -9``.
    The holder's pid is written into the lock file, so that a refused writer can name it.

    Raises:
        OutputLockedError: The lock is held (the message names the output, the lock file and the holder's pid).
    """

    def __init__(self, output: str | os.PathLike[str]) -> None:
        target = Path(output)
        self.path = target.with_name(target.name + ".lock")
        self.output = target
        self._fd: int | None = None
        if _fcntl is None:  # no flock on this platform (Windows): nothing to lock with
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f"process {holder}" if holder else "another process"
                raise OutputLockedError(
                    f"{self.output} is being written by {who} (lock {self.path}): wait for it to finish, or stop it; "
                    "two runs on one output would both run every rollout"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder deleted the file as we opened it: lock the one there now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    @property
    def held(self) -> bool:
        """Whether this object holds the lock (always False where the platform has no ``flock``)."""
        return self._fd is not None

    def release(self) -> None:
        """Delete the lock file and release the lock (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            self.path.unlink()  # still locked: a writer opening it now re-checks the inode and retries
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None

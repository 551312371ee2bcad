"""Process plumbing shared by the real-server suites: ports, logs, readiness, clean shutdown."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 60) -> str:
    """The last lines of a server log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started with ``start_new_session=True``: its whole process group, SIGTERM then SIGKILL."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # children may outlive the leader for a moment
        os.killpg(process.pid, signal.SIGKILL)


def wait_until_healthy(
    url: str,
    process: subprocess.Popen[bytes],
    log: Path,
    *,
    name: str,
    timeout: float,
    warm_up: Callable[[httpx.Client], None],
) -> None:
    """Poll ``/health`` until it answers 200, then run ``warm_up``; raise with the log tail on failure."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=10.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_tail(log)}")
            try:
                if client.get("/health").status_code == 200:
                    warm_up(client)  # the first requests of a fresh server are slow
                    return
            except httpx.TransportError:
                pass
            time.sleep(1.0)
    raise RuntimeError(f"{name} was not healthy after {timeout:.0f} s:\n{log_tail(log)}")

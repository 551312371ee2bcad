"""tito_core.clean_exit: a program with daemon threads still running ends with its own status, its output flushed
and its exit handlers run; one without them, or one that never said its status, is finalized as usual."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PROGRAM = textwrap.dedent(
    """
    import atexit, sys, threading

    from tito_core import clean_exit

    clean_exit.install()
    if {thread}:
        threading.Thread(target=threading.Event().wait, name="stuck", daemon=True).start()
    atexit.register(print, "exit handler ran")  # registered after install: runs before the guard
    print("buffered output", end="")  # no newline: still in the buffer at exit
    sys.stdout.write("\\n" + ",".join(clean_exit.running_daemon_threads()) + "\\n")
    if {status} is not None:
        clean_exit.set_status({status})
    sys.exit({status} or 0)
    """
)


def _run(*, thread: bool, status: int | None) -> subprocess.CompletedProcess[str]:
    code = _PROGRAM.format(thread=thread, status=status)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_a_program_with_a_daemon_thread_left_ends_with_its_status_and_its_output() -> None:
    done = _run(thread=True, status=3)
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["buffered output", "stuck", "exit handler ran"]


def test_a_program_without_threads_or_without_a_status_is_finalized_as_usual() -> None:
    for thread, status in ((False, 3), (True, None)):
        done = _run(thread=thread, status=status)
        assert done.returncode == (status or 0)
        assert done.stdout.splitlines()[-1] == "exit handler ran"

"""A program that ends while its daemon threads still run native code ends without an abort.

Python's finalization stops a daemon thread the moment it next takes the GIL: ``pthread_exit`` unwinds its stack,
and a thread inside torch or xgrammar (C++ frames that may not be unwound) then aborts the whole process with
``terminate called without an active exception`` and exit status 134, after the program wrote everything and
chose its exit status. Such threads outlive a program's work when a blocking call was abandoned: Ctrl-C during a
model build, a tokenizer load or a slow synchronous reward (the runner does not wait for them:
:mod:`tito_core.runner.interrupts`), or a call whose awaiting task was cancelled.

:func:`install`, called first thing by a program's entry point (the ``tito`` command, ``python -m
tito_core.demo``), with :func:`set_status` once the program knows its exit status, makes such a program end with
that status: when its exit handlers have all run and daemon threads are still alive, it flushes its output and
leaves without the finalization, so the threads end with the process, as daemon threads are meant to. A program
whose threads have all ended is finalized as usual. Libraries never call it: it is for processes an entry point
owns.
"""

from __future__ import annotations

import atexit
import os
import sys

__all__ = ["install", "running_daemon_threads", "set_status"]

_status: int | None = None  # unknown: the process is finalized as usual
_installed = False


def install() -> None:
    """Guard this process's exit (once; the handler runs after every exit handler registered later)."""
    global _installed
    if not _installed:
        _installed = True
        atexit.register(_leave_if_threads_run)


def set_status(status: int) -> None:
    """The exit status the program chose (what its ``main`` returns to ``sys.exit``; 1 while it may still raise).

    Until a program says it, its process is finalized as usual, threads or not.
    """
    global _status
    _status = status


def running_daemon_threads() -> list[str]:
    """The names of this process's daemon threads that are still alive."""
    import threading

    return [t.name for t in threading.enumerate() if t.daemon and t.is_alive()]


def _leave_if_threads_run() -> None:
    if _status is None or not running_daemon_threads():
        return
    import contextlib  # here, not at the top: the entry point imports this module before anything else

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed or replaced: nothing to flush
            stream.flush()
    os._exit(_status)

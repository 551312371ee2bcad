"""The ``tito`` command: ``tito ...`` and ``python -m tito_core.cli ...`` both start at :func:`main`.

This module is the entry point and stays light (no import beyond the standard library's ``os``, ``signal`` and
``sys``). Loading the commands (argparse, asyncio, the runner, Strands, transformers) takes a few hundred
milliseconds on a quiet machine and seconds on a busy one; :func:`main` takes over Ctrl-C before it, so a Ctrl-C
during start-up exits 130 with one line, as one at any later moment does, instead of a traceback out of an import.
As the program, it also guards the process's end (:mod:`tito_core.clean_exit`): threads abandoned in native code
cannot turn its exit status into an abort. The commands are in :mod:`tito_core.cli.commands`.
"""

from __future__ import annotations

import os
import signal
import sys

from .. import clean_exit

TYPE_CHECKING = False  # not typing's, which is not cheap to import
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]

_COMMANDS = frozenset({"rollout", "export", "inspect", "audit", "serve", "view", "demo"})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tito`` command line; returns the exit status.

    Ctrl-C at any moment (start-up, a model call, a write) exits 130 with one line: a rollout's finished records
    are on disk and a rerun resumes. Called without ``argv`` (the ``tito`` script, ``python -m tito_core.cli``), it
    is the program, and its status is the process's exit status whatever threads are left
    (:mod:`tito_core.clean_exit`).
    """
    if argv is None:
        clean_exit.install()
        clean_exit.set_status(1)  # what Python exits with if what follows raises
    try:
        installed = _exit_on_ctrl_c(argv)
        try:
            from .commands import run
        finally:
            if installed:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        status = run(argv)
    except KeyboardInterrupt:  # between the start-up handler's end and the commands' own handling
        print(_starting_line(argv), file=sys.stderr, flush=True)
        status = 130
    clean_exit.set_status(status)
    return status


def _exit_on_ctrl_c(argv: Sequence[str] | None) -> bool:
    """Make Ctrl-C print one line and exit 130 at once while the commands load; whether it was installed.

    Nothing is written yet, so there is nothing to clean up. Only where SIGINT has Python's own handler, on the main
    thread: a program that set its own keeps it, and a job started in the background (SIGINT ignored) stays deaf to
    Ctrl-C, as its parent asked.
    """
    line = (_starting_line(argv) + "\n").encode()

    def exit_now(signum: int, frame: object) -> None:
        os.write(2, line)
        os._exit(130)

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    try:
        signal.signal(signal.SIGINT, exit_now)
    except ValueError:  # not the main thread: its caller owns the signals
        return False
    return True


def _starting_line(argv: Sequence[str] | None) -> str:
    """The one line of a Ctrl-C before the command has started any work."""
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in _COMMANDS:
        return "tito: interrupted"
    if command == "rollout":
        return "tito rollout: interrupted while starting; this run wrote nothing"
    return f"tito {command}: interrupted while starting"

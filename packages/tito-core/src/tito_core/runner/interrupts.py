"""Blocking runs that Ctrl-C stops at once: :func:`run_interruptible`.

``asyncio.run`` answers SIGINT by cancelling its coroutine, then, before it returns, joins its default executor:
every ``asyncio.to_thread`` still running. A thread cannot be cancelled, so a Ctrl-C that lands while the run
loads its tokenizer (``import transformers`` and a 150k-token vocabulary: 1-2 s on a quiet machine, a minute
on a starved one), runs a ``prepare`` hook that builds a model, or runs a slow synchronous reward waits for that
work to end, although nobody will read its result. That is how a run outlived Ctrl-C by a minute.

:func:`run_interruptible` runs the coroutine on a loop whose default executor starts daemon threads: the
coroutine's own clean-up still runs in full (finished records written, the output closed, servers' requests
aborted), and the process then ends without waiting for abandoned threads. Files such threads may be writing
are written atomically by their owners (the model cache: a staging folder renamed into place).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["DaemonExecutor", "run_interruptible"]

T = TypeVar("T")


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """Each call on a daemon thread of its own, at most ``max_workers`` running at once.

    ``shutdown`` joins nothing: an abandoned call (its awaiting task was cancelled) cannot hold up the exit. A
    ``ThreadPoolExecutor`` only by type (``loop.set_default_executor`` takes no other): its pool, whose worker
    threads the interpreter joins at exit, is never started.
    """

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__(max_workers)
        self._slots = threading.BoundedSemaphore(self._max_workers)
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` on a new daemon thread once a slot is free."""
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def work() -> None:
            with self._slots:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the awaiting task, as ThreadPoolExecutor does
                    future.set_exception(exc)
                else:
                    future.set_result(result)

        threading.Thread(target=work, name="tito-blocking", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no new calls; the running ones are not waited for (daemon threads end with the process)."""
        self._closed = True


def run_interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, except that a Ctrl-C does not wait for threads the coroutine started.

    SIGINT cancels ``coro`` (its ``finally`` blocks run) and raises ``KeyboardInterrupt`` once it has ended.
    """
    with asyncio.Runner() as runner:
        runner.get_loop().set_default_executor(DaemonExecutor())
        return runner.run(coro)

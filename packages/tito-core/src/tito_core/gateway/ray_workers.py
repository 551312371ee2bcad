"""``tito serve --workers N --ray ADDRESS``: the gateway's workers as Ray actors, anywhere in a Ray cluster.

The same supervisor as local workers (:class:`~tito_core.gateway.workers.WorkerPool`: the door, the one writer of
the output, the journals), with each worker a Ray actor instead of a child process: Ray places the actors, the
supervisor hands out their addresses. Nothing else is Ray's: an actor runs the same worker code
(:func:`~tito_core.gateway.worker.serve_worker`) on its own event loop and serves on its own port.

An actor reaches the supervisor over one TCP connection it opens to a listener of the supervisor's, authenticated
with a key the supervisor gives it through Ray (``multiprocessing.connection``'s HMAC challenge: a neighbour
without the key is refused), and speaks the same requests as a local worker's pipe. The actor's end of that
connection closing (the actor died, or its node) is how the supervisor learns it is lost; it then writes the
actor's journal's rollouts ``failed``, "gateway worker lost". The journal is a file the actor writes in the
output's journal folder: on a cluster of several machines that folder must be on storage every node and the
supervisor share, or a lost actor's answered calls cannot be read back (the records of its finished rollouts are
in the output either way). Stopping: the actor's ``stop`` (once: drain; again: stop waiting for its calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import threading
from collections.abc import Iterator
from multiprocessing.connection import Client, Listener
from typing import Any

import msgspec

from .._optional import ray as import_ray
from ..config import TitoConfig
from ..errors import ConfigError
from .channel import Channel
from .worker import Stopper, WorkerSettings, serve_worker
from .workers import WorkerHandle, WorkerPool

__all__ = ["GatewayActor", "RayWorkerPool"]

logger = logging.getLogger("tito")


class GatewayActor:
    """A gateway worker as a Ray actor (wrapped with ``ray.remote`` when started): ``serve`` until ``stop``."""

    def __init__(self) -> None:
        self.stopper = Stopper()

    async def serve(self, address: Any, authkey: bytes, config: TitoConfig, settings: WorkerSettings) -> None:
        """Connect to the supervisor and serve until stopped (or the supervisor is gone)."""
        conn = await asyncio.to_thread(Client, address, authkey=authkey)
        try:
            await serve_worker(Channel(conn), config, settings, self.stopper)
        finally:
            conn.close()

    async def stop(self) -> None:
        """Drain (a second call: stop waiting for the calls in flight)."""
        self.stopper.stop()


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Put back the SIGINT and SIGTERM handlers the process had, once the block (``ray.init``) replaced them.

    A Ray driver's ``ray.init`` installs its own SIGTERM handler, which exits the process at once: ``tito serve
    --workers N --ray`` would then end on a SIGTERM without draining its workers or writing their records.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread has handlers to keep
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


async def _outcome(ref: Any) -> str:
    """How the actor's ``serve`` ended (it only ends before connecting when it fails)."""
    try:
        await ref
    except Exception as exc:  # the actor's error, whatever its type
        return f"{type(exc).__name__}: {exc}"
    return "it returned"


class RayWorkerPool(WorkerPool):
    """:class:`~tito_core.gateway.workers.WorkerPool` with Ray actors for workers.

    Args:
        address: The Ray cluster (``ray.init(address=...)``); None: the one this process already joined, or a
            local one.
        num_cpus: The CPUs Ray reserves for each actor.
        options: :class:`~tito_core.gateway.workers.WorkerPool`'s.
    """

    def __init__(
        self, config: TitoConfig, workers: int, *, address: str | None = None, num_cpus: float = 1.0, **options: Any
    ) -> None:
        super().__init__(config, workers, **options)
        self.address = address
        self.num_cpus = num_cpus
        self._listener: Listener | None = None
        self._authkey = secrets.token_bytes(32)
        self._refs: list[Any] = []

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Join the cluster, listen for the actors, then start as :meth:`WorkerPool.start` does."""
        ray = import_ray()
        if not ray.is_initialized():
            with _signal_handlers_kept():
                ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False)
        self._listener = Listener((host if host not in ("", "0.0.0.0", "::") else "127.0.0.1", 0),
                                  authkey=self._authkey)  # fmt: skip
        return await super().start(host, port)

    async def _launch(self, index: int) -> WorkerHandle:
        """Start actor ``index`` and take its connection (the actors start one after the other)."""
        ray = import_ray()
        assert self._listener is not None
        journal = self.journal_for(index)
        settings = msgspec.structs.replace(self.settings, journal=str(journal) if journal else None)
        actor = ray.remote(GatewayActor).options(num_cpus=self.num_cpus).remote()
        serving = actor.serve.remote(self._listener.address, self._authkey, self.config, settings)
        self._refs.append(serving)
        accepting = asyncio.ensure_future(asyncio.to_thread(self._listener.accept))
        ended = asyncio.ensure_future(_outcome(serving))
        await asyncio.wait({accepting, ended}, return_when=asyncio.FIRST_COMPLETED)
        if not accepting.done():
            ended_with = ended.result()
            raise ConfigError(f"gateway actor {index} ended before it connected: {ended_with}")
        ended.cancel()
        return self.watch(WorkerHandle(index, accepting.result(), journal, handle=actor))

    def connection_closed(self, worker: WorkerHandle) -> None:
        """The actor's connection closed: it stopped, or it died (its node too)."""
        self.ended(worker, "lost its connection (the actor or its node died)" if not self.closing else "stopped")

    def stop_worker(self, worker: WorkerHandle) -> None:
        """Ask the actor to drain (a second time: to stop waiting)."""
        with contextlib.suppress(Exception):
            worker.handle.stop.remote()

    async def close(self) -> None:
        """Drain the actors, write what is left, then end them and stop listening."""
        try:
            await super().close()
        finally:
            ray = import_ray()
            for worker in self.workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker.handle)
            if self._listener is not None:
                self._listener.close()

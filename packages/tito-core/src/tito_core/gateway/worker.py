"""One gateway worker process of ``tito serve --workers N``: a whole :class:`~tito_core.gateway.Gateway` on a port.

Started by the supervisor (:mod:`~tito_core.gateway.workers`) with the ``spawn`` method. It serves its rollouts from
opening to end on its own port, with the gateway's checks (Host, Origin, the key, a token per rollout), hands its
records to the supervisor over the inherited pipe (:mod:`~tito_core.gateway.channel`) and journals what it answers
(:mod:`~tito_core.gateway.journal`). SIGTERM drains it as it drains ``tito serve``: a second SIGTERM stops the wait.
SIGINT is left to the supervisor (a terminal's Ctrl-C reaches the whole process group; the supervisor passes it on
once). The worker ends by itself when the supervisor's end of the pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec

from ..config import TitoConfig
from .channel import Channel, Ready, RemoteOutput
from .journal import Journal
from .service import Gateway

__all__ = ["Stopper", "WorkerSettings", "serve_worker", "worker_main"]

logger = logging.getLogger("tito")


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What every worker is started with (the same for each, but ``journal``)."""

    host: str = "127.0.0.1"
    api_key: str | None = None
    viewer_key: str = ""
    idle_timeout: float = 600.0
    drain_s: float = 30.0
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()
    journal: str | None = None
    """The journal file; None without an output (nothing is recorded, nothing to recover)."""
    journal_fsync: bool = False


def worker_main(conn: Connection, config: TitoConfig, settings: WorkerSettings) -> None:
    """The worker process's entry point: serve until SIGTERM or the supervisor's end, then drain and return."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="tito worker: %(message)s")

    async def main() -> None:
        stopper = Stopper()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopper.stop)
        await serve_worker(Channel(conn), config, settings, stopper)

    asyncio.run(main())


class Stopper:
    """How a worker is told to stop: once to drain, twice to stop waiting for its calls."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.gateway: Gateway | None = None

    def stop(self) -> None:
        """Stop taking work and drain; a second time, cancel the calls still running."""
        if self.event.is_set() and self.gateway is not None:
            self.gateway.stop_draining()
        self.event.set()


async def serve_worker(channel: Channel, config: TitoConfig, settings: WorkerSettings, stopper: Stopper) -> None:
    """Serve one worker's gateway until ``stopper`` stops it or the supervisor's end of ``channel`` closes."""
    gateway = Gateway(
        config,
        api_key=settings.api_key,
        idle_timeout=settings.idle_timeout,
        allow_hosts=settings.allow_hosts,
        allow_origins=settings.allow_origins,
    )
    stopper.gateway = gateway
    if settings.viewer_key:
        gateway.access.viewer_key = settings.viewer_key
    journal = Journal(Path(settings.journal), fsync=settings.journal_fsync) if settings.journal else None
    gateway.journal = journal
    gateway.writer = RemoteOutput(channel, journal) if journal is not None else gateway.writer
    loop = asyncio.get_running_loop()

    def on_supervisor_gone() -> None:  # the connection is idle between requests: readable now means closed
        loop.remove_reader(channel.conn.fileno())
        gateway.stop_draining()
        stopper.event.set()

    try:
        base = await gateway.start(settings.host, 0)
        channel.request(Ready(base, os.getpid()))
        loop.add_reader(channel.conn.fileno(), on_supervisor_gone)
        os.set_blocking(channel.conn.fileno(), True)  # uvloop (a Ray actor's loop) made it non-blocking: requests wait
        await stopper.event.wait()
    finally:
        with contextlib.suppress(OSError, ValueError):
            loop.remove_reader(channel.conn.fileno())
        await gateway.close(drain_s=settings.drain_s)
